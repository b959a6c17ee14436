"""The SQLite storage strategy: portable SQLAlchemy Core statements.

Bulk writes are an executemany of ``INSERT … ON CONFLICT``; reads of many series OR one
condition per series, in chunks (``backend.storage.dialect.chunks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import ColumnElement, Table, and_, case, func, literal, or_, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from backend.models import Metric, MetricRollup, RolloutStep, Run
from backend.storage.columns import RolloutColumns
from backend.storage.dialect import (
    BucketRange,
    Buckets,
    Dialect,
    JsonField,
    SeriesKey,
    StepRange,
    chunks,
    collect,
)

if TYPE_CHECKING:
    from backend.storage.columns import MetricColumns

METRICS: Table = Metric.__table__  # type: ignore[assignment]
ROLLOUT_STEPS: Table = RolloutStep.__table__  # type: ignore[assignment]
METRIC_KEY = ("run_id", "key", "step")
ROLLOUT_STEP_KEY = ("run_id", "step")


class SqliteDialect(Dialect):
    name = "sqlite"

    def json_field(self, column: ColumnElement[Any], names: Sequence[str]) -> JsonField:
        # '$."a"."b"': names are identifiers (backend.runs.where), quoted all the same
        path = literal("$" + "".join(f'."{n}"' for n in names))
        kind = func.json_type(column, path)
        value = func.json_extract(column, path)
        return JsonField(
            number=case((kind.in_(("integer", "real")), value)),
            text=case((kind == "text", value)),
            boolean=case((kind.in_(("true", "false")), kind)),
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
        """An executemany of ``INSERT … ON CONFLICT``."""
        if not rows:
            return 0
        stmt = sqlite.insert(table)
        if update:
            cols = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in key}
            stmt = stmt.on_conflict_do_update(index_elements=list(key), set_=cols)
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=list(key))
        session.execute(stmt, list(rows))
        return len(rows)

    def write_metrics(
        self, session: Session, run_id: int, seq: int, m: MetricColumns
    ) -> dict[str, tuple[int, int]]:
        before = {}
        for key in m.keys:  # two index probes each (min and max alone each take one)
            series = select(Metric.step).where(Metric.run_id == run_id, Metric.key == key)
            lo = series.with_only_columns(func.min(Metric.step)).scalar_subquery()
            hi = series.with_only_columns(func.max(Metric.step)).scalar_subquery()
            extent = session.execute(select(lo, hi)).one()
            if extent[0] is not None:
                before[key] = (extent[0], extent[1])
        self.upsert(session, METRICS, m.rows(run_id, seq), METRIC_KEY)
        return before

    def write_rollouts(self, session: Session, run_id: int, r: RolloutColumns) -> int:
        # A step is one row: its stored rollouts that ``r`` does not replace are kept.
        s = RolloutStep
        stored = session.execute(
            select(s.step, s.group, s.index, s.reward, s.score, s.length, s.truncated)
            .where(s.run_id == run_id, s.step.in_(np.unique(r.step).tolist()))
            .order_by(s.step)
        )
        merged = r.over(RolloutColumns.from_step_rows(stored))
        self.upsert(session, ROLLOUT_STEPS, merged.step_rows(run_id), ROLLOUT_STEP_KEY)
        return len(r.step)

    def advance_run(
        self, session: Session, run_id: int, last_step: int, last_values: dict[str, float | None]
    ) -> dict[str, Any]:
        # Read-modify-write inside the same (locked) transaction.
        current = session.execute(select(Run.step, Run.summary).where(Run.id == run_id)).first()
        if current is None or last_step < current.step:
            return {}
        return {"step": last_step, "summary": {**(current.summary or {}), **last_values}}

    def extents(
        self, session: Session, run_ids: Sequence[int], keys: Sequence[str], first: int, last: int
    ) -> dict[SeriesKey, tuple[int, int]]:
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

    def aggregate(
        self, session: Session, width: int, ranges: Sequence[StepRange]
    ) -> dict[SeriesKey, Buckets]:
        m = Metric
        conds = [and_(m.run_id == r, m.key == k, m.step.between(lo, hi)) for r, k, lo, hi in ranges]
        bucket = (m.step // width).label("b")
        aggregates = (
            func.count(), func.avg(m.value), func.min(m.value), func.max(m.value),
            func.max(m.step), func.max(m.wall_time), func.count(m.value),
        )  # fmt: skip
        out: dict[SeriesKey, Buckets] = {}
        for chunk in chunks(conds):
            stmt = (
                select(m.run_id, m.key, bucket, *aggregates)
                .where(or_(*chunk))
                .group_by(m.run_id, m.key, bucket)
                .order_by(m.run_id, m.key, bucket)
            )
            collect(out, session.execute(stmt))
        return out

    def cached_buckets(
        self, session: Session, ranges: Sequence[BucketRange]
    ) -> dict[SeriesKey, Buckets]:
        r = MetricRollup
        mean = case((r.n_valid > 0, r.v_sum / r.n_valid), else_=None)
        cols = (r.bucket, r.n, mean, r.v_min, r.v_max, r.last_step, r.last_wall, r.n_valid)
        conds = [
            and_(r.run_id == run, r.key == key, r.width == w, r.bucket >= lo, r.bucket < hi)
            for run, key, w, lo, hi in ranges
        ]
        out: dict[SeriesKey, Buckets] = {}
        for chunk in chunks(conds):
            stmt = (
                select(r.run_id, r.key, *cols)
                .where(or_(*chunk))
                .order_by(r.run_id, r.key, r.bucket)
            )
            collect(out, session.execute(stmt))
        return out
