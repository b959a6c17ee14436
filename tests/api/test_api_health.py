"""``/api/health`` tells the truth: 503 when the database or broker is down, live workers, and
``degraded`` when queued runs cannot make progress. Both backends, real brokers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend import liveness
from backend.config import Settings
from backend.db import Database
from backend.liveness import WorkerIdentity
from backend.main import create_app
from backend.models import Worker, utcnow
from backend.runs.queue import JobQueue
from conspo.sandbox import sandbox_available
from tests.api.conftest import lose_queued_jobs, make_tokens, tiny_config, wait_for
from worker.capabilities import probe
from worker.reaper import reap

pytestmark = pytest.mark.services


@pytest.fixture
def client(own_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(own_settings)) as c:
        yield c


def health(client: TestClient, expected_code: int = 200) -> dict[str, Any]:
    r = client.get("/api/health")
    assert r.status_code == expected_code, r.text
    return r.json()


def test_health_is_503_and_names_what_is_down(own_settings: Settings, tmp_path: Path) -> None:
    broker_down = own_settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    if own_settings.mode == "embedded":
        not_a_database = tmp_path / "garbage.db"
        not_a_database.write_bytes(b"this is not a SQLite file" * 100)
        database_url = f"sqlite:///{not_a_database}"
    else:
        database_url = "postgresql+psycopg://postgres@127.0.0.1:1/conspo"
    database_down = own_settings.model_copy(update={"database_url": database_url})
    for settings, down in ((broker_down, "broker"), (database_down, "database")):
        with TestClient(create_app(settings)) as client:
            body = health(client, 503)
        assert body["status"] == "down" and body[down].startswith("error: ")
        assert any(reason.startswith(f"{down} error: ") for reason in body["reasons"])
        up = "database" if down == "broker" else "broker"
        assert body[up] == "ok"


def test_health_counts_live_workers(own_settings: Settings, client: TestClient) -> None:
    body = health(client)
    assert body["workers"] == []
    if own_settings.mode == "embedded":  # the embedded worker is the only one there is
        assert body["status"] == "degraded"
        assert body["reasons"] == ["no worker is alive; 0 run(s) queued"]
    else:  # a cluster may scale its workers to zero while nothing waits
        assert body["status"] == "ok" and body["reasons"] == []
    db = Database(own_settings)
    me, gone = WorkerIdentity(host="gpu-1", pid=11), WorkerIdentity(host="gpu-2", pid=22)
    with db.session() as session:
        liveness.mark_alive(session, me)
        liveness.mark_alive(session, gone)
        long_ago = utcnow() - timedelta(seconds=own_settings.worker_alive_s + 1)
        session.get(Worker, gone.name).seen_at = long_ago  # type: ignore[union-attr]
        session.commit()
    body = health(client)
    assert body["status"] == "ok", body["reasons"]
    assert [w["name"] for w in body["workers"]] == ["gpu-1:11"]
    with db.session() as session:
        liveness.mark_stopped(session, me)
    assert health(client)["workers"] == []
    db.dispose()


def test_health_lists_whether_a_worker_can_sandbox_code(
    own_settings: Settings, client: TestClient
) -> None:
    gpus, capabilities = probe(own_settings)
    db = Database(own_settings)
    me = WorkerIdentity(host="cpu-9", pid=99, gpus=gpus, capabilities=capabilities)
    with db.session() as session:
        liveness.mark_alive(session, me)
    (worker,) = health(client)["workers"]
    assert worker["capabilities"]["sandbox"] == ("bwrap" if sandbox_available() else "none")
    with db.session() as session:
        liveness.mark_stopped(session, me)
    db.dispose()


def test_health_is_degraded_while_runs_wait_without_a_worker(
    own_settings: Settings, client: TestClient
) -> None:
    token = make_tokens(own_settings)["alice"]
    r = client.post(
        "/api/runs",
        json={"config": tiny_config(2)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 201, r.text
    body = health(client)
    assert body["status"] == "degraded"
    assert "no worker is alive; 1 run(s) queued" in body["reasons"]


def test_health_reports_runs_whose_job_the_broker_lost_until_a_reaper_resends_them(
    own_settings: Settings,
) -> None:
    settings = own_settings.model_copy(update={"unclaimed_resend_s": 0.001})  # any age counts
    db, jobs = Database(settings), JobQueue.from_settings(settings)
    with TestClient(create_app(settings)) as client, db.session() as session:
        liveness.mark_alive(session, WorkerIdentity())  # a worker is alive: only the loss counts
        r = client.post(
            "/api/runs",
            json={"config": tiny_config(2)},
            headers={"Authorization": f"Bearer {make_tokens(settings)['alice']}"},
        )
        run_id = r.json()["runs"][0]["id"]
        assert health(client)["status"] == "ok"  # unclaimed, but its job waits in the queue
        lose_queued_jobs(settings)
        body = wait_for(lambda: (b := health(client))["stranded_runs"] and b, 60, "stranded")
        assert body["status"] == "degraded" and body["stranded_runs"] == [run_id]
        assert "missing from the job queue" in body["reasons"][0]
        assert reap(db, jobs, settings) == [run_id]  # one pass of a worker's reaper
        assert jobs.waiting() == 1
        body = health(client)
        assert body["status"] == "ok" and body["stranded_runs"] == []
    db.dispose()


def test_a_stale_heartbeat_degrades_health_and_a_locked_table_cannot_hold_it(
    own_settings: Settings,
) -> None:
    """A running run whose worker stopped beating (dead, or stuck holding the interpreter) is
    named; and health answers within its own timeout while another session locks the runs
    table (PostgreSQL: ``LOCK TABLE``; SQLite readers are never blocked in WAL mode)."""
    import time

    from sqlalchemy import text, update

    from backend.models import Run, RunStatus

    settings = own_settings.model_copy(update={"health_timeout_s": 1.0})
    db = Database(settings)
    with TestClient(create_app(settings)) as client:
        with db.session() as session:
            liveness.mark_alive(session, WorkerIdentity())
        r = client.post(
            "/api/runs",
            json={"config": tiny_config(2)},
            headers={"Authorization": f"Bearer {make_tokens(settings)['alice']}"},
        )
        run_id = r.json()["runs"][0]["id"]
        assert health(client)["status"] == "ok"
        long_ago = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s + 5)
        with db.session() as session:
            session.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status=RunStatus.running, attempt=1, heartbeat_at=long_ago)
            )
            session.commit()
        body = health(client)
        assert body["status"] == "degraded" and body["stale_runs"] == [run_id]
        assert any("sent no heartbeat for over" in reason for reason in body["reasons"])
        if settings.mode == "cluster":
            with db.engine.connect() as locker:
                locker.execute(text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))
                started = time.monotonic()
                body = health(client)
                took = time.monotonic() - started
                locker.rollback()
            print(f"health under a table lock answered in {took:.2f} s")
            assert took < 1.0 + 2.0, took
            assert body["status"] == "degraded" and body["database"] == "ok"
            assert any("locked or overloaded" in reason for reason in body["reasons"])
    db.dispose()
