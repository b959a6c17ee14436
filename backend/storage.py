"""Metric and rollout storage: idempotent bulk writes and server-side downsampled reads.

Writes are ``INSERT … ON CONFLICT DO UPDATE`` on (run_id, key, step) and (run_id, step, group,
index), so a redelivered job or a retried client batch overwrites instead of duplicating. Reads
bucket in SQL: a series with more than ``max_points`` points is grouped into ``max_points``
equal step ranges, each reporting its last step, mean, min and max (spikes survive sampling).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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

from backend.db import insert_ignore, upsert
from backend.models import Metric, MetricRollup, Rollout, Run, RunStatus, finite, utcnow

METRICS: Table = Metric.__table__  # type: ignore[assignment]
ROLLOUTS: Table = Rollout.__table__  # type: ignore[assignment]
ROLLUPS: Table = MetricRollup.__table__  # type: ignore[assignment]
METRIC_KEY = ("run_id", "key", "step")
ROLLOUT_KEY = ("run_id", "step", "group", "index")
ROLLUP_KEY = ("run_id", "key", "width", "bucket")


@dataclass
class StepPoints:
    """One step's metrics as written by the DB sink or the external logging endpoint."""

    step: int
    metrics: Mapping[str, float | None]
    wall_time: float | None = None


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

    Four statements whatever the batch size: one UPDATE of the run (step only moves forward; the
    summary keeps each key's value at the highest step; with ``owner_attempt`` only while that
    attempt still owns the running run, else nothing is written and ``owned`` is False), one
    DELETE of the rollup-cache rows the new points fall into, two bulk upserts. The caller
    commits.
    """
    now = time.time()
    rows: list[dict[str, Any]] = []
    out = Written()
    for s in sorted(steps, key=lambda s: s.step):
        wall = s.wall_time if s.wall_time is not None and finite(s.wall_time) is not None else now
        for key, value in s.metrics.items():
            v = finite(value)
            rows.append(
                {"run_id": run_id, "key": key, "step": s.step, "value": v, "wall_time": wall}
            )
            out.last_values[key] = v
        out.last_step = s.step
    rollout_rows = [
        {
            "run_id": run_id,
            "step": r.step,
            "group": r.group,
            "index": r.index,
            "reward": finite(r.reward),
            "score": finite(r.score),
            "length": int(r.length),
            "truncated": bool(r.truncated),
        }
        for r in rollouts
    ]
    if not _update_run(session, run_id, out, owner_attempt, run_values or {}):
        out.owned = False
        return out
    if rows:
        session.execute(
            delete(MetricRollup).where(
                MetricRollup.run_id == run_id,
                MetricRollup.hi_step >= min(r["step"] for r in rows),
            )
        )
    rows = sorted(_dedupe(rows, METRIC_KEY), key=lambda r: (r["key"], r["step"]))
    out.points = upsert(session, METRICS, rows, METRIC_KEY)
    out.rollouts = upsert(session, ROLLOUTS, _dedupe(rollout_rows, ROLLOUT_KEY), ROLLOUT_KEY)
    return out


def _update_run(
    session: Session,
    run_id: int,
    out: Written,
    owner_attempt: int | None,
    values: dict[str, Any],
) -> bool:
    stmt = update(Run).where(Run.id == run_id)
    if owner_attempt is not None:
        stmt = stmt.where(Run.attempt == owner_attempt, Run.status == RunStatus.running)
    values = {"updated_at": utcnow(), **values}
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
    result = session.execute(stmt.values(**values).returning(Run.id))
    return result.first() is not None


def _dedupe(rows: list[dict[str, Any]], key: Sequence[str]) -> list[dict[str, Any]]:
    # ON CONFLICT cannot touch one row twice in a statement; the last write of a key wins.
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        seen[tuple(row[k] for k in key)] = row
    return list(seen.values())


def touch_run(session: Session, run_id: int, **values: Any) -> int:
    result = session.execute(
        update(Run).where(Run.id == run_id).values(updated_at=utcnow(), **values)
    )
    return result.rowcount  # type: ignore[attr-defined]


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
) -> dict[int, dict[str, dict[str, Any]]]:
    """``{run_id: {key: Series}}`` for every requested pair (empty series where none exist).

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
    extents = _extents(session, run_ids, keys, first)
    raw: list[tuple[int, str]] = []
    plans: list[_Plan] = []
    for (run_id, key), (lo, hi) in extents.items():
        if hi - lo + 1 <= max_points:
            raw.append((run_id, key))
        else:
            plans.append(_Plan.make(run_id, key, lo, hi, first, max_points))
    for plan in _bucketize(session, plans):
        total = sum(plan.cols["n"])
        if total <= max_points:
            raw.append((plan.run_id, plan.key))
            continue
        out[plan.run_id][plan.key] = {
            "steps": plan.cols["last_step"],
            "values": [finite(v) for v in plan.cols["mean"]],
            "min": plan.cols["v_min"],
            "max": plan.cols["v_max"],
            "wall_time": plan.cols["last_wall"],
            "sampled": True,
            "total_points": total,
        }
    for run_id, key, step, value, wall in _raw_points(session, raw, first):
        s = out[run_id][key]
        s["steps"].append(step)
        s["values"].append(value)
        s["min"].append(value)
        s["max"].append(value)
        s["wall_time"].append(wall)
        s["total_points"] += 1
    return out


def _extents(
    session: Session, run_ids: Sequence[int], keys: Sequence[str], first: int
) -> dict[tuple[int, str], tuple[int, int]]:
    """(run_id, key) -> (first, last step > ``first``) for the series that have points."""
    if not run_ids or not keys:
        return {}
    if session.get_bind().dialect.name == "postgresql":
        # One pair per row, two index probes each; GROUP BY would read every point.
        pairs = [(r, k) for r in run_ids for k in keys]
        stmt = text(
            "SELECT p.r, p.k,"
            " (SELECT min(step) FROM metrics m WHERE m.run_id = p.r AND m.key = p.k"
            "  AND m.step > :first),"
            " (SELECT max(step) FROM metrics m WHERE m.run_id = p.r AND m.key = p.k"
            "  AND m.step > :first)"
            " FROM unnest(CAST(:rs AS integer[]), CAST(:ks AS text[])) AS p(r, k)"
        )
        rows = session.execute(
            stmt, {"rs": [p[0] for p in pairs], "ks": [p[1] for p in pairs], "first": first}
        )
    else:
        rows = session.execute(
            select(Metric.run_id, Metric.key, func.min(Metric.step), func.max(Metric.step))
            .where(
                Metric.run_id.in_(list(run_ids)),
                Metric.key.in_(list(keys)),
                Metric.step > first,
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


def _bucketize(session: Session, plans: list[_Plan]) -> list[_Plan]:
    """Fill each plan's buckets from the rollup cache plus SQL aggregates of what is missing."""
    if not plans:
        return plans
    cached = _cached_buckets(session, plans)
    missing: dict[int, list[Any]] = {}  # width -> step-range conditions
    for p in plans:
        have = cached.get((p.run_id, p.key))
        have_set = set(have["bucket"]) if have else set()
        for start, end in _missing_ranges(p, have_set):
            missing.setdefault(p.width, []).append(
                and_(
                    Metric.run_id == p.run_id,
                    Metric.key == p.key,
                    Metric.step.between(
                        max(start * p.width, p.first + 1), min(end * p.width - 1, p.hi)
                    ),
                )
            )
    fresh: dict[tuple[int, str], dict[str, list[Any]]] = {}
    for width, conds in missing.items():
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
        _cache_rollups(session, to_cache)
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


def _cache_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert computed buckets (a lost race with a writer only costs a recomputation)."""
    try:
        with session.begin_nested():
            insert_ignore(session, ROLLUPS, rows, ROLLUP_KEY)
        session.commit()
    except DBAPIError:
        session.rollback()


def _raw_points(
    session: Session, pairs: list[tuple[int, str]], first: int
) -> Iterable[tuple[int, str, int, float | None, float]]:
    conds = [and_(Metric.run_id == r, Metric.key == k) for r, k in pairs]
    for chunk in _chunks(conds, 200):
        stmt = (
            select(Metric.run_id, Metric.key, Metric.step, Metric.value, Metric.wall_time)
            .where(or_(*chunk), Metric.step > first)
            .order_by(Metric.run_id, Metric.key, Metric.step)
        )
        yield from session.execute(stmt)


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def query_new_points(
    session: Session, run_id: int, since_step: int, limit_rows: int = 20_000
) -> tuple[int, dict[str, dict[str, list[Any]]]]:
    """Raw points with step > since_step, whole steps only, up to about ``limit_rows`` rows."""
    stmt = (
        select(Metric.key, Metric.step, Metric.value, Metric.wall_time)
        .where(Metric.run_id == run_id, Metric.step > since_step)
        .order_by(Metric.step, Metric.key)
        .limit(limit_rows + 1)
    )
    rows = session.execute(stmt).all()
    if len(rows) > limit_rows:
        last = rows[-1].step
        trimmed = [r for r in rows if r.step != last]
        rows = trimmed or [r for r in rows if r.step == last]
    series: dict[str, dict[str, list[Any]]] = {}
    step_max = since_step
    for key, step, value, wall in rows:
        s = series.setdefault(key, {"steps": [], "values": [], "wall_time": []})
        s["steps"].append(step)
        s["values"].append(value)
        s["wall_time"].append(wall)
        step_max = max(step_max, step)
    return step_max, series


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
