"""Real workers under real faults: dropped and locked databases, lost jobs, SIGTERM, kill -9.

Every fault is the real thing: ``pg_terminate_backend`` on the worker's PostgreSQL connections,
another SQLite connection holding ``BEGIN EXCLUSIVE`` past the busy timeout, the queue's jobs
deleted from Redis, signals sent to the worker process. What must hold: a run ends as its own
training would have it (``succeeded``), every step stored exactly once, no fault counted against
the run that is not its own, and a run that does kill its workers fails after
``max_attempts``.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import Database
from backend.models import Metric
from conspo import metrics as M
from tests.api.conftest import (
    _pg_admin,
    lose_queued_jobs,
    tiny_config,
    wait_for,
)
from tests.api.test_api_worker import assert_steps_once, finished, mode_api, run_state, submit

pytestmark = [pytest.mark.slow, pytest.mark.services]

# Long enough that the faults below (a few seconds each) never make a live worker look dead.
PATIENT_HEARTBEAT = {"CONSPO_HEARTBEAT_TIMEOUT_S": "30"}


def steps_reached(api: Any, run_id: int, step: int) -> None:
    wait_for(lambda: run_state(api, run_id)["step"] >= step, 300, f"step {step}")


def terminate_connections(database_url: str, seconds: float) -> int:
    """Kill every backend of the database, again and again for ``seconds``; how many died."""
    name = database_url.rsplit("/", 1)[1]
    killed = 0
    with _pg_admin() as admin:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
            killed += row[0] if row else 0
            time.sleep(0.01)
    return killed


def hold_write_lock(sqlite_path: Path, seconds: float) -> None:
    """Another writer holds the database (``BEGIN EXCLUSIVE``) for ``seconds``."""
    conn = sqlite3.connect(sqlite_path, timeout=120, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def write_seqs(api: Any, run_id: int, up_to_step: int) -> dict[int, int]:
    """Step → the write sequence that last stored its loss (it changes when a step is rewritten)."""
    db = Database(api.settings)
    with db.session() as s:
        rows = s.execute(
            select(Metric.step, Metric.seq).where(
                Metric.run_id == run_id, Metric.key == M.LOSS, Metric.step <= up_to_step
            )
        ).all()
    db.dispose()
    return dict(rows)


# --------------------------------------------------------------------------------------------
# Class 2: transient database errors are retried, never the run's failure
# --------------------------------------------------------------------------------------------


def test_dropped_database_connections_mid_run_are_retried(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    api = mode_api("cluster", tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.env.update(PATIENT_HEARTBEAT)
    wp.start()
    n = 24
    run_id = submit(api, tiny_config(n, checkpoint_every=4))
    for step in (2, 8):
        steps_reached(api, run_id, step)
        assert terminate_connections(api.settings.database_url, seconds=3) > 0
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 1 and run["worker_deaths"] == 0  # retried, not resumed
    assert_steps_once(api, run_id, n)
    assert "retrying" in wp.tail(2000)  # the worker did meet the dropped connections
    api.client.close()


def test_a_locked_sqlite_database_mid_run_is_retried(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.env.update({**PATIENT_HEARTBEAT, "CONSPO_SQLITE_BUSY_TIMEOUT_S": "0.5"})
    wp.start()
    n = 16
    run_id = submit(api, tiny_config(n, checkpoint_every=4))
    steps_reached(api, run_id, 2)
    hold_write_lock(tmp_path / "conspo.db", seconds=5)  # ten busy timeouts
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 1 and run["worker_deaths"] == 0
    assert_steps_once(api, run_id, n)
    assert "database is locked; retrying" in wp.tail(2000)
    api.client.close()


def test_a_database_down_past_the_retry_limit_hands_the_run_back(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    """The attempt stops without failing the run; once the database answers, the run goes
    back to the queue and resumes from its checkpoint, no worker death counted."""
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.env.update(
        {**PATIENT_HEARTBEAT, "CONSPO_SQLITE_BUSY_TIMEOUT_S": "0.5", "CONSPO_DB_RETRY_LIMIT_S": "2"}
    )
    wp.start()
    n = 16
    run_id = submit(api, tiny_config(n, checkpoint_every=3))
    steps_reached(api, run_id, 4)
    hold_write_lock(tmp_path / "conspo.db", seconds=8)
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 2 and run["worker_deaths"] == 0
    assert_steps_once(api, run_id, n)
    assert "handing the run back" in wp.tail(2000)
    api.client.close()


# --------------------------------------------------------------------------------------------
# Class 3: jobs the broker lost are sent again
# --------------------------------------------------------------------------------------------


def test_a_run_whose_job_the_broker_lost_is_sent_again(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    """Cluster mode: Redis restarted without persistence after the run was sent."""
    api = mode_api("cluster", tmp_path, request)
    run_id = submit(api, tiny_config(3))
    lose_queued_jobs(api.settings)
    wp = workers(api.settings, model_store)
    wp.env["CONSPO_UNCLAIMED_RESEND_S"] = "2"
    wp.start()
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 1
    assert_steps_once(api, run_id, 3)
    assert "missing from the queue; re-sent" in wp.tail(2000)
    api.client.close()


# --------------------------------------------------------------------------------------------
# Class 6: SIGTERM stops the run at a step boundary and hands it back
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "pool"), [("embedded", "solo"), ("cluster", "prefork")])
def test_sigterm_hands_the_run_back_and_a_new_worker_resumes_it(
    mode: str, pool: str, tmp_path: Path, request: pytest.FixtureRequest, workers, model_store
) -> None:
    api = mode_api(mode, tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.env["CONSPO_WORKER_POOL"] = pool
    first = wp.start()
    # Enough steps that the signal (sent once step 3 is seen; the run stops at its next step
    # boundary, step 5 or so on a loaded box) lands long before the end even where a tiny step
    # takes a few milliseconds; every step resumed is trained again in full, so more only costs
    # CI time (300 steps took ~35 s per case on a loaded box).
    n = 200
    run_id = submit(api, tiny_config(n))  # no periodic checkpoint: the one at the stop counts
    steps_reached(api, run_id, 3)
    assert len(api.get("/api/health").json()["workers"]) == 1
    exit_s = sigterm_and_wait(first, wp)
    stopped = run_state(api, run_id)
    assert stopped["status"] == "queued", stopped
    assert (stopped["attempt"], stopped["worker_deaths"]) == (1, 0)
    assert 3 <= stopped["step"] < n
    checkpoints = api.settings.run_dir(run_id) / "checkpoints"
    assert (checkpoints / f"step_{stopped['step']:06d}").is_dir()
    assert api.get("/api/health").json()["workers"] == []  # it said goodbye
    before = write_seqs(api, run_id, stopped["step"])
    wp.start()
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert (run["attempt"], run["worker_deaths"]) == (2, 0)
    assert_steps_once(api, run_id, n)
    assert write_seqs(api, run_id, stopped["step"]) == before  # resumed, not started over
    print(f"SIGTERM to exit: {exit_s:.1f} s ({mode}, {pool})")
    api.client.close()


def sigterm_and_wait(proc: subprocess.Popen[bytes], wp: Any) -> float:
    """SIGTERM to the worker's main process only (what ``docker stop`` does); seconds to exit."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit within 60 s of SIGTERM\n{wp.tail()}")
    assert proc.returncode == 0, wp.tail()
    return time.monotonic() - t0


# --------------------------------------------------------------------------------------------
# Class 7: a run that kills its workers fails after max_attempts
# --------------------------------------------------------------------------------------------


def test_a_run_that_kills_its_workers_fails_after_max_attempts(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    """kill -9 stands for the out-of-memory killer; the default CONSPO_MAX_ATTEMPTS is 3."""
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    run_id = submit(api, tiny_config(400))
    for attempt in (1, 2, 3):
        proc = wp.start()
        wait_for(
            lambda a=attempt: (r := run_state(api, run_id))["attempt"] == a and r["step"] >= 1,
            300,
            f"attempt {attempt} training",
        )
        deaths = run_state(api, run_id)["worker_deaths"]
        assert deaths == attempt - 1  # each death is visible in the run while it goes on
        wp.kill9(proc)
    wp.start()  # its reaper finds the third death
    run = finished(api, run_id, 120, wp)
    assert run["status"] == "failed" and run["attempt"] == 3 and run["worker_deaths"] == 3
    assert run["error"].startswith("worker died 3 times (out of memory?)"), run["error"]
    assert "stopped responding at step" in run["last_worker_death"]
    api.client.close()
