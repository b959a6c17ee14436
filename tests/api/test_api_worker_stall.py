"""A run whose user code stalls its worker (issue 27): a backtracking ``format`` pattern, and a
training process that holds the interpreter so long that its own heartbeat thread cannot run.

* Through a real Celery worker: the pattern's reward fails within its timeout (the rollout
  scores 0 on it, the worker logs the count), the run keeps stepping and beating, and a cancel
  is acted on within 10 s.
* ``worker.watchdog`` against a real process wedged in Python's ``re`` (the GIL held, no thread
  of it runs): an unanswered cancel is recorded and the process killed; a stalled heartbeat gets
  the process killed and the run failed at the attempt cap saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from backend.config import Settings
from backend.db import Database
from backend.models import Run, utcnow
from backend.runs import lifecycle
from tests.api.conftest import Api, tiny_config, wait_for
from tests.api.test_api_worker import finished, mode_api, run_state, submit
from worker.watchdog import stall_limit, watch

pytestmark = pytest.mark.services

# Exponential even for the ``regex`` package (the "(.+)+#" it matches at once).
BACKTRACKING = r"(?:.|..)+\Z(?<=#)"
# Python's own ``re`` on the pattern: hours of C code holding the GIL.
WEDGED = "import re; re.fullmatch(r'(.+)+#', 'a' * 64)"


@pytest.mark.slow
def test_a_backtracking_pattern_fails_its_reward_and_the_run_still_cancels_within_10_s(
    tmp_path: Path, request: pytest.FixtureRequest, workers: Any, model_store: Path
) -> None:
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.start()
    config = tiny_config(500, rewards=[{"name": "format", "params": {"pattern": BACKTRACKING}}])
    config["sampling"] = {**config["sampling"], "max_new_tokens": 48}
    run_id = submit(api, config)
    try:
        wait_for(lambda: run_state(api, run_id)["step"] >= 3, 300, "three steps")
    except AssertionError:
        pytest.fail(f"run {run_id}: {run_state(api, run_id)}\n{wp.tail()}")
    wait_for(lambda: "reward format failed on" in wp.tail(400), 60, "the failed reward's log")
    health = api.get("/api/health").json()
    assert len(health["workers"]) == 1 and health["stale_runs"] == [], health
    asked = time.monotonic()
    assert api.post(f"/api/runs/{run_id}/cancel").status_code == 200
    run = finished(api, run_id, 60, wp)
    took = time.monotonic() - asked
    assert run["status"] == "cancelled", run
    assert took < 10, f"cancel took {took:.1f} s"
    print(f"cancel honoured in {took:.1f} s at step {run['step']}")
    api.client.close()


def claimed(api: Api) -> Run:
    """A run of the session's database, claimed (running, attempt 1) as a worker would."""
    run_id = api.post("/api/runs", json={"config": tiny_config(2)}).json()["runs"][0]["id"]
    db = Database(api.settings)
    with db.session() as session:
        run = lifecycle.claim(
            session, run_id, host="gpu-1", stale_before=utcnow() - timedelta(hours=1),
            max_attempts=3,
        )  # fmt: skip
    db.dispose()
    assert run is not None
    return run


def watched(settings: Settings, run: Run, proc: subprocess.Popen[bytes]) -> tuple[str, float]:
    started = time.monotonic()
    outcome = watch(settings, run.id, run.attempt, proc.pid)
    took = time.monotonic() - started
    proc.wait(timeout=10)
    return outcome, took


@pytest.fixture
def wedged() -> Any:
    made: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        made.append(subprocess.Popen([sys.executable, "-c", WEDGED]))
        return made[-1]

    yield start
    for proc in made:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_watchdog_records_an_unanswered_cancel_and_kills_the_wedged_process(
    api: Api, wedged: Any
) -> None:
    run = claimed(api)
    proc = wedged()
    assert api.post(f"/api/runs/{run.id}/cancel").json()["cancel_requested"] is True
    settings = api.settings.model_copy(update={"heartbeat_interval_s": 0.2, "cancel_grace_s": 2})
    outcome, took = watched(settings, run, proc)
    assert outcome == "killed: cancelled" and proc.returncode == -9
    assert took < 10
    assert run_state(api, run.id)["status"] == "cancelled"


def test_the_watchdog_kills_a_process_whose_heartbeat_stalled_and_the_cap_says_why(
    api: Api, wedged: Any
) -> None:
    run = claimed(api)
    proc = wedged()
    settings = api.settings.model_copy(
        update={
            "heartbeat_interval_s": 0.2,
            "heartbeat_timeout_s": 1.5,
            "cancel_grace_s": 1.0,
            "max_attempts": 1,
        }
    )
    outcome, took = watched(settings, run, proc)
    assert outcome == "killed: stalled" and proc.returncode == -9
    assert took < 10
    state = run_state(api, run.id)  # the attempt cap (1 here) reached, and why
    assert state["status"] == "failed" and state["worker_deaths"] == 1
    assert state["error"].startswith("worker died 1 times; the last time: worker gpu-1 was")
    assert "no heartbeat for over 2.5 s while its process lived" in state["error"]


def test_the_watchdog_kills_a_process_still_running_an_attempt_it_lost(
    api: Api, wedged: Any
) -> None:
    """A reaper re-queued the run and another attempt took it: the trainer would stop at its
    next step boundary, but this one never reaches one."""
    from sqlalchemy import update

    run = claimed(api)
    proc = wedged()
    db = Database(api.settings)
    with db.session() as session:
        session.execute(update(Run).where(Run.id == run.id).values(attempt=run.attempt + 1))
        session.commit()
    db.dispose()
    settings = api.settings.model_copy(update={"heartbeat_interval_s": 0.2, "cancel_grace_s": 1})
    outcome, took = watched(settings, run, proc)
    assert outcome == "killed: lost" and proc.returncode == -9
    assert took < 10
    assert run_state(api, run.id)["status"] == "running"  # the newer attempt's, untouched


# A process that pulses on the fd it is given and otherwise sleeps (its database heartbeat
# never comes: its writes are "held up"), and one that pulses, then wedges in ``re``.
PULSING = "import os, sys, time\nwhile True:\n    os.write(int(sys.argv[1]), b'.'); time.sleep(0.2)"
PULSES_THEN_WEDGES = (
    "import os, re, sys, threading, time\n"
    "def pulse():\n"
    "    while True:\n"
    "        os.write(int(sys.argv[1]), b'.'); time.sleep(0.2)\n"
    "threading.Thread(target=pulse, daemon=True).start()\n"
    "time.sleep(1.0)\n"
    "re.fullmatch(r'(.+)+#', 'a' * 64)\n"
)


def pulsing(code: str) -> tuple[subprocess.Popen[bytes], int]:
    """The process and the read end of its pulse pipe."""
    readable, writable = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, str(writable)], pass_fds=(writable,))
    os.close(writable)
    return proc, readable


def heartbeat_age(api: Api, run_id: int) -> float:
    db = Database(api.settings)
    with db.session() as session:
        beat = session.get(Run, run_id).heartbeat_at  # type: ignore[union-attr]
    db.dispose()
    return (utcnow() - beat).total_seconds()


STALL = {
    "heartbeat_interval_s": 0.2,
    "heartbeat_timeout_s": 1.5,
    "cancel_grace_s": 1.0,
    "max_attempts": 1,
}


def test_a_process_that_pulses_is_alive_however_late_its_heartbeat(api: Api) -> None:
    """Issue 37: a live SmolLM2 worker was killed as stalled while its database writes waited.
    Its pulse (a pipe, no database in the way) keeps it alive and the watchdog beats for it."""
    run = claimed(api)
    proc, readable = pulsing(PULSING)
    settings = api.settings.model_copy(update=STALL)
    outcome: list[str] = []
    watcher = threading.Thread(
        target=lambda: outcome.append(watch(settings, run.id, run.attempt, proc.pid, readable))
    )
    try:
        watcher.start()
        time.sleep(4 * stall_limit(settings))  # four times the limit, and its heartbeat never
        assert proc.poll() is None and not outcome  # came from the process itself
        assert heartbeat_age(api, run.id) < 2.0  # the watchdog's beats, for the reapers
        assert run_state(api, run.id)["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
        watcher.join(timeout=30)
        os.close(readable)
    assert outcome == ["process gone"]


def test_a_process_whose_pulse_stops_is_killed_as_stalled(api: Api) -> None:
    """The pulse is a thread of the process: wedged in C code holding the interpreter, it goes
    silent too, and the watchdog kills the process as before."""
    run = claimed(api)
    proc, readable = pulsing(PULSES_THEN_WEDGES)
    settings = api.settings.model_copy(update=STALL)
    try:
        started = time.monotonic()
        outcome = watch(settings, run.id, run.attempt, proc.pid, readable)
        took = time.monotonic() - started
        proc.wait(timeout=10)
    finally:
        os.close(readable)
    assert outcome == "killed: stalled" and proc.returncode == -9
    assert took < 15
    error = run_state(api, run.id)["error"]
    assert "no heartbeat for over 2.5 s" in error and "no pulse for" in error
