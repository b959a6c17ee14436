"""Engine and session factory for either dialect, plus the portable bulk upsert.

SQLite gets WAL, a busy timeout and foreign keys so the API, the SSE pollers and a worker process
can share one file; PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from psycopg import adapters as pg_adapters
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import BigInteger, Boolean, Engine, Float, Integer, Table, create_engine, event
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
    arrays, selected, params = [], [], {}
    for i, c in enumerate(cols):
        values = [row.get(c.name) for row in rows]
        param, expr = _pg_column(values, c.type)
        params[f"a{i}"] = param
        arrays.append(f"CAST(%(a{i})b AS {c.type.compile(dialect=postgresql.dialect())}[])")
        selected.append(expr.format(f"u.c{i}"))
    conflict = ", ".join(quote(k) for k in key)
    sets = ", ".join(
        f"{quote(c.name)} = EXCLUDED.{quote(c.name)}" for c in cols if c.name not in key
    )
    action = f"DO UPDATE SET {sets}" if update and sets else "DO NOTHING"
    aliases = ", ".join(f"c{i}" for i in range(len(cols)))
    sql = (
        f"INSERT INTO {quote(table.name)} ({names}) SELECT {', '.join(selected)}"
        f" FROM unnest({', '.join(arrays)}) AS u({aliases}) ON CONFLICT ({conflict}) {action}"
    )
    return sql, params


def _pg_column(values: list[Any], type_: Any) -> tuple[Any, str]:
    """A column as a parameter plus its SELECT expression (``{}`` stands for the column).

    Fixed-width numbers go pre-encoded (``PgArray``): psycopg would dump a list element by
    element in Python. A NULL float travels as NaN and comes back with NULLIF (the schema stores
    NaN as NULL anyway); integers with a NULL, and other types, go as plain lists.
    """
    kind = type(type_)
    if issubclass(kind, Float):
        return Float8Array(values), "NULLIF({}, 'NaN')"
    if issubclass(kind, Boolean) and None not in values:
        return BoolArray(values), "{}"
    if issubclass(kind, BigInteger) and None not in values:
        return Int8Array(values), "{}"
    if issubclass(kind, Integer) and None not in values:
        return Int4Array(values), "{}"
    return values, "{}"


# ------------------------------------------------------------------------------------------------
# Pre-encoded PostgreSQL arrays
# ------------------------------------------------------------------------------------------------


class PgArray:
    """A one-dimensional PostgreSQL array already in binary wire format.

    psycopg dumps a Python list element by element in Python (about 1 µs per element); numpy
    writes the same bytes for a whole column at once. Fixed-width element types only; a NULL
    float is sent as NaN and turned back into NULL in SQL with ``NULLIF(x, 'NaN')``.
    """

    elem_oid: ClassVar[int]
    dtype: ClassVar[str]  # numpy big-endian element dtype
    __slots__ = ("data",)

    def __init__(self, values: Any) -> None:
        arr = np.asarray(values, dtype=self.dtype)
        n = len(arr)
        if n == 0:
            self.data = struct.pack(">iiI", 0, 0, self.elem_oid)
            return
        body = np.empty(n, dtype=[("len", ">i4"), ("v", self.dtype)])
        body["len"] = arr.dtype.itemsize
        body["v"] = arr
        self.data = struct.pack(">iiIii", 1, 0, self.elem_oid, n, 1) + body.tobytes()


class Int4Array(PgArray):
    elem_oid, dtype = 23, ">i4"


class Int8Array(PgArray):
    elem_oid, dtype = 20, ">i8"


class Float8Array(PgArray):
    elem_oid, dtype = 701, ">f8"


class BoolArray(PgArray):
    elem_oid, dtype = 16, "u1"


def _array_dumper(array_oid: int) -> type[Dumper]:
    class _Dumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: Any) -> bytes:
            return obj.data

    return _Dumper


for _cls, _oid in ((Int4Array, 1007), (Int8Array, 1016), (Float8Array, 1022), (BoolArray, 1000)):
    pg_adapters.register_dumper(_cls, _array_dumper(_oid))
