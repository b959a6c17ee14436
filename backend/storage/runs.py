"""Reading the runs table: the filtered, sorted, paged runs list and the queue's order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import String, cast, func, select
from sqlalchemy.orm import Session

from backend.models import Run, RunStatus

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
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    order = [SORTS[sort], Run.id.desc() if sort == "-created_at" else Run.id.asc()]
    rows = session.scalars(stmt.order_by(*order).limit(limit).offset(offset)).unique()
    return list(rows), total


def queue_positions(session: Session) -> dict[int, int]:
    """Queued run id → its place in the queue (1 = next), in the order runs were sent."""
    ids = session.scalars(
        select(Run.id)
        .where(Run.status == RunStatus.queued, Run.cancel_requested.is_(False))
        .order_by(Run.enqueued_at.is_(None), Run.enqueued_at, Run.id)
    )
    return {rid: i for i, rid in enumerate(ids, 1)}


def runs_by_id(session: Session, ids: Sequence[int]) -> dict[int, Run]:
    """The stored runs among ``ids``, by id (a deleted one is absent)."""
    return {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(ids))).unique()}


def count_queued(session: Session) -> int:
    return count_in(session, RunStatus.queued)


def count_in(session: Session, status: RunStatus) -> int:
    """How many runs are in ``status``."""
    return session.scalar(select(func.count()).where(Run.status == status)) or 0


def stale_running(session: Session, beat_before: datetime) -> list[int]:
    """Ids of running runs whose last heartbeat is older than ``beat_before``."""
    stmt = select(Run.id).where(Run.status == RunStatus.running, Run.heartbeat_at < beat_before)
    return list(session.scalars(stmt))
