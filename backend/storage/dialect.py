"""The storage statements whose SQL differs between PostgreSQL and SQLite, behind one interface.

Each dialect has one strategy object, made on an engine's first use and looked up from a
session's bind with ``strategies.dialect_of``; nothing else in the storage package looks at
the dialect's name. ``backend.storage.sqlite.SqliteDialect`` uses portable SQLAlchemy Core
statements; ``backend.storage.postgresql.PostgresDialect`` hand-written SQL that moves whole
columns as binary arrays through ``unnest`` and reads each series with its own index probes.

The values exchanged are plain: numpy columns in (``backend.storage.writes``), and
column-oriented buckets out (``Buckets``: one list per ``BUCKET_FIELDS`` name, in bucket order).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, NamedTuple

from sqlalchemy import ColumnElement, Table, delete, select
from sqlalchemy.orm import Session

from backend.models import MetricRollup
from backend.storage.columns import (
    ROLLUP_KEY,
    ROLLUPS,
    MetricColumns,
    RolloutColumns,
    RollupColumns,
    rollup_rows,
)

BUCKET_FIELDS = ("bucket", "n", "mean", "v_min", "v_max", "last_step", "last_wall", "n_valid")
Buckets = dict[str, list[Any]]  # one list per BUCKET_FIELDS name, in bucket order
SeriesKey = tuple[int, str]  # (run_id, key)


class StepRange(NamedTuple):
    """Steps ``lo``..``hi`` (both included) of one series."""

    run_id: int
    key: str
    lo: int
    hi: int


class BucketRange(NamedTuple):
    """Buckets ``lo``..``hi - 1`` of ``width`` steps of one series."""

    run_id: int
    key: str
    width: int
    lo: int
    hi: int


class JsonField(NamedTuple):
    """One field of a JSON column, typed: each expression is the field's value where the field
    holds that JSON type, else NULL (so a comparison with the wrong type never matches and a
    cast never fails on a row whose field is text)."""

    number: ColumnElement[Any]
    text: ColumnElement[Any]
    boolean: ColumnElement[Any]  # 'true' / 'false'


class Dialect(ABC):
    """Every storage operation whose SQL differs between dialects (one instance per engine)."""

    name: ClassVar[str]  # SQLAlchemy's name of the dialect

    @abstractmethod
    def json_field(self, column: ColumnElement[Any], names: Sequence[str]) -> JsonField:
        """The field at ``names`` (object keys, outermost first) of the JSON ``column``, with the
        path a bound parameter."""

    @abstractmethod
    def upsert(
        self,
        session: Session,
        table: Table,
        rows: Sequence[dict[str, Any]],
        key: Sequence[str],
        *,
        update: bool = True,
    ) -> int:
        """``INSERT … ON CONFLICT (key) DO UPDATE`` (or ``DO NOTHING``) of ``rows``; their count."""

    def insert_ignore(
        self, session: Session, table: Table, rows: Sequence[dict[str, Any]], key: Sequence[str]
    ) -> int:
        return self.upsert(session, table, rows, key, update=False)

    @abstractmethod
    def write_metrics(
        self, session: Session, run_id: int, seq: int, m: MetricColumns
    ) -> dict[str, tuple[int, int]]:
        """Upsert the points (at least one) with ``seq``; the caller holds the run row's lock.

        Returns each written key's (first, last) step before the write, where it had points.
        """

    @abstractmethod
    def write_rollouts(self, session: Session, run_id: int, r: RolloutColumns) -> int:
        """Upsert the rollouts (at least one) on (step, group, index); the caller holds the run
        row's lock. A step is one ``rollout_steps`` row: its stored rollouts that ``r`` does
        not replace stay in it (``RolloutColumns.over``). Returns ``r``'s count."""

    @abstractmethod
    def advance_run(
        self, session: Session, run_id: int, last_step: int, last_values: dict[str, float | None]
    ) -> dict[str, Any]:
        """Values for the run's UPDATE: ``step`` moves to ``last_step`` and ``last_values`` are
        merged into ``summary``, unless the run already stands past ``last_step``."""

    @abstractmethod
    def extents(
        self, session: Session, run_ids: Sequence[int], keys: Sequence[str], first: int, last: int
    ) -> dict[SeriesKey, tuple[int, int]]:
        """(run_id, key) -> (first, last step in (``first``, ``last``]) of the series with points
        (``run_ids`` and ``keys`` are not empty)."""

    @abstractmethod
    def aggregate(
        self, session: Session, width: int, ranges: Sequence[StepRange]
    ) -> dict[SeriesKey, Buckets]:
        """Buckets of ``width`` steps of the raw points in ``ranges`` (``mean`` of the non-NULL
        values), each series' in bucket order; series without points are absent."""

    def store_rollups(self, session: Session, width: int, ranges: Sequence[StepRange]) -> None:
        """Upsert the ``metric_rollups`` rows of every bucket of ``width`` in ``ranges`` (whole
        buckets), recomputed from their points."""
        rows: list[dict[str, Any]] = []
        for (run_id, key), buckets in self.aggregate(session, width, ranges).items():
            rows += rollup_rows(run_id, key, width, buckets, lambda b: True)
        self.upsert(session, ROLLUPS, rows, ROLLUP_KEY)

    def derive_rollups(
        self, session: Session, run_id: int, keys: Sequence[str], old: int, new: int
    ) -> set[tuple[str, int]]:
        """Delete the series' rollups of width ``old``; store each bucket of width ``new`` whose
        ``new // old`` buckets of width ``old`` are all there and full (``n == old``: a point at
        every step, so they hold every point of the wider bucket). Returns the (key, bucket)
        pairs stored."""
        R = MetricRollup
        factor = new // old
        groups: dict[tuple[str, int], list[Any]] = {}
        where = (R.run_id == run_id, R.width == old, R.key.in_(list(keys)))
        for row in session.execute(select(R).where(*where)).scalars():
            groups.setdefault((row.key, row.bucket // factor), []).append(row)
        rows = []
        for (key, bucket), parts in groups.items():
            if len(parts) == factor and all(p.n == old for p in parts):
                sums = [p.v_sum for p in parts if p.v_sum is not None]
                lows = [p.v_min for p in parts if p.v_min is not None]
                highs = [p.v_max for p in parts if p.v_max is not None]
                rows.append(
                    {
                        "run_id": run_id, "key": key, "width": new, "bucket": bucket,
                        "hi_step": (bucket + 1) * new - 1, "n": new,
                        "n_valid": sum(p.n_valid for p in parts),
                        "v_sum": sum(sums) if sums else None,
                        "v_min": min(lows) if lows else None,
                        "v_max": max(highs) if highs else None,
                        "last_step": max(p.last_step for p in parts),
                        "last_wall": max(p.last_wall for p in parts),
                    }
                )  # fmt: skip
        session.execute(delete(R).where(*where))
        self.upsert(session, ROLLUPS, rows, ROLLUP_KEY)
        return {(r["key"], r["bucket"]) for r in rows}

    def write_rollups(self, session: Session, run_id: int, rollups: RollupColumns) -> None:
        """Upsert ``metric_rollups`` rows computed by the caller (at least one)."""
        self.upsert(session, ROLLUPS, rollups.rows(run_id), ROLLUP_KEY)

    @abstractmethod
    def cached_buckets(
        self, session: Session, ranges: Sequence[BucketRange]
    ) -> dict[SeriesKey, Buckets]:
        """The ``metric_rollups`` rows in ``ranges`` (``mean`` = v_sum / n_valid), each series'
        in bucket order; series with none are absent."""


# Helpers of the implementations (chunks also serves the portable reads of backend.storage.series).


def empty_buckets() -> Buckets:
    return {f: [] for f in BUCKET_FIELDS}


def collect(out: dict[SeriesKey, Buckets], rows: Iterable[Sequence[Any]]) -> None:
    """Append rows of (run_id, key, *BUCKET_FIELDS) to each series' buckets in ``out``."""
    for run_id, key, *values in rows:
        series = out.get((run_id, key))
        if series is None:
            series = out[(run_id, key)] = empty_buckets()
        for name, value in zip(BUCKET_FIELDS, values, strict=True):
            series[name].append(value)


def chunks(items: list[Any], size: int = 200) -> Iterable[list[Any]]:
    """``items`` in runs of ``size``: an OR of more conditions nests too deep for SQLite."""
    for i in range(0, len(items), size):
        yield items[i : i + size]
