"""The PostgreSQL storage strategy: columns as binary arrays through ``unnest``, index probes.

Bulk writes send each column as one pre-encoded binary array (``backend.storage.pg_arrays``)
and ``unnest`` them in SQL: one statement and one round trip whatever the batch size, with no
per-element dumping in Python. Reads of many series take one row per series (``unnest`` of
their run ids and keys) and a ``LATERAL`` subquery each, so every series is its own index
range scan in step order: no GROUP BY over every point, no bitmap heap recheck of an OR of
every range. Statements that need binary parameters or results go through the session's
psycopg connection, inside the session's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Integer,
    Table,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from backend.models import Run
from backend.storage import pg_arrays
from backend.storage.columns import RolloutColumns
from backend.storage.dialect import (
    BUCKET_FIELDS,
    BucketRange,
    Buckets,
    Dialect,
    JsonField,
    SeriesKey,
    StepRange,
    collect,
)
from backend.storage.pg_arrays import BoolArray, Float8Array, Int4Array, Int8Array

if TYPE_CHECKING:
    from backend.storage.columns import MetricColumns, RollupColumns

_METRIC_INSERT = (
    "INSERT INTO metrics (run_id, key, step, value, wall_time, seq)"
    " SELECT %(run)s, (%(keys)s::varchar[])[u.k], u.s, NULLIF(u.v, 'NaN'), u.w, %(seq)s"
    " FROM unnest(%(k)b, %(s)b, %(v)b, %(w)b) AS u(k, s, v, w)"
)
_METRIC_UPSERT = (
    _METRIC_INSERT + " ON CONFLICT (run_id, key, step) DO UPDATE SET value = EXCLUDED.value,"
    " wall_time = EXCLUDED.wall_time, seq = EXCLUDED.seq"
)
# Per key, the lowest and highest step stored: two index probes each.
_METRIC_TOP = (
    "SELECT (SELECT min(step) FROM metrics m WHERE m.run_id = %(run)s AND m.key = u.k),"
    " (SELECT max(step) FROM metrics m WHERE m.run_id = %(run)s AND m.key = u.k)"
    " FROM unnest(%(keys)s::varchar[]) WITH ORDINALITY AS u(k, i) ORDER BY u.i"
)
_METRIC_COPY = "COPY metrics (run_id, key, step, value, wall_time, seq) FROM STDIN (FORMAT BINARY)"
_ROLLOUT_COLUMNS = 'run_id, step, "group", "index", reward, score, length, truncated'
_ROLLOUT_COPY = f"COPY rollout_steps ({_ROLLOUT_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_ROLLOUT_UPSERT = (
    f"INSERT INTO rollout_steps ({_ROLLOUT_COLUMNS}) VALUES (%(run_id)s, %(step)s, %(group)s,"
    " %(index)s, %(reward)s, %(score)s, %(length)s, %(truncated)s) ON CONFLICT (run_id, step)"
    ' DO UPDATE SET "group" = EXCLUDED."group", "index" = EXCLUDED."index",'
    " reward = EXCLUDED.reward, score = EXCLUDED.score, length = EXCLUDED.length,"
    " truncated = EXCLUDED.truncated"
)
_STORED_ROLLOUTS = (
    'SELECT step, "group", "index", reward, score, length, truncated FROM rollout_steps'
    " WHERE run_id = %(run)s AND step = ANY(%(steps)s) ORDER BY step"
)
_NO_STEP = -(2**62)
# One pair per row, two index probes each; GROUP BY would read every point.
_EXTENTS_SQL = (
    "SELECT p.r, p.k,"
    " (SELECT min(step) FROM metrics m WHERE m.run_id = p.r AND m.key = p.k"
    "  AND m.step > %(first)s AND m.step <= %(last)s),"
    " (SELECT max(step) FROM metrics m WHERE m.run_id = p.r AND m.key = p.k"
    "  AND m.step > %(first)s AND m.step <= %(last)s)"
    " FROM unnest(%(rs)s::integer[], %(ks)s::text[]) AS p(r, k)"
)
# One index range scan per (series, range), in step order: no bitmap heap recheck of an OR of
# every range.
_AGG_SQL = (
    "SELECT p.r, p.k, a.* FROM unnest(%(rs)s::integer[], %(ks)s::text[], %(los)s::integer[],"
    "  %(his)s::integer[]) WITH ORDINALITY AS p(r, k, lo, hi, i)"
    " CROSS JOIN LATERAL (SELECT m.step / %(w)s AS b, count(*), avg(m.value), min(m.value),"
    "  max(m.value), max(m.step), max(m.wall_time), count(m.value) FROM metrics m"
    "  WHERE m.run_id = p.r AND m.key = p.k AND m.step BETWEEN p.lo AND p.hi"
    "  GROUP BY 1 ORDER BY 1) a"
    " ORDER BY p.i, a.b"
)
# One index range scan per series, aggregated into arrays in bucket order (no sort), fetched in
# binary so the arrays decode in C.
_CACHED_SQL = (
    "SELECT p.r, p.k, a.*"
    " FROM unnest(%(rs)s::integer[], %(ks)s::text[], %(ws)s::integer[], %(los)s::bigint[],"
    "  %(his)s::bigint[]) AS p(r, k, w, lo, hi)"
    " CROSS JOIN LATERAL (SELECT array_agg(bucket), array_agg(n),"
    "  array_agg(CASE WHEN n_valid > 0 THEN v_sum / n_valid END),"
    "  array_agg(v_min), array_agg(v_max), array_agg(last_step), array_agg(last_wall),"
    "  array_agg(n_valid)"
    "  FROM (SELECT * FROM metric_rollups m WHERE m.run_id = p.r AND m.key = p.k"
    "   AND m.width = p.w AND m.bucket >= p.lo AND m.bucket < p.hi ORDER BY m.bucket) s) a"
)
# The same aggregates, upserted as rollup rows without a trip through Python.
_STORE_ROLLUPS_SQL = (
    "INSERT INTO metric_rollups (run_id, key, width, bucket, hi_step, n, n_valid, v_sum, v_min,"
    "  v_max, last_step, last_wall)"
    " SELECT p.r, p.k, %(w)s, a.b, (a.b + 1) * %(w)s::bigint - 1, a.n, a.nv,"
    "  CASE WHEN a.nv > 0 THEN a.mean * a.nv END, a.mn, a.mx, a.ls, a.lw"
    " FROM unnest(%(rs)s::integer[], %(ks)s::text[], %(los)s::integer[], %(his)s::integer[])"
    "  AS p(r, k, lo, hi)"
    " CROSS JOIN LATERAL (SELECT m.step / %(w)s AS b, count(*) AS n, avg(m.value) AS mean,"
    "  min(m.value) AS mn, max(m.value) AS mx, max(m.step) AS ls, max(m.wall_time) AS lw,"
    "  count(m.value) AS nv FROM metrics m"
    "  WHERE m.run_id = p.r AND m.key = p.k AND m.step BETWEEN p.lo AND p.hi GROUP BY 1) a"
    " ON CONFLICT (run_id, key, width, bucket) DO UPDATE SET hi_step = EXCLUDED.hi_step,"
    "  n = EXCLUDED.n, n_valid = EXCLUDED.n_valid, v_sum = EXCLUDED.v_sum,"
    "  v_min = EXCLUDED.v_min, v_max = EXCLUDED.v_max, last_step = EXCLUDED.last_step,"
    "  last_wall = EXCLUDED.last_wall"
)
_ROLLOUT_DTYPES = (">i4", ">i4", ">f8", ">f8", ">i4", "u1")  # RolloutColumns.ARRAYS
# Rollup rows computed in Python (``backend.storage.series.RollupColumns``), as binary arrays.
_ROLLUP_UPSERT = (
    "INSERT INTO metric_rollups (run_id, key, width, bucket, hi_step, n, n_valid, v_sum, v_min,"
    "  v_max, last_step, last_wall)"
    " SELECT %(run)s, (%(keys)s::varchar[])[u.k], u.w, u.b, (u.b + 1) * u.w - 1, u.n, u.nv,"
    "  NULLIF(u.vs, 'NaN'), NULLIF(u.mn, 'NaN'), NULLIF(u.mx, 'NaN'), u.ls, u.lw"
    " FROM unnest(%(k)b, %(w)b, %(b)b, %(n)b, %(nv)b, %(vs)b, %(mn)b, %(mx)b, %(ls)b, %(lw)b)"
    "  AS u(k, w, b, n, nv, vs, mn, mx, ls, lw)"
    + _STORE_ROLLUPS_SQL[_STORE_ROLLUPS_SQL.index(" ON CONFLICT") :]
)
_ROLLUP_COPY = (
    "COPY metric_rollups (run_id, key, width, bucket, hi_step, n, n_valid, v_sum, v_min, v_max,"
    " last_step, last_wall) FROM STDIN (FORMAT BINARY)"
)
# A wider width's buckets from the narrower one's rows (the caller deletes both widths' rows of
# the keys around it: a plain INSERT skips ON CONFLICT's speculative insertion, a third of the
# statement's server time).
_DERIVE_ROLLUPS_SQL = (
    "INSERT INTO metric_rollups (run_id, key, width, bucket, hi_step, n, n_valid, v_sum, v_min,"
    "  v_max, last_step, last_wall)"
    " SELECT run_id, key, %(new)s, bucket / %(f)s, (bucket / %(f)s + 1) * %(new)s - 1, sum(n),"
    "  sum(n_valid), sum(v_sum), min(v_min), max(v_max), max(last_step), max(last_wall)"
    " FROM metric_rollups WHERE run_id = %(run)s AND width = %(old)s"
    "  AND key = ANY(%(keys)s::varchar[])"
    " GROUP BY run_id, key, bucket / %(f)s HAVING count(*) = %(f)s AND min(n) = %(old)s"
    " RETURNING key, bucket"
)
_DELETE_WIDTH_SQL = (
    "DELETE FROM metric_rollups WHERE run_id = %(run)s AND width = %(w)s"
    " AND key = ANY(%(keys)s::varchar[])"
)
_PG = postgresql.dialect()  # compiles type names and quotes identifiers of generated SQL


class PostgresDialect(Dialect):
    name = "postgresql"

    def json_field(self, column: ColumnElement[Any], names: Sequence[str]) -> JsonField:
        path = literal(list(names), postgresql.ARRAY(Text))
        node = column.op("#>", return_type=JSON)(path)
        text = column.op("#>>", return_type=Text)(path)
        kind = func.json_typeof(node)
        return JsonField(
            # the CASE keeps the cast from ever seeing a row whose field is not a number
            number=case((kind == "number", cast(text, Float))),
            text=case((kind == "string", text)),
            boolean=case((kind == "boolean", text)),
        )

    def upsert(
        self,
        session: Session,
        table: Table,
        rows: Sequence[dict[str, Any]],
        key: Sequence[str],
        *,
        update: bool = True,
    ) -> int:
        """One statement whatever the batch size: a binary array per column, ``unnest``-ed."""
        if not rows:
            return 0
        sql, params = _unnest_upsert(table, rows, key, update)
        # Binary parameters skip the text-array quoting that otherwise dominates the cost of
        # large batches.
        with _raw_cursor(session) as cur:
            cur.execute(sql, params, binary=True)
        return len(rows)

    def write_metrics(
        self, session: Session, run_id: int, seq: int, m: MetricColumns
    ) -> dict[str, tuple[int, int]]:
        with _raw_cursor(session) as cur:
            # Planned each time (prepare=False): a generic plan made while the table was small
            # can stick to a sequential scan as the table grows.
            cur.execute(_METRIC_TOP, {"run": run_id, "keys": m.keys}, prepare=False)
            before = {
                k: (lo, hi) for k, (lo, hi) in zip(m.keys, cur, strict=True) if hi is not None
            }
            top = np.array([before.get(k, (0, _NO_STEP))[1] for k in m.keys], dtype=np.int64)
            fresh = m.step > top[m.k]  # no stored row can collide with these
            _insert_parts(
                cur,
                partial(_copy_metrics, cur, run_id, seq, m),
                partial(_upsert_metrics, cur, run_id, seq, m),
                fresh,
            )
        return before

    def write_rollouts(self, session: Session, run_id: int, r: RolloutColumns) -> int:
        with _raw_cursor(session) as cur:
            cur.execute(
                "SELECT max(step) FROM rollout_steps WHERE run_id = %(run)s",
                {"run": run_id},
                prepare=False,
            )
            top = cur.fetchone()[0]
            fresh = r.step > (_NO_STEP if top is None else top)
            _insert_parts(
                cur,
                partial(_copy_rollouts, cur, run_id, r),
                partial(_upsert_rollouts, cur, run_id, r),
                fresh,
            )
        return len(r.step)

    def advance_run(
        self, session: Session, run_id: int, last_step: int, last_values: dict[str, float | None]
    ) -> dict[str, Any]:
        # In the UPDATE itself: jsonb || merges the summary, CASE keeps a run that is ahead.
        merged = cast(
            cast(Run.summary, JSONB).op("||")(
                cast(bindparam("new_summary", json.dumps(last_values)), JSONB)
            ),
            JSON,
        )
        return {
            "step": case((Run.step <= last_step, last_step), else_=Run.step),
            "summary": case((Run.step <= last_step, merged), else_=Run.summary),
        }

    def extents(
        self, session: Session, run_ids: Sequence[int], keys: Sequence[str], first: int, last: int
    ) -> dict[SeriesKey, tuple[int, int]]:
        pairs = [(r, k) for r in run_ids for k in keys]
        params = {"rs": [p[0] for p in pairs], "ks": [p[1] for p in pairs]}
        with _raw_cursor(session) as cur:
            # Planned each time (prepare=False): every write asks it, and a generic plan made
            # while the table was small can stick to a sequential scan as the table grows.
            cur.execute(_EXTENTS_SQL, {**params, "first": first, "last": last}, prepare=False)
            return {(r, k): (lo, hi) for r, k, lo, hi in cur if lo is not None}

    def aggregate(
        self, session: Session, width: int, ranges: Sequence[StepRange]
    ) -> dict[SeriesKey, Buckets]:
        rs, ks, los, his = (list(c) for c in zip(*ranges, strict=True))
        out: dict[SeriesKey, Buckets] = {}
        with _raw_cursor(session) as cur:
            params = {"rs": rs, "ks": ks, "los": los, "his": his, "w": width}
            cur.execute(_AGG_SQL, params, binary=True)
            collect(out, cur.fetchall())
        return out

    def store_rollups(self, session: Session, width: int, ranges: Sequence[StepRange]) -> None:
        rs, ks, los, his = (list(c) for c in zip(*ranges, strict=True))
        with _raw_cursor(session) as cur:
            params = {"rs": rs, "ks": ks, "los": los, "his": his, "w": width}
            cur.execute(_STORE_ROLLUPS_SQL, params, prepare=False)

    def derive_rollups(
        self, session: Session, run_id: int, keys: Sequence[str], old: int, new: int
    ) -> set[tuple[str, int]]:
        params = {"run": run_id, "keys": list(keys), "old": old, "new": new, "f": new // old}
        with _raw_cursor(session) as cur:
            # Rows a reader cached at the new width go first (the rest of refresh_rollups
            # recomputes any bucket not derived); the caller holds the run row's lock, so no
            # reader adds one meanwhile.
            cur.execute(_DELETE_WIDTH_SQL, params | {"w": new}, prepare=False)
            cur.execute(_DERIVE_ROLLUPS_SQL, params, prepare=False)
            derived = set(cur.fetchall())  # one C-level fetch: thousands of rows
            cur.execute(_DELETE_WIDTH_SQL, params | {"w": old}, prepare=False)
        return derived

    def write_rollups(self, session: Session, run_id: int, rollups: RollupColumns) -> None:
        # The caller's rows are buckets past every stored one (see refresh_rollups): COPY,
        # with the upsert should one exist anyway.
        with _raw_cursor(session) as cur:
            _insert_parts(
                cur,
                partial(_copy_rollups, cur, run_id, rollups),
                partial(_upsert_rollups, cur, run_id, rollups),
                np.ones(len(rollups.k), dtype=bool),
            )

    def cached_buckets(
        self, session: Session, ranges: Sequence[BucketRange]
    ) -> dict[SeriesKey, Buckets]:
        rs, ks, ws, los, his = (list(c) for c in zip(*ranges, strict=True))
        params = {"rs": rs, "ks": ks, "ws": ws, "los": los, "his": his}
        out: dict[SeriesKey, Buckets] = {}
        with _raw_cursor(session, binary=True) as cur:
            cur.execute(_CACHED_SQL, params)
            for run_id, key, *arrays in cur.fetchall():
                if arrays[0] is not None:
                    out[(run_id, key)] = dict(zip(BUCKET_FIELDS, arrays, strict=True))
        return out


def _insert_parts(
    cur: Any, insert: Callable[[Any], None], upsert: Callable[[Any], None], fresh: Any
) -> None:
    """``insert`` (a ``COPY``) of the ``fresh`` rows, ``upsert`` (INSERT … ON CONFLICT) of the
    rest; each takes a boolean mask of the rows.

    COPY inserts a page of rows at a time (one WAL record each) and skips the speculative
    insertion of ON CONFLICT: well under half the server time of an upsert from ``unnest``. It
    is safe because the caller holds the run row's lock (every writer takes it first), so no
    other transaction can add a row above the probed top step meanwhile; should a row collide
    anyway, the savepoint rolls the COPY back and the rows are upserted instead.
    """
    old = ~fresh
    if old.any():
        upsert(old)
    if fresh.any():
        try:
            with cur.connection.transaction():  # a savepoint inside the session's transaction
                insert(fresh)
        except psycopg.errors.UniqueViolation:
            upsert(fresh)


# The COPY and upsert of each table's rows, ``rows`` a boolean mask of the columns' rows. COPY
# sends each row whole (``pg_arrays.copy_rows``), the upsert a binary array per column.


def _copy(cur: Any, sql: str, rows: Any, fields: list[tuple[str, Any]]) -> None:
    with cur.copy(sql) as pipe:
        pipe.write(pg_arrays.copy_rows(int(rows.sum()), fields))


def _copy_metrics(cur: Any, run_id: int, seq: int, m: MetricColumns, rows: Any) -> None:
    fields = [(">i4", run_id), ("text", (m.k[rows], m.keys)), (">i4", m.step[rows])]
    fields += [(">f8", m.value[rows]), (">f8", m.wall[rows]), (">i8", seq)]
    _copy(cur, _METRIC_COPY, rows, fields)


def _upsert_metrics(cur: Any, run_id: int, seq: int, m: MetricColumns, rows: Any) -> None:
    # PostgreSQL arrays are 1-based: k + 1 indexes the keys array.
    params = {"run": run_id, "keys": m.keys, "seq": seq, "k": Int4Array(m.k[rows] + 1)}
    params |= {"s": Int4Array(m.step[rows]), "v": Float8Array(m.value[rows])}
    cur.execute(_METRIC_UPSERT, params | {"w": Float8Array(m.wall[rows])})


def _copy_rollouts(cur: Any, run_id: int, r: RolloutColumns, rows: Any) -> None:
    """A row per step, the step's rollouts as arrays."""
    part = r.take(rows)
    bounds = part.step_bounds()
    fields = [(">i4", run_id), (">i4", part.step[bounds[:-1]])]
    arrays = [(dt, getattr(part, n)) for dt, n in zip(_ROLLOUT_DTYPES, part.ARRAYS, strict=True)]
    data = pg_arrays.copy_array_rows(bounds, fields, arrays)
    with cur.copy(_ROLLOUT_COPY) as pipe:
        pipe.write(data)


def _upsert_rollouts(cur: Any, run_id: int, r: RolloutColumns, rows: Any) -> None:
    """The steps' rows rewritten whole: their stored rollouts that ``r`` does not replace, and
    ``r``'s (a step is one row, so a rollout added to a stored step is a read and a rewrite)."""
    part = r.take(rows)
    cur.execute(_STORED_ROLLOUTS, {"run": run_id, "steps": np.unique(part.step).tolist()})
    merged = part.over(RolloutColumns.from_step_rows(cur.fetchall()))
    cur.executemany(_ROLLOUT_UPSERT, merged.step_rows(run_id))


def _copy_rollups(cur: Any, run_id: int, r: RollupColumns, rows: Any) -> None:
    fields = [(">i4", run_id), ("text", (r.k[rows], r.keys)), (">i4", r.width[rows])]
    fields += [(">i8", r.bucket[rows]), (">i8", (r.bucket[rows] + 1) * r.width[rows] - 1)]
    fields += [(">i4", r.n[rows]), (">i4", r.n_valid[rows])]
    fields += [(">f8", getattr(r, name)[rows]) for name in ("v_sum", "v_min", "v_max")]
    fields += [(">i4", r.last_step[rows]), (">f8", r.last_wall[rows])]
    _copy(cur, _ROLLUP_COPY, rows, fields)


def _upsert_rollups(cur: Any, run_id: int, r: RollupColumns, rows: Any) -> None:
    params = {
        "run": run_id, "keys": r.keys, "k": Int4Array(r.k[rows] + 1),
        "w": Int4Array(r.width[rows]), "b": Int8Array(r.bucket[rows]), "n": Int4Array(r.n[rows]),
        "nv": Int4Array(r.n_valid[rows]), "vs": Float8Array(r.v_sum[rows]),
        "mn": Float8Array(r.v_min[rows]), "mx": Float8Array(r.v_max[rows]),
        "ls": Int4Array(r.last_step[rows]), "lw": Float8Array(r.last_wall[rows]),
    }  # fmt: skip
    cur.execute(_ROLLUP_UPSERT, params)


@contextmanager
def _raw_cursor(session: Session, *, binary: bool = False) -> Iterator[Any]:
    """A psycopg cursor on the session's connection and transaction, able to send ``PgArray``s."""
    pooled = session.connection().connection
    dbapi: Any = pooled.dbapi_connection
    if "pg_arrays" not in pooled.info:  # once per DBAPI connection (the pool keeps ``info``)
        pg_arrays.register(dbapi.adapters)
        pooled.info["pg_arrays"] = True
    with dbapi.cursor(binary=binary) as cur:
        yield cur


def _unnest_upsert(
    table: Table, rows: Sequence[dict[str, Any]], key: Sequence[str], update: bool
) -> tuple[str, dict[str, Any]]:
    quote = _PG.identifier_preparer.quote
    cols = list(table.columns)
    names = ", ".join(quote(c.name) for c in cols)
    arrays, selected, params = [], [], {}
    for i, c in enumerate(cols):
        param, expr = _column([row.get(c.name) for row in rows], c.type)
        params[f"a{i}"] = param
        # A JSON column travels as text, each element cast to JSON in the SELECT (_column).
        element = "TEXT" if isinstance(c.type, JSON) else c.type.compile(dialect=_PG)
        arrays.append(f"CAST(%(a{i})b AS {element}[])")
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


def _column(values: list[Any], type_: Any) -> tuple[Any, str]:
    """A column as a parameter plus its SELECT expression (``{}`` stands for the column).

    Fixed-width numbers go pre-encoded (``PgArray``): psycopg would dump a list element by
    element in Python. A NULL float travels as NaN and comes back with NULLIF (the schema stores
    NaN as NULL anyway); integers with a NULL, and other types, go as plain lists; JSON as text.
    """
    kind = type(type_)
    if issubclass(kind, JSON):  # psycopg adapts no dict: each value as its JSON text, None NULL
        cast_to = type_.compile(dialect=_PG)
        return [None if v is None else json.dumps(v) for v in values], f"CAST({{}} AS {cast_to})"
    if issubclass(kind, Float):
        return Float8Array(values), "NULLIF({}, 'NaN')"
    if issubclass(kind, Boolean) and None not in values:
        return BoolArray(values), "{}"
    if issubclass(kind, BigInteger) and None not in values:
        return Int8Array(values), "{}"
    if issubclass(kind, Integer) and None not in values:
        return Int4Array(values), "{}"
    return values, "{}"
