"""The API's protections against overload: a short pool checkout timeout answered with 503, a
time limit on reads that cannot start, and PostgreSQL's statement and idle-in-transaction
timeouts on the API's connections (not on workers')."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from backend.api.deps import SessionDep
from backend.config import Settings
from backend.db import Database
from backend.main import create_app
from tests.api.conftest import make_settings
from tests.support import run_async


def test_an_exhausted_pool_answers_503_at_once_naming_the_setting(settings: Settings) -> None:
    tight = settings.model_copy(
        update={"db_pool_size": 1, "db_max_overflow": 0, "db_pool_timeout_s": 0.5}
    )
    app = create_app(tight)
    with TestClient(app) as client:
        held = app.state.db.engine.connect()  # the pool's only connection
        try:
            started = time.monotonic()
            r = client.get("/api/runs")
            waited = time.monotonic() - started
        finally:
            held.close()
        assert r.status_code == 503, r.text
        assert "CONSPO_DB_POOL_TIMEOUT_S" in r.json()["detail"] and r.headers["retry-after"]
        assert waited < 20  # the pool's 0.5 s, not the old 30 s (generous: a loaded CI box)
        assert client.get("/api/runs").status_code == 200  # the connection is back


def test_a_read_that_cannot_answer_in_time_gets_503_and_a_write_is_never_cut(
    settings: Settings,
) -> None:
    """The timeout middleware on a stand-in handler that sleeps (what a request stuck behind a
    backlog looks like from the outside; a real backlog cannot be made to order)."""
    app = create_app(settings.model_copy(update={"request_timeout_s": 0.5}))

    async def slow(seconds: float) -> dict[str, float]:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    app.add_api_route("/api/test-slow", slow, methods=["GET", "POST"])
    with TestClient(app) as client:
        r = client.get("/api/test-slow", params={"seconds": 10})
        assert r.status_code == 503 and "CONSPO_REQUEST_TIMEOUT_S" in r.json()["detail"]
        assert r.headers["retry-after"]
        assert client.post("/api/test-slow", params={"seconds": 1}).json() == {"slept": 1}
        assert client.get("/api/test-slow", params={"seconds": 0}).status_code == 200


def test_api_connections_carry_postgresql_timeouts(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    limits = {"db_statement_timeout_s": 0.5, "db_idle_in_transaction_timeout_s": 7}
    settings = make_settings(tmp_path, pg_url, redis_url, **limits)
    api_db, worker_db = Database(settings, serving=True), Database(settings)
    try:
        with api_db.session() as session:
            show = "SHOW idle_in_transaction_session_timeout"
            assert session.scalar(text(show)) == "7s"
            with pytest.raises(OperationalError, match="statement timeout"):
                session.execute(text("SELECT pg_sleep(5)"))
        with worker_db.session() as session:  # workers' bulk writes keep no limit
            assert session.scalar(text("SHOW statement_timeout")) == "0"
    finally:
        api_db.dispose()
        worker_db.dispose()
    # Through the API (a stand-in handler whose query runs too long): 503 naming the setting.
    app = create_app(settings)

    def sleepy(session: SessionDep) -> None:
        session.execute(text("SELECT pg_sleep(5)"))

    app.add_api_route("/api/test-sleepy", sleepy)
    with TestClient(app) as client:
        r = client.get("/api/test-sleepy")
        assert r.status_code == 503 and "CONSPO_DB_STATEMENT_TIMEOUT_S" in r.json()["detail"]


def test_a_read_cut_by_the_timeout_gives_its_connection_back(settings: Settings) -> None:
    """The session's close survives the cancellation: no connection leaks out of the pool.

    The handler's query runs the way the app runs sync work, in an anyio thread call that the
    cancellation waits for (``asyncio.to_thread`` would abandon it and close the session beside
    a checkout still in progress), so the cut may land before, during or after the query."""
    app = create_app(settings.model_copy(update={"request_timeout_s": 0.5}))
    sessions = []  # kept alive, so a session left open is not closed by the garbage collector

    async def holding(session: SessionDep) -> None:
        sessions.append(session)
        await anyio.to_thread.run_sync(session.execute, text("SELECT 1"))  # checks one out
        await asyncio.sleep(10)

    app.add_api_route("/api/test-holding", holding)
    with TestClient(app) as client:
        assert client.get("/api/test-holding").status_code == 503
        assert app.state.db.engine.pool.checkedout() == 0


def test_the_session_gate_admits_its_slots_and_refuses_after_its_wait() -> None:
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from backend.api.deps import SessionGate

    async def scenario() -> None:
        gate = SessionGate(slots=2, wait_s=0.2)
        async with gate.slot(), gate.slot():
            with pytest.raises(PoolTimeout):  # a third waits 0.2 s, then is refused
                async with gate.slot():
                    pass
        async with gate.slot(), gate.slot():  # both slots came back
            pass

    async def writes_leave_reads_a_slot() -> None:
        gate = SessionGate(slots=4, wait_s=0.2)
        assert gate.write_slots == 3
        async with gate.slot(write=True), gate.slot(write=True), gate.slot(write=True):
            with pytest.raises(PoolTimeout):  # a fourth write waits for one of the three
                async with gate.slot(write=True):
                    pass
            async with gate.slot():  # a read takes the slot writes cannot
                pass
        async with gate.slot(), gate.slot(), gate.slot(), gate.slot():  # reads take them all
            pass

    run_async(scenario())
    run_async(writes_leave_reads_a_slot())
    settings = Settings(db_pool_size=3, db_max_overflow=1, stream_db_connections=2)
    assert SessionGate.for_settings(settings).slots == 2  # capped by the pool, less the hub's
    assert SessionGate.for_settings(Settings()).slots == Settings().db_request_concurrency


def test_a_pooled_connection_is_pinged_only_after_sitting_idle(
    pg_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One returned just now is handed out as it is (no round trip); one idle longer that
    PostgreSQL dropped meanwhile is replaced before use; one dropped and reused at once fails
    its statement, and the pool drops the connections as old as it."""
    from backend import db as db_module

    monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 0.3)
    database = Database(make_settings(tmp_path, pg_url, redis_url), serving=True)
    pings = 0
    ping = database.engine.dialect.do_ping

    def counted_ping(dbapi_connection: object) -> bool:
        nonlocal pings
        pings += 1
        return ping(dbapi_connection)

    monkeypatch.setattr(database.engine.dialect, "do_ping", counted_ping)

    def select_one() -> int | None:
        with database.session() as session:
            return session.scalar(text("SELECT 1"))

    def drop_connections() -> None:
        drop_database_connections(pg_url)

    try:
        assert select_one() == 1 and select_one() == 1
        assert pings == 0  # both checkouts came right after a return (or a connect)
        drop_connections()
        time.sleep(0.5)
        assert select_one() == 1  # pinged, found dead, replaced: the read never saw it
        assert pings >= 1
        drop_connections()
        time.sleep(0.1)  # PostgreSQL closes the connection; the pool does not know yet
        with pytest.raises(OperationalError):
            select_one()
        assert select_one() == 1  # the pool dropped the dead ones: the next read works
    finally:
        database.dispose()


def drop_database_connections(pg_url: str) -> None:
    """PostgreSQL terminates every connection to ``pg_url``'s database (as a restart or an
    administrator would), but the one asking."""
    import psycopg

    admin = pg_url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0]
    with psycopg.connect(f"{admin}/postgres", autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (pg_url.rsplit("/", 1)[1],),
        )


def test_the_study_search_storage_replaces_a_connection_postgresql_dropped(pg_url: str) -> None:
    """Optuna's storage (search and tuned studies; their pages read it) pings a pooled
    connection before use: one PostgreSQL terminated is replaced, where it was a study page's
    500 (stop 60's CI: another test's terminate, then GET /api/studies/1)."""
    from backend.studies.search import storage

    store = storage(pg_url)
    store.get_all_studies()  # a connection pooled
    drop_database_connections(pg_url)
    time.sleep(0.1)  # PostgreSQL closes it; the pool does not know yet
    assert isinstance(store.get_all_studies(), list)


def test_the_database_gone_under_a_library_is_a_503_not_a_500() -> None:
    """An exception a library raised from SQLAlchemy's OperationalError (Optuna's
    StorageInternalError) is the 503 of an unavailable database; any other, a 500."""
    from fastapi import FastAPI

    from backend.api import errors

    app = FastAPI()
    errors.install(app)

    @app.get("/wrapped")
    def wrapped() -> None:
        try:
            raise OperationalError("SELECT 1", {}, Exception("terminating connection"))
        except OperationalError as exc:
            raise RuntimeError("An exception is raised during the commit") from exc

    @app.get("/plain")
    def plain() -> None:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        gone = client.get("/wrapped")
        assert gone.status_code == 503 and "database unavailable" in gone.json()["detail"]
        assert client.get("/plain").status_code == 500
