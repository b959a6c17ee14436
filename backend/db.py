"""Engine and session factory for either dialect, plus the portable bulk upsert.

SQLite gets WAL, a busy timeout and foreign keys so the API, the SSE pollers and a worker process
can share one file; PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session, sessionmaker

from backend.config import Settings


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    return create_engine(url, **kwargs)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


class Database:
    """An engine and its session factory (one per process and settings)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = make_engine(settings.database_url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


def upsert(
    conn: Connection | Session,
    table: Table,
    rows: Sequence[dict[str, Any]],
    key: Sequence[str],
    *,
    update: bool = True,
) -> int:
    """``INSERT … ON CONFLICT (key) DO UPDATE`` (or ``DO NOTHING``) of ``rows``, on both dialects.

    On PostgreSQL the rows travel as one array per column through ``unnest`` (one statement and
    one round trip, whatever the batch size); SQLite gets an executemany of the same upsert.
    """
    if not rows:
        return 0
    bind = conn.get_bind() if isinstance(conn, Session) else conn
    dialect = bind.dialect
    if dialect.name == "postgresql":
        sql, params = _pg_unnest_upsert(table, rows, key, update, dialect)
        # Same connection and transaction as the session; binary parameters skip the text-array
        # quoting that otherwise dominates the cost of large batches.
        connection = conn.connection() if isinstance(conn, Session) else conn
        dbapi = connection.connection.dbapi_connection
        with dbapi.cursor() as cur:  # type: ignore[union-attr]
            cur.execute(sql, params, binary=True)
        return len(rows)
    stmt = sqlite.insert(table)
    if update:
        cols = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in key}
        stmt = stmt.on_conflict_do_update(index_elements=list(key), set_=cols)
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=list(key))
    conn.execute(stmt, list(rows))
    return len(rows)


def insert_ignore(
    conn: Connection | Session, table: Table, rows: Sequence[dict[str, Any]], key: Sequence[str]
) -> int:
    return upsert(conn, table, rows, key, update=False)


def _pg_unnest_upsert(
    table: Table,
    rows: Sequence[dict[str, Any]],
    key: Sequence[str],
    update: bool,
    dialect: Any,
) -> tuple[str, dict[str, Any]]:
    quote = dialect.identifier_preparer.quote
    cols = [c for c in table.columns]
    names = ", ".join(quote(c.name) for c in cols)
    arrays = ", ".join(
        f"CAST(%(a{i})b AS {c.type.compile(dialect=postgresql.dialect())}[])"
        for i, c in enumerate(cols)
    )
    conflict = ", ".join(quote(k) for k in key)
    sets = ", ".join(
        f"{quote(c.name)} = EXCLUDED.{quote(c.name)}" for c in cols if c.name not in key
    )
    action = f"DO UPDATE SET {sets}" if update and sets else "DO NOTHING"
    sql = (
        f"INSERT INTO {quote(table.name)} ({names}) SELECT * FROM unnest({arrays})"
        f" ON CONFLICT ({conflict}) {action}"
    )
    params = {f"a{i}": [row.get(c.name) for row in rows] for i, c in enumerate(cols)}
    return sql, params
