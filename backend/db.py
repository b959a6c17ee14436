"""Engine and session factories for either dialect.

SQLite gets WAL, a busy timeout and foreign keys so the API, the SSE poller and a worker process
can share one file; PostgreSQL goes through psycopg 3.

The pool is bounded and a checkout waits ``db_pool_timeout_s`` at most (the API answers 503, see
``backend.main``), so a burst queues briefly instead of piling up 30-second waits. On PostgreSQL
a connection that sat in the pool longer than ``PING_AFTER_IDLE_S`` is pinged before it is
handed out (one lost by a restart, an idle timeout or a dropped link is replaced); one
returned just now is not pinged, as ``pool_pre_ping`` would: that ping was one of a read's four
to six round trips, each a wait for PostgreSQL's backend and then this thread to get a CPU,
long waits on a busy machine. A connection that died since anyway fails its statement, the
pool drops every connection as old as it, and that request alone gets the 503 of an
unavailable database. Short reads take ``Database.read_session`` (autocommit on PostgreSQL: no
BEGIN or ROLLBACK round trip either). The API's
engine also gets server-side limits on PostgreSQL (``Database(settings, serving=True)``): a
statement timeout and an idle-in-transaction timeout, so one slow query or a leaked transaction
cannot hold a connection for ever. Workers and CLI commands keep no such limits: their bulk
writes and migrations may legitimately run long.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from backend.config import Settings


def make_engine(
    url: str,
    *,
    sqlite_busy_timeout_s: float = 30.0,
    server_limits: dict[str, float] | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``; ``server_limits``: PostgreSQL settings in seconds (0: none) given
    to every connection, e.g. ``{"statement_timeout": 60}``."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        else:  # one connection per thread (SingletonThreadPool): no pool to size
            for option in ("pool_size", "max_overflow", "pool_timeout"):
                kwargs.pop(option, None)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_s},
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas(sqlite_busy_timeout_s))
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    if server_limits:
        options = " ".join(f"-c {k}={round(v * 1000)}" for k, v in server_limits.items())
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "options": options}
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):  # given: every checkout is pinged
        _ping_after_idle(engine)
    return engine


PING_AFTER_IDLE_S = 1.0


def _ping_after_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only if it was idle for ``PING_AFTER_IDLE_S``."""

    def connected(_dbapi_conn: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    def returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    def checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("returned_at", 0.0) <= PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # the pool drops this connection and every one as old (a restart took them all)
            # and checks out another, a few times at most
            error = DisconnectionError(f"pooled connection failed its ping: {exc}")
            error.invalidate_pool = True
            raise error from exc

    event.listen(engine, "connect", connected)
    event.listen(engine, "checkin", returned)
    event.listen(engine, "checkout", checkout)


def _sqlite_pragmas(busy_timeout_s: float) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.close()

    return on_connect


WRITES_IN = "writes_in"  # a read session's info: the session factory its writes use


@contextmanager
def transaction_for(session: Session) -> Iterator[Session]:
    """Where a write made in the course of a read goes: ``session`` itself, or for a read
    session in autocommit (``Database.read_session``) a session of its own, with a real
    transaction (its own connection), closed on exit. Commit it as usual."""
    writes = session.info.get(WRITES_IN)
    if writes is None:
        yield session
        return
    with writes() as own:
        yield own


class Database:
    """An engine and its session factories (one per process and settings)."""

    def __init__(self, settings: Settings, *, serving: bool = False) -> None:
        """``serving``: the API process's engine, with the server-side limits of the settings."""
        self.settings = settings
        limits = None
        if serving:
            limits = {
                "statement_timeout": settings.db_statement_timeout_s,
                "idle_in_transaction_session_timeout": settings.db_idle_in_transaction_timeout_s,
            }
        self.engine = make_engine(
            settings.database_url,
            sqlite_busy_timeout_s=settings.sqlite_busy_timeout_s,
            server_limits=limits,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            pool_timeout=settings.db_pool_timeout_s,
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.read_sessions = self.sessions
        if self.engine.dialect.name == "postgresql":
            reads = self.engine.execution_options(isolation_level="AUTOCOMMIT")
            self.read_sessions = sessionmaker(
                reads, expire_on_commit=False, info={WRITES_IN: self.sessions}
            )

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        """A session for one short read: on PostgreSQL in autocommit, so it costs no BEGIN and
        no ROLLBACK round trip (two of a cached series read's four). Its statements see what
        they would in a transaction: at PostgreSQL's READ COMMITTED each statement takes its
        own snapshot either way. What it writes goes through :func:`transaction_for`."""
        with self.read_sessions() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
