"""Metric and rollout storage: idempotent bulk writes and server-side downsampled reads.

Writes are ``INSERT … ON CONFLICT DO UPDATE`` on (run_id, key, step) and (run_id, step, group,
index), so a redelivered job or a retried client batch overwrites instead of duplicating. Reads
bucket in SQL: a series with more than ``max_points`` points is grouped into ``max_points``
equal step ranges, each reporting its last step, mean, min and max (spikes survive sampling).
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import (
    JSON,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from backend.db import BoolArray, Float8Array, Int4Array, PgArray, insert_ignore, upsert
from backend.models import (
    MAX_ABS_VALUE,
    Metric,
    MetricRollup,
    Rollout,
    Run,
    RunStatus,
    finite,
    utcnow,
)
from backend.schemas import INT32_MAX

METRICS: Table = Metric.__table__  # type: ignore[assignment]
ROLLOUTS: Table = Rollout.__table__  # type: ignore[assignment]
ROLLUPS: Table = MetricRollup.__table__  # type: ignore[assignment]
METRIC_KEY = ("run_id", "key", "step")
ROLLOUT_KEY = ("run_id", "step", "group", "index")
ROLLUP_KEY = ("run_id", "key", "width", "bucket")


@dataclass
class StepPoints:
    """One step's metrics as written by the DB sink or the external logging endpoint.

    ``rollouts``: that step's sampled rollouts, any objects with ``group``, ``index``,
    ``reward``, ``score``, ``length`` and ``truncated`` (``conspo.sink.RolloutRecord`` is one).
    """

    step: int
    metrics: Mapping[str, float | None]
    wall_time: float | None = None
    rollouts: Sequence[Any] = ()


@dataclass
class RolloutPoint:
    step: int
    group: int
    index: int
    reward: float | None
    score: float | None
    length: int
    truncated: bool


@dataclass
class Written:
    points: int = 0
    rollouts: int = 0
    last_step: int | None = None
    last_values: dict[str, float | None] = field(default_factory=dict)
    owned: bool = True
    seq: int | None = None  # the run's write_seq given to these points


def write_points(
    session: Session,
    run_id: int,
    steps: Sequence[StepPoints],
    rollouts: Iterable[RolloutPoint] = (),
    *,
    owner_attempt: int | None = None,
    run_values: dict[str, Any] | None = None,
) -> Written:
    """Upsert metrics and rollouts; move the run's step, summary and ``run_values`` along.

    A handful of statements whatever the batch size (the caller commits):

    1. one UPDATE of the run: step only moves forward, the summary keeps each key's value at
       the highest step, ``write_seq`` goes up by one and every point written gets it as its
       ``seq``. It locks the run row, so writes of one run are serialised (and ``seq`` follows
       commit order). With ``owner_attempt`` only while that attempt still owns the running
       run; else nothing is written and ``owned`` is False.
    2. one DELETE of the rollup-cache rows the new points fall into;
    3. the metric and rollout rows: on PostgreSQL, rows above the highest step already stored
       for their key (every row, in a run that only moves forward) go in with a plain INSERT,
       the others with INSERT … ON CONFLICT DO UPDATE; columns travel as binary arrays.

    A (key, step) or (step, group, index) given twice keeps its last value. Columns are built
    with numpy: the per-point Python work is a list extend.
    """
    out = Written()
    m = _metric_columns(steps)
    r = _rollout_columns(steps, rollouts)
    if steps:
        out.last_step = max(s.step for s in steps)
    if len(m.step):
        ends = np.flatnonzero(np.append(m.k[1:] != m.k[:-1], True))  # last row of each key
        out.last_values = {
            m.keys[k]: _none_if_nan(v)
            for k, v in zip(m.k[ends].tolist(), m.value[ends].tolist(), strict=True)
        }
    seq = _update_run(session, run_id, out, owner_attempt, run_values or {})
    if seq is None:
        out.owned = False
        return out
    out.seq = seq
    if len(m.step):
        session.execute(
            delete(MetricRollup).where(
                MetricRollup.run_id == run_id, MetricRollup.hi_step >= int(m.step.min())
            )
        )
    if session.get_bind().dialect.name == "postgresql":
        out.points = _pg_write_metrics(session, run_id, seq, m)
        out.rollouts = _pg_write_rollouts(session, run_id, r)
        return out
    keys = m.keys
    metric_rows = [
        {"run_id": run_id, "key": keys[k], "step": st, "value": _none_if_nan(v), "wall_time": w}
        | {"seq": seq}
        for k, st, v, w in zip(
            m.k.tolist(), m.step.tolist(), m.value.tolist(), m.wall.tolist(), strict=True
        )
    ]
    out.points = upsert(session, METRICS, metric_rows, METRIC_KEY)
    rollout_rows = [
        {
            "run_id": run_id,
            "step": st,
            "group": g,
            "index": i,
            "reward": _none_if_nan(rw),
            "score": _none_if_nan(sc),
            "length": ln,
            "truncated": bool(tr),
        }
        for st, g, i, rw, sc, ln, tr in zip(*(c.tolist() for c in r.columns()), strict=True)
    ]
    out.rollouts = upsert(session, ROLLOUTS, rollout_rows, ROLLOUT_KEY)
    return out


@dataclass
class _MetricColumns:
    """Points sorted by (key, step), one per (key, step); NULL values as NaN."""

    keys: list[str]  # sorted; ``k`` indexes it
    k: Any  # (n,) int32
    step: Any  # (n,) int64
    value: Any  # (n,) float64
    wall: Any  # (n,) float64


@dataclass
class _RolloutColumns:
    """Rows sorted by (step, group, index), one per key; NULL reward/score as NaN."""

    step: Any
    group: Any
    index: Any
    reward: Any
    score: Any
    length: Any
    truncated: Any

    def columns(self) -> tuple[Any, ...]:
        return (
            self.step, self.group, self.index, self.reward, self.score, self.length,
            self.truncated,
        )  # fmt: skip


def _none_if_nan(v: float) -> float | None:
    return None if v != v else v


def _finite_array(values: list[Any]) -> Any:
    """float64 array with None, NaN, ±Inf and |x| > MAX_ABS_VALUE as NaN (stored as NULL)."""
    arr = np.array(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        arr[~(np.abs(arr) <= MAX_ABS_VALUE)] = np.nan
    return arr


def _last_unique(*sort_keys: Any) -> Any:
    """Indices that sort by ``sort_keys`` (most significant first), keeping the last of equals."""
    n = len(sort_keys[0])
    order = np.lexsort((np.arange(n), *reversed(sort_keys)))
    if n <= 1:
        return order
    keep = np.ones(n, dtype=bool)
    same = np.ones(n - 1, dtype=bool)
    for key in sort_keys:
        sk = key[order]
        same &= sk[1:] == sk[:-1]
    keep[:-1] = ~same  # a row followed by an equal one is superseded by it
    return order[keep]


def _metric_columns(steps: Sequence[StepPoints]) -> _MetricColumns:
    now = time.time()
    key_col: list[str] = []
    value_col: list[Any] = []
    step_col: list[int] = []
    wall_col: list[float] = []
    for s in steps:
        n = len(s.metrics)
        if not n:
            continue
        wall = s.wall_time if s.wall_time is not None and finite(s.wall_time) is not None else now
        key_col.extend(s.metrics.keys())
        value_col.extend(s.metrics.values())
        step_col.extend([s.step] * n)
        wall_col.extend([wall] * n)
    slot: dict[str, int] = {}
    codes = np.fromiter(
        (slot.setdefault(k, len(slot)) for k in key_col), dtype=np.int32, count=len(key_col)
    )
    keys = sorted(slot)
    rank = np.empty(len(slot), dtype=np.int32)
    rank[[slot[k] for k in keys]] = np.arange(len(keys), dtype=np.int32)
    k = rank[codes]
    step = np.asarray(step_col, dtype=np.int64)
    pick = _last_unique(k, step)
    return _MetricColumns(
        keys,
        k[pick],
        step[pick],
        _finite_array(value_col)[pick],
        np.asarray(wall_col, dtype=np.float64)[pick],
    )


_ROLLOUT_FIELDS = operator.attrgetter("group", "index", "reward", "score", "length", "truncated")


def _rollout_columns(steps: Sequence[StepPoints], extra: Iterable[RolloutPoint]) -> _RolloutColumns:
    rows: list[tuple[Any, ...]] = []
    step_col: list[int] = []
    for s in steps:
        if s.rollouts:
            rows.extend(map(_ROLLOUT_FIELDS, s.rollouts))
            step_col.extend([s.step] * len(s.rollouts))
    for r in extra:
        rows.append(_ROLLOUT_FIELDS(r))
        step_col.append(r.step)
    table = np.array(rows, dtype=np.float64).reshape(-1, 6)  # None -> NaN
    step = np.asarray(step_col, dtype=np.int64)
    group, index = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    pick = _last_unique(step, group, index)
    with np.errstate(invalid="ignore"):
        for col in (2, 3):  # reward, score: as metric values
            table[~(np.abs(table[:, col]) <= MAX_ABS_VALUE), col] = np.nan
    return _RolloutColumns(
        step[pick],
        group[pick],
        index[pick],
        table[pick, 2],
        table[pick, 3],
        table[pick, 4].astype(np.int64),
        table[pick, 5] != 0,
    )


_PG_METRIC_INSERT = (
    "INSERT INTO metrics (run_id, key, step, value, wall_time, seq)"
    " SELECT %(run)s, (%(keys)s::varchar[])[u.k], u.s, NULLIF(u.v, 'NaN'), u.w, %(seq)s"
    " FROM unnest(%(k)b, %(s)b, %(v)b, %(w)b) AS u(k, s, v, w)"
)
_PG_METRIC_UPSERT = (
    _PG_METRIC_INSERT + " ON CONFLICT (run_id, key, step) DO UPDATE SET value = EXCLUDED.value,"
    " wall_time = EXCLUDED.wall_time, seq = EXCLUDED.seq"
)
# Per key, the highest step stored: one index probe each.
_PG_METRIC_TOP = (
    "SELECT (SELECT max(step) FROM metrics m WHERE m.run_id = %(run)s AND m.key = u.k)"
    " FROM unnest(%(keys)s::varchar[]) WITH ORDINALITY AS u(k, i) ORDER BY u.i"
)
_PG_ROLLOUT_INSERT = (
    'INSERT INTO rollouts (run_id, step, "group", "index", reward, score, length, truncated)'
    " SELECT %(run)s, u.s, u.g, u.i, NULLIF(u.rw, 'NaN'), NULLIF(u.sc, 'NaN'), u.l, u.t"
    " FROM unnest(%(s)b, %(g)b, %(i)b, %(rw)b, %(sc)b, %(l)b, %(t)b) AS u(s, g, i, rw, sc, l, t)"
)
_PG_ROLLOUT_UPSERT = (
    _PG_ROLLOUT_INSERT + ' ON CONFLICT (run_id, step, "group", "index") DO UPDATE SET'
    " reward = EXCLUDED.reward, score = EXCLUDED.score, length = EXCLUDED.length,"
    " truncated = EXCLUDED.truncated"
)
_NO_STEP = -(2**62)


def _pg_write_metrics(session: Session, run_id: int, seq: int, m: _MetricColumns) -> int:
    if not len(m.step):
        return 0
    # PostgreSQL arrays are 1-based: k + 1 indexes the keys array.
    cols = {"k": m.k + 1, "s": m.step, "v": m.value, "w": m.wall}
    kinds = {"k": Int4Array, "s": Int4Array, "v": Float8Array, "w": Float8Array}
    with _raw_cursor(session) as cur:
        # Planned each time (prepare=False): a generic plan made while the table was small can
        # stick to a sequential scan as the table grows.
        cur.execute(_PG_METRIC_TOP, {"run": run_id, "keys": m.keys}, prepare=False)
        top = np.array([_NO_STEP if row[0] is None else row[0] for row in cur], dtype=np.int64)
        fresh = m.step > top[m.k]  # no stored row can collide with these
        _pg_insert_parts(
            cur, _PG_METRIC_INSERT, _PG_METRIC_UPSERT, cols, kinds, fresh,
            {"run": run_id, "keys": m.keys, "seq": seq},
        )  # fmt: skip
    return len(m.step)


def _pg_write_rollouts(session: Session, run_id: int, r: _RolloutColumns) -> int:
    if not len(r.step):
        return 0
    cols = dict(zip(("s", "g", "i", "rw", "sc", "l", "t"), r.columns(), strict=True))
    kinds = {
        "s": Int4Array, "g": Int4Array, "i": Int4Array, "rw": Float8Array, "sc": Float8Array,
        "l": Int4Array, "t": BoolArray,
    }  # fmt: skip
    with _raw_cursor(session) as cur:
        cur.execute(
            "SELECT max(step) FROM rollouts WHERE run_id = %(run)s", {"run": run_id}, prepare=False
        )
        top = cur.fetchone()[0]
        fresh = r.step > (_NO_STEP if top is None else top)
        _pg_insert_parts(
            cur, _PG_ROLLOUT_INSERT, _PG_ROLLOUT_UPSERT, cols, kinds, fresh, {"run": run_id}
        )
    return len(r.step)


def _pg_insert_parts(
    cur: Any,
    insert_sql: str,
    upsert_sql: str,
    cols: dict[str, Any],
    kinds: dict[str, type[PgArray]],
    fresh: Any,
    params: dict[str, Any],
) -> None:
    """Plain INSERT of the ``fresh`` rows, INSERT … ON CONFLICT of the rest.

    A plain INSERT skips the speculative insertion of ON CONFLICT (about half the cost). It is
    safe because the caller holds the run row's lock (every writer takes it first), so no other
    transaction can add a row above the probed top step meanwhile; should a row collide anyway,
    the savepoint rolls the INSERT back and the rows are upserted instead.
    """

    def part(mask: Any) -> dict[str, Any]:
        return {**params, **{name: kinds[name](col[mask]) for name, col in cols.items()}}

    old = ~fresh
    if old.any():
        cur.execute(upsert_sql, part(old))
    if fresh.any():
        try:
            with cur.connection.transaction():  # a savepoint inside the session's transaction
                cur.execute(insert_sql, part(fresh))
        except psycopg.errors.UniqueViolation:
            cur.execute(upsert_sql, part(fresh))


@contextmanager
def _raw_cursor(session: Session) -> Iterator[Any]:
    """A psycopg cursor on the session's connection and transaction."""
    dbapi = session.connection().connection.dbapi_connection
    with dbapi.cursor() as cur:  # type: ignore[union-attr]
        yield cur


def _update_run(
    session: Session,
    run_id: int,
    out: Written,
    owner_attempt: int | None,
    values: dict[str, Any],
) -> int | None:
    """The run's new ``write_seq``, or None when the run is gone (or not owned)."""
    stmt = update(Run).where(Run.id == run_id)
    if owner_attempt is not None:
        stmt = stmt.where(Run.attempt == owner_attempt, Run.status == RunStatus.running)
    values = {"updated_at": utcnow(), "write_seq": Run.write_seq + 1, **values}
    last = out.last_step
    if last is not None and session.get_bind().dialect.name == "postgresql":
        merged = cast(
            cast(Run.summary, JSONB).op("||")(
                cast(bindparam("new_summary", json.dumps(out.last_values)), JSONB)
            ),
            JSON,
        )
        values["step"] = case((Run.step <= last, last), else_=Run.step)
        values["summary"] = case((Run.step <= last, merged), else_=Run.summary)
    elif last is not None:  # SQLite: read-modify-write inside the same (locked) transaction
        current = session.execute(select(Run.step, Run.summary).where(Run.id == run_id)).first()
        if current is not None and last >= current.step:
            values["step"] = last
            values["summary"] = {**(current.summary or {}), **out.last_values}
    return session.execute(stmt.values(**values).returning(Run.write_seq)).scalar()


# ------------------------------------------------------------------------------------------------
# Reads
# ------------------------------------------------------------------------------------------------


def empty_series() -> dict[str, Any]:
    return {
        "steps": [],
        "values": [],
        "min": [],
        "max": [],
        "wall_time": [],
        "sampled": False,
        "total_points": 0,
    }


def metric_keys(session: Session, run_id: int) -> list[str]:
    stmt = select(Metric.key).where(Metric.run_id == run_id).distinct().order_by(Metric.key)
    return list(session.scalars(stmt))


def query_series(
    session: Session,
    run_ids: Sequence[int],
    keys: Sequence[str],
    max_points: int,
    since_step: int | None = None,
    step_max: int | None = None,
) -> dict[int, dict[str, dict[str, Any]]]:
    """``{run_id: {key: Series}}`` for every requested pair (empty series where none exist).

    Only steps in (``since_step``, ``step_max``] count; the two page through raw points.

    1. Extents: first and last step of each series (index probes on PostgreSQL).
    2. A series whose step span fits in ``max_points`` is read raw.
    3. A longer one is bucketed by step into aligned buckets of width ``w`` (the smallest power of
       two giving at most ``max_points`` buckets). Complete buckets come from ``metric_rollups``
       when cached; missing ones and the two edge buckets are aggregated from ``metrics`` in SQL,
       and the complete ones are cached for the next reader.
    4. A bucketed series that turns out to hold no more than ``max_points`` points (sparse
       steps) is read raw instead, so ``sampled`` is true exactly when points were merged.
    """
    out: dict[int, dict[str, dict[str, Any]]] = {
        r: {k: empty_series() for k in keys} for r in run_ids
    }
    first = -1 if since_step is None else since_step
    last = INT32_MAX if step_max is None else step_max
    # Each run's write_seq before any point is read: buckets are cached only for runs that no
    # write has touched since (see _cache_rollups).
    seen = dict(session.execute(select(Run.id, Run.write_seq).where(Run.id.in_(run_ids))).all())
    extents = _extents(session, run_ids, keys, first, last)
    raw: list[tuple[int, str]] = []
    plans: list[_Plan] = []
    for (run_id, key), (lo, hi) in extents.items():
        if hi - lo + 1 <= max_points:
            raw.append((run_id, key))
        else:
            plans.append(_Plan.make(run_id, key, lo, hi, first, max_points))
    for plan in _bucketize(session, plans, seen):
        total = sum(plan.cols["n"])
        if total <= max_points:
            raw.append((plan.run_id, plan.key))
            continue
        out[plan.run_id][plan.key] = {
            "steps": plan.cols["last_step"],
            "values": plan.cols["mean"],  # means of stored (finite, |x| <= 1e290) values
            "min": plan.cols["v_min"],
            "max": plan.cols["v_max"],
            "wall_time": plan.cols["last_wall"],
            "sampled": True,
            "total_points": total,
        }
    for run_id, key, step, value, wall in _raw_points(session, raw, first, last):
        s = out[run_id][key]
        s["steps"].append(step)
        s["values"].append(value)
        s["min"].append(value)
        s["max"].append(value)
        s["wall_time"].append(wall)
        s["total_points"] += 1
    return out


def _extents(
    session: Session, run_ids: Sequence[int], keys: Sequence[str], first: int, last: int
) -> dict[tuple[int, str], tuple[int, int]]:
    """(run_id, key) -> (first, last step in (``first``, ``last``]) for the series with points."""
    if not run_ids or not keys:
        return {}
    if session.get_bind().dialect.name == "postgresql":
        # One pair per row, two index probes each; GROUP BY would read every point.
        pairs = [(r, k) for r in run_ids for k in keys]
        stmt = text(
            "SELECT p.r, p.k,"
            " (SELECT min(step) FROM metrics m WHERE m.run_id = p.r AND m.key = p.k"
            "  AND m.step > :first AND m.step <= :last),"
            " (SELECT max(step) FROM metrics m WHERE m.run_id = p.r AND m.key = p.k"
            "  AND m.step > :first AND m.step <= :last)"
            " FROM unnest(CAST(:rs AS integer[]), CAST(:ks AS text[])) AS p(r, k)"
        )
        rows = session.execute(
            stmt,
            {
                "rs": [p[0] for p in pairs],
                "ks": [p[1] for p in pairs],
                "first": first,
                "last": last,
            },
        )
    else:
        rows = session.execute(
            select(Metric.run_id, Metric.key, func.min(Metric.step), func.max(Metric.step))
            .where(
                Metric.run_id.in_(list(run_ids)),
                Metric.key.in_(list(keys)),
                Metric.step > first,
                Metric.step <= last,
            )
            .group_by(Metric.run_id, Metric.key)
        )
    return {(r, k): (lo, hi) for r, k, lo, hi in rows if lo is not None}


BUCKET_FIELDS = ("bucket", "n", "mean", "v_min", "v_max", "last_step", "last_wall", "n_valid")


@dataclass
class _Plan:
    """How one long series is read: aligned buckets of ``width`` steps, ``b_lo``..``b_hi``."""

    run_id: int
    key: str
    width: int
    first: int  # points have step > first
    hi: int  # last step
    b_lo: int
    b_hi: int  # the bucket holding `hi` (never cached: it may still grow)
    # Column-oriented buckets, in bucket order: one list per BUCKET_FIELDS name.
    cols: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def make(cls, run_id: int, key: str, lo: int, hi: int, first: int, max_points: int) -> _Plan:
        width = 2
        while hi // width - lo // width + 1 > max_points:
            width *= 2
        return cls(run_id, key, width, first, hi, lo // width, hi // width)

    @property
    def cache_lo(self) -> int:
        """First cacheable bucket: one that the since_step cursor does not cut."""
        return self.b_lo if self.b_lo * self.width > self.first else self.b_lo + 1

    def cacheable(self, bucket: int) -> bool:
        return self.cache_lo <= bucket < self.b_hi


_PG_AGG_SQL = (
    "SELECT p.r, p.k, a.* FROM unnest(%(rs)s::integer[], %(ks)s::text[], %(los)s::integer[],"
    "  %(his)s::integer[]) WITH ORDINALITY AS p(r, k, lo, hi, i)"
    " CROSS JOIN LATERAL (SELECT m.step / %(w)s AS b, count(*), avg(m.value), min(m.value),"
    "  max(m.value), max(m.step), max(m.wall_time), count(m.value) FROM metrics m"
    "  WHERE m.run_id = p.r AND m.key = p.k AND m.step BETWEEN p.lo AND p.hi"
    "  GROUP BY 1 ORDER BY 1) a"
    " ORDER BY p.i, a.b"
)


def _bucketize(session: Session, plans: list[_Plan], seen: dict[int, int]) -> list[_Plan]:
    """Fill each plan's buckets from the rollup cache plus SQL aggregates of what is missing."""
    if not plans:
        return plans
    cached = _cached_buckets(session, plans)
    missing: dict[int, list[tuple[int, str, int, int]]] = {}  # width -> (run, key, lo, hi)
    for p in plans:
        have = cached.get((p.run_id, p.key))
        have_set = set(have["bucket"]) if have else set()
        for start, end in _missing_ranges(p, have_set):
            missing.setdefault(p.width, []).append(
                (p.run_id, p.key, max(start * p.width, p.first + 1), min(end * p.width - 1, p.hi))
            )
    fresh: dict[tuple[int, str], dict[str, list[Any]]] = {}
    if session.get_bind().dialect.name == "postgresql":
        # One index range scan per (series, range), in step order: no bitmap heap recheck of
        # an OR of every range.
        with _raw_cursor(session) as cur:
            for width, ranges in missing.items():
                rs, ks, los, his = (list(c) for c in zip(*ranges, strict=True))
                params = {"rs": rs, "ks": ks, "los": los, "his": his, "w": width}
                cur.execute(_PG_AGG_SQL, params, binary=True)
                for run_id, key, *agg in cur.fetchall():
                    cols = fresh.setdefault((run_id, key), {f: [] for f in BUCKET_FIELDS})
                    for name, value in zip(BUCKET_FIELDS, agg, strict=True):
                        cols[name].append(value)
        missing = {}
    for width, ranges in missing.items():
        conds = [
            and_(Metric.run_id == r, Metric.key == k, Metric.step.between(lo, hi))
            for r, k, lo, hi in ranges
        ]
        bucket = (Metric.step // width).label("b")
        n_valid = func.count(Metric.value)
        for chunk in _chunks(conds, 200):
            stmt = (
                select(
                    Metric.run_id,
                    Metric.key,
                    bucket,
                    func.count(),
                    func.avg(Metric.value),
                    func.min(Metric.value),
                    func.max(Metric.value),
                    func.max(Metric.step),
                    func.max(Metric.wall_time),
                    n_valid,
                )
                .where(or_(*chunk))
                .group_by(Metric.run_id, Metric.key, bucket)
                .order_by(Metric.run_id, Metric.key, bucket)
            )
            for run_id, key, *agg in session.execute(stmt):
                cols = fresh.setdefault((run_id, key), {f: [] for f in BUCKET_FIELDS})
                for name, value in zip(BUCKET_FIELDS, agg, strict=True):
                    cols[name].append(value)
    to_cache: list[dict[str, Any]] = []
    for p in plans:
        old = cached.get((p.run_id, p.key)) or {f: [] for f in BUCKET_FIELDS}
        new = fresh.get((p.run_id, p.key)) or {f: [] for f in BUCKET_FIELDS}
        p.cols = _merge(old, new)
        for i, b in enumerate(new["bucket"]):
            if p.cacheable(b):
                mean = new["mean"][i]
                to_cache.append(
                    {
                        "run_id": p.run_id,
                        "key": p.key,
                        "width": p.width,
                        "bucket": b,
                        "hi_step": (b + 1) * p.width - 1,
                        "n": new["n"][i],
                        "n_valid": new["n_valid"][i],
                        "v_sum": None if mean is None else mean * new["n_valid"][i],
                        "v_min": new["v_min"][i],
                        "v_max": new["v_max"][i],
                        "last_step": new["last_step"][i],
                        "last_wall": new["last_wall"][i],
                    }
                )
    if to_cache:
        _cache_rollups(session, to_cache, seen)
    return plans


def _missing_ranges(p: _Plan, have: set[int]) -> Iterable[tuple[int, int]]:
    """Half-open bucket ranges [start, end) of ``p`` to aggregate from raw points."""
    if len(have) == p.b_hi - p.cache_lo:  # every cacheable bucket is cached: just the edges
        if p.cache_lo > p.b_lo:
            yield p.b_lo, p.cache_lo
        yield p.b_hi, p.b_hi + 1
        return
    b = p.b_lo
    while b <= p.b_hi:
        if p.cacheable(b) and b in have:
            b += 1
            continue
        start = b
        while b <= p.b_hi and not (p.cacheable(b) and b in have):
            b += 1
        yield start, b


def _merge(old: dict[str, list[Any]], new: dict[str, list[Any]]) -> dict[str, list[Any]]:
    if not new["bucket"]:
        return old
    if not old["bucket"] or new["bucket"][0] > old["bucket"][-1]:
        return {f: old[f] + new[f] for f in BUCKET_FIELDS}
    rows = dict(zip(old["bucket"], zip(*(old[f] for f in BUCKET_FIELDS), strict=True), strict=True))
    rows.update(zip(new["bucket"], zip(*(new[f] for f in BUCKET_FIELDS), strict=True), strict=True))
    ordered = [rows[b] for b in sorted(rows)]
    return {f: [r[i] for r in ordered] for i, f in enumerate(BUCKET_FIELDS)}


_PG_CACHED_SQL = (
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


def _cached_buckets(
    session: Session, plans: list[_Plan]
) -> dict[tuple[int, str], dict[str, list[Any]]]:
    """Cached buckets of every plan, column-oriented (PostgreSQL aggregates them into arrays)."""
    out: dict[tuple[int, str], dict[str, list[Any]]] = {}
    plans = [p for p in plans if p.b_hi > p.cache_lo]
    if not plans:
        return out
    if session.get_bind().dialect.name == "postgresql":
        # One index range scan per series, aggregated into arrays in bucket order (no sort),
        # fetched in binary so the arrays decode in C.
        params = {
            "rs": [p.run_id for p in plans],
            "ks": [p.key for p in plans],
            "ws": [p.width for p in plans],
            "los": [p.cache_lo for p in plans],
            "his": [p.b_hi for p in plans],
        }
        dbapi = session.connection().connection.dbapi_connection
        with dbapi.cursor(binary=True) as cur:  # type: ignore[union-attr]
            cur.execute(_PG_CACHED_SQL, params)
            for run_id, key, *arrays in cur.fetchall():
                if arrays[0] is not None:
                    out[(run_id, key)] = dict(zip(BUCKET_FIELDS, arrays, strict=True))
        return out
    r = MetricRollup
    mean = case((r.n_valid > 0, r.v_sum / r.n_valid), else_=None)
    cols = (r.bucket, r.n, mean, r.v_min, r.v_max, r.last_step, r.last_wall, r.n_valid)
    conds = [
        and_(
            r.run_id == p.run_id,
            r.key == p.key,
            r.width == p.width,
            r.bucket >= p.cache_lo,
            r.bucket < p.b_hi,
        )
        for p in plans
    ]
    for chunk in _chunks(conds, 200):
        stmt2 = (
            select(r.run_id, r.key, *cols).where(or_(*chunk)).order_by(r.run_id, r.key, r.bucket)
        )
        for run_id, key, *values in session.execute(stmt2):
            series = out.setdefault((run_id, key), {f: [] for f in BUCKET_FIELDS})
            for name, value in zip(BUCKET_FIELDS, values, strict=True):
                series[name].append(value)
    return out


def _cache_rollups(session: Session, rows: list[dict[str, Any]], seen: dict[int, int]) -> None:
    """Insert computed buckets, only for runs that no write has touched since they were read.

    ``seen``: each run's write_seq read before the points. The run rows are locked FOR SHARE,
    which waits for a writer in flight (it holds the row from its first statement) and keeps
    the next one out until this commits: a bucket computed from points a write has since
    replaced (and whose cache rows that write deleted) is never cached, nor one of a deleted
    run. A lost race only costs a recomputation.
    """
    runs = sorted({r["run_id"] for r in rows})
    try:
        with session.begin_nested():
            current = session.execute(
                select(Run.id, Run.write_seq).where(Run.id.in_(runs)).with_for_update(read=True)
            ).all()
            unchanged = {r for r, seq in current if seen.get(r) == seq}
            rows = [r for r in rows if r["run_id"] in unchanged]
            insert_ignore(session, ROLLUPS, rows, ROLLUP_KEY)
        session.commit()
    except DBAPIError:
        session.rollback()


def _raw_points(
    session: Session, pairs: list[tuple[int, str]], first: int, last: int
) -> Iterable[tuple[int, str, int, float | None, float]]:
    conds = [and_(Metric.run_id == r, Metric.key == k) for r, k in pairs]
    for chunk in _chunks(conds, 200):
        stmt = (
            select(Metric.run_id, Metric.key, Metric.step, Metric.value, Metric.wall_time)
            .where(or_(*chunk), Metric.step > first, Metric.step <= last)
            .order_by(Metric.run_id, Metric.key, Metric.step)
        )
        yield from session.execute(stmt)


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@dataclass(frozen=True)
class StreamCursor:
    """Where a live stream stands, as its event id says.

    Every metric write gives its points the run's next ``write_seq`` (under the run row's lock,
    so per run it follows commit order); a stream has sent every point with ``seq <= seq``.
    A stream opened with ``since_step=N`` starts with a backlog: points written up to
    ``backlog_until`` (the run's write_seq when it opened) are sent only if their step is
    above N (the caller already has the rest); anything written later is sent whatever its
    step. The event id is ``"<seq>"``, or ``"<seq>:<backlog_until>"`` during the backlog.
    """

    seq: int = -1
    since_step: int = -1
    backlog_until: int | None = None

    @property
    def event_id(self) -> str:
        return str(self.seq) if self.backlog_until is None else f"{self.seq}:{self.backlog_until}"

    @classmethod
    def parse(cls, raw: str, since_step: int | None) -> StreamCursor | None:
        """A Last-Event-ID back into a cursor (None when it is not one of ours)."""
        parts = raw.strip().split(":")
        if len(parts) > 2 or not all(p.lstrip("-").isdigit() for p in parts):
            return None
        nums = [int(p) for p in parts]
        if not all(-1 <= n < 2**63 for n in nums):
            return None
        backlog = nums[1] if len(nums) == 2 and nums[1] > nums[0] else None
        return cls(nums[0], -1 if since_step is None else since_step, backlog)


def query_new_points(
    session: Session, run_id: int, cursor: StreamCursor, limit_rows: int = 20_000
) -> tuple[StreamCursor, int | None, dict[str, dict[str, list[Any]]]]:
    """Points written after ``cursor``, whole writes only, about ``limit_rows`` at most.

    Returns the new cursor, the highest step among the points (None when there are none) and
    ``{key: {"steps", "values", "wall_time"}}`` with each key's points in step order. A point
    rewritten after it was sent (an overwrite, e.g. a resumed run re-emitting a step) is sent
    again with its new value.
    """
    m = Metric

    def select_points(*conds: Any, limit: int | None) -> list[Any]:
        stmt = select(m.key, m.step, m.value, m.wall_time, m.seq).where(m.run_id == run_id, *conds)
        if cursor.backlog_until is not None:
            stmt = stmt.where(or_(m.seq > cursor.backlog_until, m.step > cursor.since_step))
        return list(session.execute(stmt.order_by(m.seq).limit(limit)).all())

    rows = select_points(m.seq > cursor.seq, limit=limit_rows + 1)
    complete = len(rows) <= limit_rows
    if not complete:  # keep whole writes: drop the last seq, or read a huge first write whole
        last = rows[-1].seq
        rows = [r for r in rows if r.seq != last]
        if not rows:
            rows = select_points(m.seq == last, limit=None)
    new_seq = max([cursor.seq, *(r.seq for r in rows[-1:])])
    backlog = cursor.backlog_until
    if backlog is not None and (complete or new_seq >= backlog):
        # Everything up to now matched or was skipped; the backlog is over.
        new_seq, backlog = max(new_seq, backlog), None
    series: dict[str, dict[str, list[Any]]] = {}
    step_max = None
    for key, step, value, wall, _ in sorted(rows, key=lambda r: (r.key, r.step)):
        s = series.setdefault(key, {"steps": [], "values": [], "wall_time": []})
        s["steps"].append(step)
        s["values"].append(value)
        s["wall_time"].append(wall)
        step_max = step if step_max is None else max(step_max, step)
    return StreamCursor(new_seq, cursor.since_step, backlog), step_max, series


def query_rollouts(
    session: Session,
    run_id: int,
    step_min: int | None,
    step_max: int | None,
    limit: int,
) -> list[dict[str, Any]]:
    stmt = select(Rollout).where(Rollout.run_id == run_id)
    if step_min is not None:
        stmt = stmt.where(Rollout.step >= step_min)
    if step_max is not None:
        stmt = stmt.where(Rollout.step <= step_max)
    stmt = stmt.order_by(Rollout.step, Rollout.group, Rollout.index).limit(limit)
    return [
        {
            "step": r.step,
            "group": r.group,
            "index": r.index,
            "reward": r.reward,
            "score": r.score,
            "length": r.length,
            "truncated": r.truncated,
        }
        for r in session.scalars(stmt)
    ]
