"""Server-side downsampled metric reads, served partly from the ``metric_rollups`` cache.

Reads bucket in SQL: a series with more than ``max_points`` points is grouped into
``max_points`` equal step ranges, each reporting its last step, mean, min and max (spikes
survive sampling). Complete buckets are cached for the next reader.

Writes keep the rollups of the charts' reads current as they go (``refresh_rollups``, called
by ``backend.storage.writes.write_points`` in its transaction), so even the first read of a
long series finds its complete buckets stored; reads at other widths fill the cache lazily.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import and_, or_, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from backend.db import transaction_for
from backend.models import Metric, Run
from backend.schemas import INT32_MAX
from backend.storage.columns import (
    ROLLUP_KEY,
    ROLLUPS,
    MetricColumns,
    RollupColumns,
    rollup_rows,
)
from backend.storage.dialect import (
    BUCKET_FIELDS,
    BucketRange,
    Buckets,
    Dialect,
    SeriesKey,
    StepRange,
    chunks,
    empty_buckets,
)
from backend.storage.strategies import dialect_of

# The max_points of the run and compare pages' charts: writes maintain the rollups their reads use.
ROLLUP_MAX_POINTS = 1000


@dataclass(slots=True)
class Series:
    """One series as the API serves it: raw points, or one entry per bucket when ``sampled``.

    A bucket reports its last step and wall time, the mean of its values, and their min and
    max (spikes survive sampling); a raw point has min == max == value.
    """

    steps: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    min: list[float | None] = field(default_factory=list)
    max: list[float | None] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    sampled: bool = False
    total_points: int = 0  # points in the range, also when sampled


def metric_keys(session: Session, run_id: int) -> list[str]:
    stmt = select(Metric.key).where(Metric.run_id == run_id).distinct().order_by(Metric.key)
    return list(session.scalars(stmt))


class SeriesCache:
    """The series this process read lately, so that a run's charts read by many (the compare
    page of a study, a dashboard on a wall, every tab following a live run) are read from the
    database and built once per write rather than once per request: building them is most of
    a read's cost.

    An entry is one run's series for one request's keys and range, keyed by the run's id and
    creation time (SQLite gives a deleted last row's id to the next run) and its write sequence,
    which every write of its points bumps: a write makes the entry unreachable, never stale.
    Bounded by the points held (least recently used first out). The series it returns are
    shared: read them, do not change them.
    """

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self._entries: OrderedDict[tuple[Any, ...], tuple[dict[str, Series], int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> dict[str, Series] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: tuple[Any, ...], series: dict[str, Series]) -> None:
        size = sum(len(s.steps) for s in series.values()) + len(series)
        if size > self.max_points // 4:  # one huge read would flush everything else
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (series, size)
            self._held += size
            while self._held > self.max_points:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._held -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0


# ~200k points: tens of MB at most, and the 5-run × 6-key compare of 600-step runs ten times
SERIES_CACHE = SeriesCache(max_points=200_000)


RunVersions = dict[int, tuple[Any, ...]]  # run id → what SERIES_CACHE keys its series on


def series_versions(session: Session, run_ids: Sequence[int]) -> RunVersions:
    """The stored runs among ``run_ids`` (a deleted one is absent), each with what its cached
    series are keyed on: its creation time and write sequence (one small query)."""
    rows = session.execute(
        select(Run.id, Run.created_at, Run.write_seq).where(Run.id.in_(run_ids))
    ).all()
    return {row[0]: tuple(row) for row in rows}


def cached_series(
    session: Session,
    run_ids: Sequence[int],
    keys: Sequence[str],
    max_points: int,
    since_step: int | None = None,
    step_max: int | None = None,
    versions: RunVersions | None = None,
) -> dict[int, dict[str, Series]]:
    """``query_series``, each run's from ``SERIES_CACHE`` when no write touched it since it
    was read (the API's reads; a change made behind the writes' back is not seen).
    ``versions``: ``series_versions`` of ``run_ids`` if the caller has just read them."""
    if versions is None:
        versions = series_versions(session, run_ids)
    request = (tuple(keys), max_points, since_step, step_max)
    cache_keys = {run_id: (*version, *request) for run_id, version in versions.items()}
    out: dict[int, dict[str, Series]] = {}
    for run_id in run_ids:
        found = SERIES_CACHE.get(cache_keys[run_id]) if run_id in cache_keys else None
        if found is not None:
            out[run_id] = found
    missing = [r for r in run_ids if r not in out]
    if missing:
        read = query_series(session, missing, keys, max_points, since_step, step_max)
        for run_id, series in read.items():
            if run_id in cache_keys:  # a run that does not exist has nothing to keep
                SERIES_CACHE.put(cache_keys[run_id], series)
        out.update(read)
    return {r: out[r] for r in run_ids}


def query_series(
    session: Session,
    run_ids: Sequence[int],
    keys: Sequence[str],
    max_points: int,
    since_step: int | None = None,
    step_max: int | None = None,
) -> dict[int, dict[str, Series]]:
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
    out = {r: {k: Series() for k in keys} for r in run_ids}
    first = -1 if since_step is None else since_step
    last = INT32_MAX if step_max is None else step_max
    # Each run's write_seq before any point is read: buckets are cached only for runs that no
    # write has touched since (see _cache_rollups).
    seen = dict(session.execute(select(Run.id, Run.write_seq).where(Run.id.in_(run_ids))).all())
    dialect = dialect_of(session)
    extents = dialect.extents(session, run_ids, keys, first, last) if run_ids and keys else {}
    raw: list[tuple[int, str]] = []
    plans: list[_Plan] = []
    for (run_id, key), (lo, hi) in extents.items():
        if hi - lo + 1 <= max_points:
            raw.append((run_id, key))
        else:
            plans.append(_Plan.make(run_id, key, lo, hi, first, max_points))
    for plan in _bucketize(session, dialect, plans, seen):
        total = sum(plan.cols["n"])
        if total <= max_points:
            raw.append((plan.run_id, plan.key))
            continue
        out[plan.run_id][plan.key] = Series(
            steps=plan.cols["last_step"],
            values=plan.cols["mean"],  # means of stored (finite, |x| <= 1e290) values
            min=plan.cols["v_min"],
            max=plan.cols["v_max"],
            wall_time=plan.cols["last_wall"],
            sampled=True,
            total_points=total,
        )
    for run_id, key, step, value, wall in _raw_points(session, raw, first, last):
        s = out[run_id][key]
        s.steps.append(step)
        s.values.append(value)
        s.min.append(value)
        s.max.append(value)
        s.wall_time.append(wall)
        s.total_points += 1
    return out


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
    cols: Buckets = field(default_factory=dict)

    @classmethod
    def make(cls, run_id: int, key: str, lo: int, hi: int, first: int, max_points: int) -> _Plan:
        width = bucket_width(lo, hi, max_points)
        return cls(run_id, key, width, first, hi, lo // width, hi // width)

    @property
    def cache_lo(self) -> int:
        """First cacheable bucket: one that the since_step cursor does not cut."""
        return self.b_lo if self.b_lo * self.width > self.first else self.b_lo + 1

    def cacheable(self, bucket: int) -> bool:
        return self.cache_lo <= bucket < self.b_hi


def _bucketize(
    session: Session, dialect: Dialect, plans: list[_Plan], seen: dict[int, int]
) -> list[_Plan]:
    """Fill each plan's buckets from the rollup cache plus SQL aggregates of what is missing."""
    cached = _cached_buckets(session, dialect, plans)
    missing: dict[int, list[StepRange]] = {}  # by width
    for p in plans:
        have = cached.get((p.run_id, p.key))
        have_set = set(have["bucket"]) if have else set()
        for start, end in _missing_ranges(p, have_set):
            lo, hi = max(start * p.width, p.first + 1), min(end * p.width - 1, p.hi)
            missing.setdefault(p.width, []).append(StepRange(p.run_id, p.key, lo, hi))
    fresh: dict[SeriesKey, Buckets] = {}
    for width, ranges in missing.items():
        fresh.update(dialect.aggregate(session, width, ranges))
    to_cache: list[dict[str, Any]] = []
    for p in plans:
        new = fresh.get((p.run_id, p.key)) or empty_buckets()
        p.cols = _merge(cached.get((p.run_id, p.key)) or empty_buckets(), new)
        to_cache += _rollup_rows(p, new)
    if to_cache:
        _cache_rollups(session, to_cache, seen)
    return plans


def _cached_buckets(
    session: Session, dialect: Dialect, plans: list[_Plan]
) -> dict[SeriesKey, Buckets]:
    """The cached buckets of every plan that has cacheable ones."""
    ranges = [
        BucketRange(p.run_id, p.key, p.width, p.cache_lo, p.b_hi)
        for p in plans
        if p.b_hi > p.cache_lo
    ]
    return dialect.cached_buckets(session, ranges) if ranges else {}


def _rollup_rows(p: _Plan, new: Buckets) -> list[dict[str, Any]]:
    """``metric_rollups`` rows of the cacheable buckets among the freshly aggregated ``new``."""
    return rollup_rows(p.run_id, p.key, p.width, new, p.cacheable)


def bucket_width(lo: int, hi: int, max_points: int) -> int:
    """The smallest power of two (at least 2) that cuts steps lo..hi into <= max_points buckets."""
    width = 2
    while hi // width - lo // width + 1 > max_points:
        width *= 2
    return width


def maintained_widths(lo: int, hi: int) -> tuple[int, ...]:
    """Bucket widths whose rollups writes keep current for a series spanning steps lo..hi.

    None while a chart's read returns it raw; then the width such a read picks. The write that
    grows a series into the next width stores all of its buckets: once per doubling, so
    about one extra pass over the points in all (keeping the next width too cost 2x per write).
    """
    if hi - lo + 1 <= ROLLUP_MAX_POINTS:
        return ()
    return (bucket_width(lo, hi, ROLLUP_MAX_POINTS),)


def refresh_rollups(
    session: Session,
    dialect: Dialect,
    run_id: int,
    points: MetricColumns,
    before: dict[str, tuple[int, int]],
) -> None:
    """Recompute the stored buckets that a metric write changed, and drop the outgrown ones.

    ``points``: the points just written (in this transaction); ``before``: each series' extents
    before them. For each maintained width: every complete bucket (not the one holding the
    series' last step, which may still grow) from the one holding the earlier of the first
    written step and the previous last step (that bucket may have just completed) on, or all of
    them when the series just grew into the width. Rows are upserted whole, so a redelivered
    step counts once:

    * buckets after the one holding the previous last step hold only points of this write (the
      caller holds the run row's lock): aggregated from ``points`` in numpy (``_own_buckets``),
      bit for bit what SQL would store, without reading the points back;
    * a series that grows into a wider width has its rows of the narrower one deleted, and the
      wider buckets made of full narrower ones summed from them (``Dialect.derive_rollups``:
      a point at every step, so nothing is missed; the sum of the halves' sums may differ from
      a fresh sum in the last bit);
    * the rest (at most one bucket per series in a run that only moves forward; sparse series'
      buckets when they grow into a width) are recomputed from the table in SQL.
    """
    plans: list[tuple[str, int, int, int, int, int, Any]] = []  # key, width, buckets, rows
    grown: dict[tuple[int, int], list[str]] = {}  # (old width, new width) -> keys
    starts = np.flatnonzero(np.append(True, points.k[1:] != points.k[:-1]))  # each key's rows
    ends = np.append(starts[1:], len(points.k))
    for k, r0, r1 in zip(points.k[starts].tolist(), starts.tolist(), ends.tolist(), strict=True):
        key, steps = points.keys[k], points.step[r0:r1]
        w_lo, w_hi = int(steps[0]), int(steps[-1])
        old = before.get(key)
        lo, hi = (min(old[0], w_lo), max(old[1], w_hi)) if old else (w_lo, w_hi)
        old_widths = maintained_widths(*old) if old else ()
        widths = maintained_widths(lo, hi)
        for was in old_widths:
            for width in widths:
                if was != width:
                    grown.setdefault((was, width), []).append(key)
        for width in widths:
            start = min(w_lo, old[1]) if old and width in old_widths else lo
            first, last = start // width, hi // width - 1  # whole buckets before the last one
            if first <= last:
                fresh = max(first, old[1] // width + 1) if old else first  # first one of ours
                plans.append((key, width, first, fresh, last, r0, steps))
    derived: set[tuple[str, int]] = set()
    for (was, width), keys in grown.items():
        derived |= dialect.derive_rollups(session, run_id, keys, was, width)
    ranges: dict[int, list[StepRange]] = {}  # by width: aggregated in SQL
    own: list[tuple[int, int, int]] = []  # (first row, end row, width): aggregated here
    for key, width, first, fresh, last, r0, steps in plans:
        b, end = first, min(fresh, last + 1)
        while b < end:  # runs of buckets not derived
            if (key, b) in derived:
                b += 1
                continue
            run_start = b
            while b < end and (key, b) not in derived:
                b += 1
            ranges.setdefault(width, []).append(
                StepRange(run_id, key, run_start * width, b * width - 1)
            )
        if fresh <= last:
            i0, i1 = np.searchsorted(steps, [fresh * width, (last + 1) * width]).tolist()
            if i0 < i1:
                own.append((r0 + i0, r0 + i1, width))
    for width, series in ranges.items():
        dialect.store_rollups(session, width, series)
    if own:
        dialect.write_rollups(session, run_id, _own_buckets(points, own))


def _own_buckets(points: MetricColumns, own: list[tuple[int, int, int]]) -> RollupColumns:
    """The buckets of ``own``'s (first row, end row, width) runs of ``points``, each run whole
    buckets of one series, aggregated as ``Dialect.aggregate`` does."""
    lengths = np.array([i1 - i0 for i0, i1, _ in own])
    rows = np.concatenate([np.arange(i0, i1) for i0, i1, _ in own])
    width = np.repeat(np.array([w for _, _, w in own], dtype=np.int64), lengths)
    run = np.repeat(np.arange(len(own)), lengths)
    step, value = points.step[rows], points.value[rows]
    bucket = step // width
    starts = np.flatnonzero(np.append(True, (run[1:] != run[:-1]) | (bucket[1:] != bucket[:-1])))
    n = np.diff(np.append(starts, len(rows)))
    valid = ~np.isnan(value)
    n_valid = np.add.reduceat(valid.astype(np.int64), starts)
    # SQL's avg adds the values in step order from 0.0 and divides by their count, and the row
    # keeps mean * n_valid: the same operations here, so the row is bit for bit SQL's. (A NULL
    # adds 0.0, which changes no sum.) One pass per position in a bucket: width at most.
    total = np.zeros(len(starts))
    filled = np.where(valid, value, 0.0)
    for j in range(int(n.max())):
        live = np.flatnonzero(n > j)
        total[live] += filled[starts[live] + j]
    with np.errstate(invalid="ignore", divide="ignore"):
        v_sum = np.where(n_valid > 0, total / n_valid * n_valid, np.nan)
        v_min = np.fmin.reduceat(value, starts)  # NaN only when every value is NULL
        v_max = np.fmax.reduceat(value, starts)
    return RollupColumns(
        keys=points.keys,
        k=points.k[rows[starts]],
        width=width[starts],
        bucket=bucket[starts],
        n=n,
        n_valid=n_valid,
        v_sum=v_sum,
        v_min=v_min,
        v_max=v_max,
        last_step=step[starts + n - 1],
        last_wall=np.maximum.reduceat(points.wall[rows], starts),
    )


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


def _merge(old: Buckets, new: Buckets) -> Buckets:
    if not new["bucket"]:
        return old
    if not old["bucket"] or new["bucket"][0] > old["bucket"][-1]:
        return {f: old[f] + new[f] for f in BUCKET_FIELDS}
    rows = dict(zip(old["bucket"], zip(*(old[f] for f in BUCKET_FIELDS), strict=True), strict=True))
    rows.update(zip(new["bucket"], zip(*(new[f] for f in BUCKET_FIELDS), strict=True), strict=True))
    ordered = [rows[b] for b in sorted(rows)]
    return {f: [r[i] for r in ordered] for i, f in enumerate(BUCKET_FIELDS)}


def _cache_rollups(session: Session, rows: list[dict[str, Any]], seen: dict[int, int]) -> None:
    """Insert computed buckets, only for runs that no write has touched since they were read.

    ``seen``: each run's write_seq read before the points. The run rows are locked FOR SHARE,
    which waits for a writer in flight (it holds the row from its first statement) and keeps
    the next one out until this commits: a bucket computed from points a write has since
    replaced (and whose cache rows that write deleted) is never cached, nor one of a deleted
    run. A lost race only costs a recomputation.
    """
    runs = sorted({r["run_id"] for r in rows})
    with transaction_for(session) as writer:
        try:
            with writer.begin_nested():
                current = writer.execute(
                    select(Run.id, Run.write_seq).where(Run.id.in_(runs)).with_for_update(read=True)
                ).all()
                unchanged = {r for r, seq in current if seen.get(r) == seq}
                rows = [r for r in rows if r["run_id"] in unchanged]
                dialect_of(writer).insert_ignore(writer, ROLLUPS, rows, ROLLUP_KEY)
            writer.commit()
        except DBAPIError:
            writer.rollback()


def _raw_points(
    session: Session, pairs: list[tuple[int, str]], first: int, last: int
) -> Iterable[tuple[int, str, int, float | None, float]]:
    conds = [and_(Metric.run_id == r, Metric.key == k) for r, k in pairs]
    for chunk in chunks(conds):
        stmt = (
            select(Metric.run_id, Metric.key, Metric.step, Metric.value, Metric.wall_time)
            .where(or_(*chunk), Metric.step > first, Metric.step <= last)
            .order_by(Metric.run_id, Metric.key, Metric.step)
        )
        yield from session.execute(stmt)


WholeSeries = dict[tuple[int, str], tuple[list[int], list[float | None]]]  # (run, key) → points


def whole_series(session: Session, run_ids: Iterable[int], keys: Iterable[str]) -> WholeSeries:
    """Every point of each (run, key), in step order, not downsampled (a study's objective
    reads whole runs); a missing series reads as empty."""
    out: WholeSeries = defaultdict(lambda: ([], []))
    ids, key_list = list(run_ids), list(keys)
    if not ids:
        return out
    rows = session.execute(
        select(Metric.run_id, Metric.key, Metric.step, Metric.value)
        .where(Metric.run_id.in_(ids), Metric.key.in_(key_list))
        .order_by(Metric.run_id, Metric.key, Metric.step)
    )
    for run_id, key, step, value in rows:
        steps, values = out[(run_id, key)]
        steps.append(step)
        values.append(value)
    return out


def points_under(session: Session, run_id: int, prefix: str) -> list[tuple[int, str, float | None]]:
    """(step, key, value) of every point of ``run_id`` whose key starts with ``prefix``
    (``eval/``: its held-out evaluations), in step order."""
    rows = session.execute(
        select(Metric.step, Metric.key, Metric.value)
        .where(Metric.run_id == run_id, Metric.key.startswith(prefix))
        .order_by(Metric.step)
    )
    return [(step, key, value) for step, key, value in rows]
