"""Engine and session factory for either dialect.

SQLite gets WAL, a busy timeout and foreign keys so the API, the SSE pollers and a worker process
can share one file; PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from backend.config import Settings


def make_engine(url: str, *, sqlite_busy_timeout_s: float = 30.0, **kwargs: Any) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_s},
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas(sqlite_busy_timeout_s))
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    return create_engine(url, **kwargs)


def _sqlite_pragmas(busy_timeout_s: float) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.close()

    return on_connect


class Database:
    """An engine and its session factory (one per process and settings)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = make_engine(
            settings.database_url, sqlite_busy_timeout_s=settings.sqlite_busy_timeout_s
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
