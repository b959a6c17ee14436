"""Every transition of backend.runs.lifecycle, on SQLite and PostgreSQL, with the real brokers.

Each test drives one transition from every state it may start in and checks what it refuses;
messages are read back from the broker the workers consume (Redis, or kombu's SQLAlchemy
transport) rather than from a stand-in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.db import Database
from backend.models import Metric, Run, RunStatus, User, utcnow
from backend.runs import lifecycle
from backend.runs.lifecycle import Beat
from backend.runs.queue import TASK_NAME, JobQueue, make_celery
from backend.security import get_or_create_user
from backend.storage.writes import StepPoints, write_points
from conspo.config import RunConfig
from tests.api.conftest import ROOT, lose_queued_jobs

CONFIG = RunConfig.model_validate({"algorithm": "grpo", "steps": 3})
LONG_AGO = timedelta(hours=1)
MAX = {"max_attempts": 3}


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


@pytest.fixture
def jobs(settings: Settings) -> JobQueue:
    # A queue of this test's own, so the messages read back are this test's.
    return JobQueue(make_celery(settings), f"{settings.queue}-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def session(db: Database) -> Iterator[Session]:
    with db.session() as s:
        yield s


@pytest.fixture
def owner(session: Session) -> User:
    user = get_or_create_user(session, f"lc-{uuid.uuid4().hex[:8]}")
    session.commit()
    return user


def published(jobs: JobQueue, timeout: float = 5.0) -> list[int]:
    """Run ids of the training jobs waiting in ``jobs``' queue (consumed)."""
    ids: list[int] = []
    with jobs.celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(jobs.queue)
        try:
            while True:
                message = queue.get(timeout=timeout if not ids else 0.5)
                assert message.headers["task"] == TASK_NAME
                ids.extend(message.payload[0])
                message.ack()
        except queue.Empty:
            pass
        finally:
            queue.close()
    return ids


def state(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id, populate_existing=True)
    assert run is not None
    return run


def queued(session: Session, jobs: JobQueue, owner: User, **kw: Any) -> Run:
    _, runs = lifecycle.queue_runs(session, jobs, owner, CONFIG, **kw)
    return runs[0]


def running(session: Session, jobs: JobQueue, owner: User) -> Run:
    run = queued(session, jobs, owner)
    claimed = lifecycle.claim(session, run.id, host="h", stale_before=utcnow() - LONG_AGO, **MAX)
    assert claimed is not None
    return claimed


def make_stale(session: Session, run_id: int) -> None:
    session.get(Run, run_id).heartbeat_at = utcnow() - 2 * LONG_AGO  # type: ignore[union-attr]
    session.commit()


# --------------------------------------------------------------------------------------------


def test_queue_runs_commits_one_queued_run_per_seed_and_sends_each(session, jobs, owner) -> None:
    group_id, runs = lifecycle.queue_runs(
        session, jobs, owner, CONFIG, seeds=[3, 4, 3], tags=["t", "t"], name="lc"
    )
    assert group_id is not None and [r.seed for r in runs] == [3, 4]  # seeds deduplicated
    assert [r.name for r in runs] == ["lc-s3", "lc-s4"] and runs[0].tags == ["t"]
    for run in runs:
        assert run.status == RunStatus.queued and run.enqueued_at is not None
        assert run.config["seed"] == run.seed and run.group_id == group_id
    assert sorted(published(jobs)) == sorted(r.id for r in runs)
    one = queued(session, jobs, owner)
    # "-2", "-3", ... when an earlier test of this session's database took the name
    assert one.group_id is None and re.fullmatch(r"grpo-arith-s0(-\d+)?", one.name)


def test_queue_runs_leaves_nothing_when_the_broker_refuses(settings, session, owner) -> None:
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    before = session.scalar(select(func.count()).select_from(Run))
    with pytest.raises(lifecycle.QueueUnavailable, match="nothing was queued"):
        lifecycle.queue_runs(session, JobQueue.from_settings(down), owner, CONFIG, seeds=[0, 1])
    assert session.scalar(select(func.count()).select_from(Run)) == before


def test_send_hands_over_only_queued_runs_and_unsent_finds_the_rest(session, jobs, owner) -> None:
    run = queued(session, jobs, owner)
    published(jobs)
    # A process that died between commit and send leaves enqueued_at NULL.
    state(session, run.id).enqueued_at = None
    session.commit()
    assert run.id not in lifecycle.unsent(session, utcnow() - LONG_AGO)  # still in its grace
    assert run.id in lifecycle.unsent(session, utcnow() + timedelta(seconds=1))
    assert lifecycle.send(session, jobs, run.id) is True
    assert published(jobs) == [run.id] and state(session, run.id).enqueued_at is not None
    assert run.id not in lifecycle.unsent(session, utcnow() + timedelta(seconds=1))
    lifecycle.request_cancel(session, run)
    assert lifecycle.send(session, jobs, run.id) is False  # cancelled: nothing is sent
    assert published(jobs, timeout=1) == []


def test_claim_takes_a_queued_run_once_and_a_stale_one_again(session, jobs, owner) -> None:
    run = queued(session, jobs, owner)
    fresh = utcnow() - LONG_AGO
    first = lifecycle.claim(session, run.id, host="a", stale_before=fresh, **MAX)
    assert first is not None and first.status == RunStatus.running and first.attempt == 1
    assert first.worker_host == "a" and first.started_at is not None
    assert lifecycle.claim(session, run.id, host="b", stale_before=fresh, **MAX) is None  # taken
    started = first.started_at
    make_stale(session, run.id)
    second = lifecycle.claim(session, run.id, host="b", stale_before=fresh, **MAX)
    assert second is not None and second.attempt == 2 and second.worker_host == "b"
    assert second.started_at == started  # the run started once
    assert second.worker_deaths == 1 and "worker a stopped responding" in second.last_worker_death
    no_run = 2**31 - 1
    assert lifecycle.claim(session, no_run, host="b", stale_before=fresh, **MAX) is None


def test_claim_refuses_cancelled_finished_and_external_runs(session, jobs, owner) -> None:
    fresh = utcnow() - LONG_AGO
    cancelled = queued(session, jobs, owner)
    lifecycle.request_cancel(session, cancelled)
    done = running(session, jobs, owner)
    lifecycle.finish(session, done.id, done.attempt, RunStatus.succeeded)
    external = lifecycle.open_external(
        session, owner, name="e", config={}, algorithm="x", task="y", model="z", tags=[],
        total_steps=None,
    )  # fmt: skip
    make_stale(session, external.id)
    for run in (cancelled, done, external):
        assert lifecycle.claim(session, run.id, host="h", stale_before=fresh, **MAX) is None


def test_heartbeat_reports_owned_cancel_requested_and_lost(session, jobs, owner) -> None:
    run = running(session, jobs, owner)
    before = state(session, run.id).heartbeat_at
    assert lifecycle.heartbeat(session, run.id, 1) is Beat.OWNED
    assert state(session, run.id).heartbeat_at >= before
    lifecycle.request_cancel(session, run)
    assert lifecycle.heartbeat(session, run.id, 1) is Beat.CANCEL_REQUESTED
    assert state(session, run.id).status == RunStatus.running  # the worker decides when to stop
    make_stale(session, run.id)
    lifecycle.requeue_stale(session, utcnow() - LONG_AGO, 3)  # cancelled: its worker was gone
    assert lifecycle.heartbeat(session, run.id, 1) is Beat.LOST


def test_a_newer_attempt_locks_the_old_one_out(session, jobs, owner) -> None:
    run = running(session, jobs, owner)
    make_stale(session, run.id)
    assert lifecycle.claim(session, run.id, host="b", stale_before=utcnow() - LONG_AGO, **MAX)
    assert lifecycle.heartbeat(session, run.id, 1) is Beat.LOST
    assert not lifecycle.describe_attempt(session, run.id, 1, device="cpu", total_steps=9)
    assert not lifecycle.finish(session, run.id, 1, RunStatus.succeeded)
    assert not lifecycle.fail(session, run.id, 1, "old attempt")
    assert state(session, run.id).status == RunStatus.running
    assert lifecycle.describe_attempt(session, run.id, 2, device="cpu", total_steps=9)
    assert (state(session, run.id).device, state(session, run.id).total_steps) == ("cpu", 9)


def test_finish_and_fail_end_an_owned_run(session, jobs, owner) -> None:
    for status in (RunStatus.succeeded, RunStatus.cancelled):
        run = running(session, jobs, owner)
        assert lifecycle.finish(session, run.id, 1, status)
        ended = state(session, run.id)
        assert ended.status == status and ended.finished_at is not None and ended.error is None
        assert not lifecycle.finish(session, run.id, 1, RunStatus.failed)  # final is final
    run = running(session, jobs, owner)
    assert lifecycle.fail(session, run.id, 1, "Traceback: boom")
    assert (state(session, run.id).status, state(session, run.id).error) == (
        RunStatus.failed,
        "Traceback: boom",
    )
    with pytest.raises(ValueError, match="final status"):
        lifecycle.finish(session, run.id, 1, RunStatus.running)


def test_finish_calls_the_registered_hooks_in_its_own_transaction(
    session, jobs, owner, monkeypatch
) -> None:
    """The rooms above hook into a finish (``on_finished``): each hook once, with the status,
    before the commit (what it writes is committed with the finish, or neither is), and never
    for a finish that is refused."""
    monkeypatch.setattr(lifecycle, "_on_finished", [])  # this process's own hooks come back after
    calls: list[tuple[int, RunStatus, RunStatus]] = []

    def hook(s: Session, run_id: int, status: RunStatus) -> None:
        assert s is session and s.in_transaction()
        stored = s.scalar(select(Run.status).where(Run.id == run_id))  # the finish, uncommitted
        calls.append((run_id, status, RunStatus(stored)))

    assert lifecycle.on_finished(hook) is hook
    lifecycle.on_finished(hook)  # registered once
    assert lifecycle.finished_hooks() == (hook,)
    run = running(session, jobs, owner)
    assert lifecycle.finish(session, run.id, 1, RunStatus.succeeded)
    assert not lifecycle.finish(session, run.id, 1, RunStatus.failed)  # refused: no hook
    other = running(session, jobs, owner)
    assert lifecycle.fail(session, other.id, 1, "boom")
    assert calls == [
        (run.id, RunStatus.succeeded, RunStatus.succeeded),
        (other.id, RunStatus.failed, RunStatus.failed),
    ]

    def broken(s: Session, run_id: int, status: RunStatus) -> None:
        raise RuntimeError("hook failed")

    lifecycle.on_finished(broken)
    third = running(session, jobs, owner)
    with pytest.raises(RuntimeError, match="hook failed"):
        lifecycle.finish(session, third.id, 1, RunStatus.succeeded)
    session.rollback()  # what the caller's session does with the error: neither is written
    assert state(session, third.id).status == RunStatus.running


@pytest.mark.parametrize(
    "start",
    [
        "import worker.tasks",  # a Celery worker (`conspo-lab worker`, serve --embedded's too)
        "from backend.main import create_app; create_app()",  # the API
    ],
)
def test_every_process_that_finishes_runs_has_the_pipelines_hook(start: str, tmp_path) -> None:
    """A succeeded stage releases its pipeline's next one in whichever process finishes it: the
    lifecycle does not import pipelines; each process registers its hook when it starts."""
    code = "\n".join(
        [
            "from backend.runs import lifecycle",
            "assert not lifecycle.finished_hooks()",
            start,
            "from backend.pipelines.stages import on_run_finished",
            "assert lifecycle.finished_hooks() == (on_run_finished,), lifecycle.finished_hooks()",
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSPO_")}
    env["CONSPO_DATA_DIR"] = str(tmp_path)  # embedded defaults: nothing is reached at start
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


def test_requeue_stale_requeues_or_cancels_only_stale_worker_runs(session, jobs, owner) -> None:
    stale = running(session, jobs, owner)
    stale_cancel = running(session, jobs, owner)
    lifecycle.request_cancel(session, stale_cancel)
    alive = running(session, jobs, owner)
    external = lifecycle.open_external(
        session, owner, name="e", config={}, algorithm="x", task="y", model="z", tags=[],
        total_steps=None,
    )  # fmt: skip
    for run in (stale, stale_cancel, external):
        make_stale(session, run.id)
    out = lifecycle.requeue_stale(session, utcnow() - LONG_AGO, 3)
    assert stale.id in out.queued and stale_cancel.id in out.cancelled
    assert alive.id not in out.queued + out.cancelled
    assert external.id not in out.queued + out.cancelled
    assert state(session, stale.id).status == RunStatus.queued
    assert state(session, stale.id).enqueued_at is None  # to be sent again
    assert state(session, stale_cancel.id).status == RunStatus.cancelled
    assert state(session, alive.id).status == RunStatus.running
    assert state(session, external.id).status == RunStatus.running
    again = lifecycle.requeue_stale(session, utcnow() - LONG_AGO, 3)
    assert stale.id not in again.queued  # a transition applies once


def test_request_cancel_from_every_state(session, jobs, owner) -> None:
    q = lifecycle.request_cancel(session, queued(session, jobs, owner))
    assert q.status == RunStatus.cancelled and q.cancel_requested and q.finished_at is not None
    r = lifecycle.request_cancel(session, running(session, jobs, owner))
    assert r.status == RunStatus.running and r.cancel_requested  # the worker stops it
    e = lifecycle.open_external(
        session, owner, name="e", config={}, algorithm="x", task="y", model="z", tags=[],
        total_steps=None,
    )  # fmt: skip
    e = lifecycle.request_cancel(session, e)
    assert e.status == RunStatus.cancelled  # nobody else would close it
    done = running(session, jobs, owner)
    lifecycle.finish(session, done.id, 1, RunStatus.succeeded)
    # A final state allows no transition: refused, naming the run and its status.
    for finished in (state(session, done.id), q, e):
        with pytest.raises(lifecycle.Conflict, match=rf"run {finished.id} is {finished.status};"):
            lifecycle.request_cancel(session, finished)
    done = state(session, done.id)
    assert done.status == RunStatus.succeeded and not done.cancel_requested


def test_cancelling_what_has_ended_is_a_409_naming_its_status(api: Any) -> None:
    """Runs, studies and pipelines: a cancel is a transition their final states do not allow."""
    config = {"algorithm": "grpo", "steps": 2, "model": {"name": "tiny"}, "eval": {"every": 0}}
    run = api.post("/api/runs", json={"config": config}).json()["runs"][0]
    assert api.post(f"/api/runs/{run['id']}/cancel").json()["status"] == "cancelled"
    external = api.external()
    logged = api.post(f"/api/runs/{external['id']}/log", json={"steps": [], "status": "succeeded"})
    assert logged.status_code == 200, logged.text
    for run_id, status in ((run["id"], "cancelled"), (external["id"], "succeeded")):
        again = api.post(f"/api/runs/{run_id}/cancel")
        assert again.status_code == 409, again.text
        assert f"run {run_id} is {status}" in again.json()["detail"]
        assert api.get(f"/api/runs/{run_id}").json()["status"] == status  # left as it was

    study = {
        "name": "cancel-twice", "config": config, "seeds": [0, 1],
        "arms": [{"name": "grpo", "overrides": {}}],
        "objective": {"metric": "eval/accuracy"},
    }  # fmt: skip
    sid = api.post("/api/studies", json=study).json()["id"]
    assert api.post(f"/api/studies/{sid}/cancel").json()["status"] == "cancelled"
    again = api.post(f"/api/studies/{sid}/cancel")
    assert again.status_code == 409 and f"study {sid} is cancelled" in again.json()["detail"]

    pid = api.post("/api/pipelines", json={"name": "cancel-twice", "stages": [config]}).json()["id"]
    assert api.post(f"/api/pipelines/{pid}/cancel").json()["status"] == "cancelled"
    again = api.post(f"/api/pipelines/{pid}/cancel")
    assert again.status_code == 409 and f"pipeline {pid} is cancelled" in again.json()["detail"]

    doc = api.client.get("/openapi.json").json()["paths"]
    for path in ("/api/runs/{run_id}", "/api/studies/{study_id}", "/api/pipelines/{pipeline_id}"):
        assert "409" in doc[f"{path}/cancel"]["post"]["responses"], path  # documented


def test_delete_run_removes_the_run_and_its_points(session, jobs, owner) -> None:
    run = running(session, jobs, owner)
    write_points(session, run.id, [StepPoints(1, {"sep/gap": 0.1})], owner_attempt=1)
    session.commit()
    lifecycle.delete_run(session, state(session, run.id))
    assert session.get(Run, run.id) is None
    assert not session.scalar(select(func.count()).where(Metric.run_id == run.id))
    assert lifecycle.heartbeat(session, run.id, 1) is Beat.LOST


def test_external_runs_open_accept_points_and_close(session, owner) -> None:
    run = lifecycle.open_external(
        session, owner, name="ext", config={"seed": 7}, algorithm="trl-grpo", task="t",
        model="m", tags=["a", "a"], total_steps=5,
    )  # fmt: skip
    assert run.status == RunStatus.running and run.external and run.seed == 7
    assert run.tags == ["a"] and run.total_steps == 5
    lifecycle.check_accepts_points(run)
    assert lifecycle.close_external(session, run.id, RunStatus.failed, "crashed")
    session.commit()
    run = state(session, run.id)
    assert (run.status, run.error) == (RunStatus.failed, "crashed")
    with pytest.raises(lifecycle.Conflict, match="accepts no more points"):
        lifecycle.check_accepts_points(run)
    assert not lifecycle.close_external(session, run.id, RunStatus.succeeded)  # final is final
    with pytest.raises(ValueError):
        lifecycle.close_external(session, run.id, RunStatus.cancelled)


def test_worker_runs_accept_no_logged_points(session, jobs, owner) -> None:
    with pytest.raises(lifecycle.Conflict, match="run by a worker"):
        lifecycle.check_accepts_points(running(session, jobs, owner))


def test_release_hands_a_stopped_run_back_without_counting_a_death(session, jobs, owner) -> None:
    run = running(session, jobs, owner)
    assert lifecycle.release(session, run.id, 2) is None  # not the owning attempt
    assert lifecycle.release(session, run.id, 1) is RunStatus.queued
    back = state(session, run.id)
    assert (back.status, back.attempt, back.worker_deaths) == (RunStatus.queued, 1, 0)
    assert back.enqueued_at is None  # to be sent again (by the worker, else by a reaper)
    assert run.id in lifecycle.unsent(session, utcnow() + timedelta(seconds=1))
    assert lifecycle.release(session, run.id, 1) is None  # a transition applies once
    again = lifecycle.claim(session, run.id, host="h", stale_before=utcnow() - LONG_AGO, **MAX)
    assert again is not None and again.attempt == 2
    lifecycle.request_cancel(session, again)  # asked while the worker was stopping
    assert lifecycle.release(session, run.id, 2) is RunStatus.cancelled  # never queued again
    assert state(session, run.id).status == RunStatus.cancelled


def test_a_run_whose_worker_dies_max_attempts_times_fails(session, jobs, owner) -> None:
    """Each stale heartbeat counts a worker death, whether the reaper or a redelivered message
    finds it first; the third fails the run instead of taking a third worker down."""
    run = running(session, jobs, owner)
    fresh = utcnow() - LONG_AGO
    for deaths in (1, 2):
        make_stale(session, run.id)
        assert run.id in lifecycle.requeue_stale(session, fresh, 3).queued
        back = state(session, run.id)
        assert (back.status, back.worker_deaths, back.error) == (RunStatus.queued, deaths, None)
        assert f"(attempt {deaths}, last heartbeat" in back.last_worker_death
        assert lifecycle.claim(session, run.id, host="h", stale_before=fresh, **MAX)
    make_stale(session, run.id)
    out = lifecycle.requeue_stale(session, fresh, 3)
    assert run.id in out.failed and run.id not in out.queued
    dead = state(session, run.id)
    assert (dead.status, dead.worker_deaths) == (RunStatus.failed, 3)
    assert dead.error.startswith("worker died 3 times (out of memory?)")
    assert dead.finished_at is not None
    assert lifecycle.claim(session, run.id, host="h", stale_before=fresh, **MAX) is None
    # A redelivered message that finds the run stale counts the death the same way.
    other = running(session, jobs, owner)
    make_stale(session, other.id)
    assert lifecycle.claim(session, other.id, host="h", stale_before=fresh, max_attempts=1) is None
    assert state(session, other.id).status == RunStatus.failed


def test_stranded_names_sent_runs_whose_job_the_broker_lost(own_settings: Settings) -> None:
    db, jobs = Database(own_settings), JobQueue.from_settings(own_settings)
    soon = utcnow() + timedelta(seconds=1)
    with db.session() as session:
        owner = get_or_create_user(session, "stranded")
        run = queued(session, jobs, owner)
        assert jobs.waiting() == 1
        assert lifecycle.stranded(session, jobs, soon) == []  # its job waits in the queue
        lose_queued_jobs(own_settings)
        assert jobs.waiting() == 0
        assert lifecycle.stranded(session, jobs, utcnow() - LONG_AGO) == []  # sent too recently
        assert lifecycle.stranded(session, jobs, soon) == [run.id]
        assert lifecycle.send(session, jobs, run.id)  # what a reaper does with it
        assert lifecycle.stranded(session, jobs, soon + timedelta(seconds=1)) == []
        lifecycle.claim(session, run.id, host="h", stale_before=utcnow() - LONG_AGO, **MAX)
        lose_queued_jobs(own_settings)
        assert lifecycle.stranded(session, jobs, soon + timedelta(seconds=1)) == []  # claimed
    db.dispose()
