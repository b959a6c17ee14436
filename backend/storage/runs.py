"""Reading the runs table: the filtered, sorted, paged runs list and the queue's order."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, String, case, cast, false, func, literal, or_, select
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import Session

from backend.models import Metric, Run, RunStatus
from backend.runs.where import Condition, MetricSummary, Order
from backend.storage.strategies import dialect_of

RunSort = Literal["created_at", "-created_at", "name", "status", "id"]
SORTS: dict[str, Any] = {
    "created_at": Run.created_at.asc(),
    "-created_at": Run.created_at.desc(),
    "name": Run.name.asc(),
    "status": Run.status.asc(),
    "id": Run.id.asc(),
}


@dataclass(frozen=True)
class RunFilter:
    """Each given field narrows the list (all of them: AND)."""

    status: str | None = None
    kind: str | None = None
    algorithm: str | None = None
    task: str | None = None
    tag: str | None = None
    group_id: str | None = None
    name_contains: str | None = None
    ids: Sequence[int] | None = None
    # backend.runs.where's conditions on config fields and metric summaries
    conditions: Sequence[Condition] = ()
    order: Order | None = None  # backend.runs.where.parse_order: before ``sort``


def list_runs(
    session: Session, where: RunFilter, sort: RunSort, limit: int, offset: int
) -> tuple[list[Run], int]:
    """(one page of the runs matching ``where``, how many match in all)."""
    stmt = select(Run)
    for column, value in (
        (Run.status, where.status),
        (Run.kind, where.kind),
        (Run.algorithm, where.algorithm),
        (Run.task, where.task),
        (Run.group_id, where.group_id),
    ):
        if value:
            stmt = stmt.where(column == value)
    if where.ids is not None:
        stmt = stmt.where(Run.id.in_(where.ids))
    if where.name_contains:
        stmt = stmt.where(
            func.lower(Run.name).contains(where.name_contains.lower(), autoescape=True)
        )
    if where.tag:
        # tags is a JSON list; match the quoted element in its text (portable across dialects).
        stmt = stmt.where(cast(Run.tags, String).contains(json.dumps(where.tag), autoescape=True))
    for condition in where.conditions:
        stmt = stmt.where(_condition(session, condition))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    order = [SORTS[sort], Run.id.desc() if sort == "-created_at" else Run.id.asc()]
    if where.order is not None:
        order = [*_order(session, where.order), *order]
    rows = session.scalars(stmt.order_by(*order).limit(limit).offset(offset)).unique()
    return list(rows), total


def _order(session: Session, o: Order) -> list[Any]:
    """ORDER BY terms of ``o``: a metric summary, or a config field (its numbers, then its
    text); runs without it last, whichever the direction."""
    columns = _order_columns(session, o)
    return [c.desc().nulls_last() if o.descending else c.asc().nulls_last() for c in columns]


def order_values(session: Session, o: Order, ids: Sequence[int]) -> dict[int, Any]:
    """Run id → its value of what ``o`` orders by (a config field's number, else its text; a
    summary's number), for ``ids``: the list shows the value it is ordered by."""
    if not ids:
        return {}
    columns = _order_columns(session, o)
    rows = session.execute(select(Run.id, *columns).where(Run.id.in_(ids))).all()
    return {row[0]: next((v for v in row[1:] if v is not None), None) for row in rows}


def _order_columns(session: Session, o: Order) -> list[Any]:
    if isinstance(o.left, MetricSummary):
        return [_summary(o.left)]
    field = dialect_of(session).json_field(Run.__table__.c.config, o.left.names)
    return [field.number, field.text]


def _summary(s: MetricSummary) -> Any:
    """The run's ``best``/``max``/``min``/``last`` of a metric (NULL when it has none)."""
    of_run = (Metric.run_id == Run.id, Metric.key == s.key)
    if s.summary == "last":
        return (
            select(Metric.value)
            .where(*of_run)
            .order_by(Metric.step.desc())
            .limit(1)
            .scalar_subquery()
        )
    summary = func.min if s.summary == "min" else func.max
    return select(summary(Metric.value)).where(*of_run).scalar_subquery()


def _condition(session: Session, c: Condition) -> ColumnElement[bool]:
    """SQL for one parsed condition; every name and value a bound parameter."""
    left: Any
    value: Any = c.value
    if isinstance(c.left, MetricSummary):
        left = _summary(c.left)
    else:
        field = dialect_of(session).json_field(Run.__table__.c.config, c.left.names)
        if isinstance(c.value, bool):
            left, value = field.boolean, "true" if c.value else "false"
        elif isinstance(c.value, float):
            left = field.number
        else:
            left = field.text
    # A run without the field or the metric has NULL there: no comparison matches it.
    return {
        "=": left == value,
        "!=": left != value,
        "<": left < value,
        "<=": left <= value,
        ">": left > value,
        ">=": left >= value,
    }[c.op]


def config_path_stored(session: Session, names: Sequence[str]) -> bool:
    """Whether some run's config holds a number, a text or a boolean at ``names``.

    Only configs whose text holds the last name are read as JSON: a row written behind the
    API's back that the database cannot read as JSON (NaN, an unpaired surrogate) breaks this
    query only if it holds that name, and then the answer is yes (it cannot be said to be
    absent), never an error."""
    field = dialect_of(session).json_field(Run.__table__.c.config, names)
    mentions = cast(Run.config, String).contains(json.dumps(names[-1]), autoescape=True)
    held = or_(field.number.is_not(None), field.text.is_not(None), field.boolean.is_not(None))
    try:
        found = session.scalar(select(Run.id).where(case((mentions, held), else_=false())).limit(1))
    except (DataError, OperationalError):
        return True
    return found is not None


def metric_key_stored(session: Session, key: str) -> bool:
    """Whether some run has a point of ``key``.

    A probe of each run on the metrics' primary key (run_id, key, step), stopping at the first
    run that has one: the cost the list's own ``best(key)`` pays. Not ``WHERE key = ?`` alone,
    which no index leads with: a key that no run has (the case this asks about) would read every
    point. The LIMIT keeps the subquery per run (a database may not turn it into a join)."""
    has_one = (
        select(literal(1)).where(Metric.run_id == Run.id, Metric.key == key).limit(1)
    ).scalar_subquery()
    return session.scalar(select(Run.id).where(has_one.is_not(None)).limit(1)) is not None


def recent_metric_keys(session: Session, runs: int = 200) -> set[str]:
    """The keys the ``runs`` latest runs logged (their summaries hold each key's last value):
    what a misspelt key is compared with, beside the catalogue's."""
    summaries = session.scalars(select(Run.summary).order_by(Run.id.desc()).limit(runs))
    return {key for summary in summaries if isinstance(summary, dict) for key in summary}


def queue_positions(session: Session) -> dict[int, int]:
    """Queued run id → its place in the queue (1 = next), in the order runs were sent."""
    ids = session.scalars(
        select(Run.id)
        .where(Run.status == RunStatus.queued, Run.cancel_requested.is_(False))
        .order_by(Run.enqueued_at.is_(None), Run.enqueued_at, Run.id)
    )
    return {rid: i for i, rid in enumerate(ids, 1)}


IDS_PER_QUERY = 500  # ids in one IN (...) list: a long one is read in several queries


def runs_by_id(session: Session, ids: Iterable[int]) -> dict[int, Run]:
    """The stored runs among ``ids``, by id (a deleted one is absent)."""
    out: dict[int, Run] = {}
    for batch in _batches(ids):
        out |= {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(batch))).unique()}
    return out


def columns_of(
    session: Session, ids: Iterable[int], names: Sequence[str]
) -> dict[int, tuple[Any, ...]]:
    """Run id → the values of its columns ``names``, for the stored runs among ``ids``."""
    columns = [getattr(Run, name) for name in names]
    out: dict[int, tuple[Any, ...]] = {}
    for batch in _batches(ids):
        for row in session.execute(select(Run.id, *columns).where(Run.id.in_(batch))):
            out[row[0]] = tuple(row[1:])
    return out


def columns_updated_since(
    session: Session, since: datetime, names: Sequence[str]
) -> dict[int, tuple[Any, ...]]:
    """Run id → the values of its columns ``names``, for the runs updated since ``since``, in
    the order they were updated."""
    columns = [getattr(Run, name) for name in names]
    query = select(Run.id, *columns).where(Run.updated_at >= since).order_by(Run.updated_at)
    return {row[0]: tuple(row[1:]) for row in session.execute(query)}


def _batches(ids: Iterable[int]) -> Iterator[list[int]]:
    ordered = sorted(set(ids))
    for start in range(0, len(ordered), IDS_PER_QUERY):
        yield ordered[start : start + IDS_PER_QUERY]


def count_queued(session: Session) -> int:
    return count_in(session, RunStatus.queued)


def count_in(session: Session, status: RunStatus) -> int:
    """How many runs are in ``status``."""
    return session.scalar(select(func.count()).where(Run.status == status)) or 0


def stale_running(session: Session, beat_before: datetime) -> list[int]:
    """Ids of running runs whose last heartbeat is older than ``beat_before``."""
    stmt = select(Run.id).where(Run.status == RunStatus.running, Run.heartbeat_at < beat_before)
    return list(session.scalars(stmt))


def finished_worker_runs(session: Session) -> list[Run]:
    """The worker runs that succeeded, newest first (the model registry's candidates)."""
    stmt = (
        select(Run)
        .where(Run.status == RunStatus.succeeded, Run.external.is_(False))
        .order_by(Run.id.desc())
    )
    return list(session.scalars(stmt).unique())


def config_of(session: Session, run_id: int) -> dict[str, Any] | None:
    """The stored config of ``run_id`` (None: no such run)."""
    return session.scalar(select(Run.config).where(Run.id == run_id))
