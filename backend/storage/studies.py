"""Reading studies and their rows (the state changes are ``backend.studies.service``'s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import Run, RunStatus, Study, StudyRun, StudyRunState, StudyStatus

ACTIVE = (RunStatus.queued, RunStatus.running)


class PlanRow(NamedTuple):
    """A study's row as its progress counts it (``plan_rows``)."""

    study_id: int
    state: StudyRunState
    planned_steps: int  # its config's
    status: RunStatus | None  # its run's; None before it is released
    step: int | None
    total_steps: int | None


def list_studies(
    session: Session, limit: int, offset: int, ids: Sequence[int] | None = None
) -> tuple[list[Study], int]:
    """(one page of the studies, or of those among ``ids``, newest first; how many there are)."""
    chosen = [] if ids is None else [Study.id.in_(list(ids))]
    total = session.scalar(select(func.count()).select_from(Study).where(*chosen)) or 0
    rows = session.scalars(
        select(Study).where(*chosen).order_by(Study.id.desc()).limit(limit).offset(offset)
    )
    return list(rows.unique()), total


def active_study_ids(session: Session) -> list[int]:
    return list(session.scalars(select(Study.id).where(Study.status == StudyStatus.active)))


def study_of_run(session: Session, run_id: int) -> int | None:
    """The study ``run_id`` is a run of, if any."""
    return session.scalar(select(StudyRun.study_id).where(StudyRun.run_id == run_id))


def study_rows(session: Session, study_id: int) -> list[StudyRun]:
    """Its (arm, seed) rows in release order."""
    return list(
        session.scalars(
            select(StudyRun).where(StudyRun.study_id == study_id).order_by(StudyRun.position)
        )
    )


def pending_rows(session: Session, study_id: int, limit: int | None = None) -> list[StudyRun]:
    """Its rows not released yet, in release order (the first ``limit``)."""
    stmt = (
        select(StudyRun)
        .where(StudyRun.study_id == study_id, StudyRun.state == StudyRunState.pending)
        .order_by(StudyRun.position)
    )
    return list(session.scalars(stmt if limit is None else stmt.limit(limit)))


def active_runs(session: Session, study_id: int) -> int:
    """How many of its runs are queued or running."""
    busy = session.scalar(
        select(func.count())
        .select_from(StudyRun)
        .join(Run, Run.id == StudyRun.run_id)
        .where(StudyRun.study_id == study_id, Run.status.in_(ACTIVE))
    )
    return int(busy or 0)


def cancelled_from_outside(session: Session, study_id: int) -> list[int]:
    """Its runs cancelled without the study asking: a row still ``released`` (the study's own
    stops, its cancel and a search's pruner, mark theirs ``stopped``) whose run ended
    ``cancelled`` (its owner cancelled it from the runs list, the run page or the API)."""
    return list(
        session.scalars(
            select(Run.id)
            .join(StudyRun, StudyRun.run_id == Run.id)
            .where(
                StudyRun.study_id == study_id,
                StudyRun.state == StudyRunState.released,
                Run.status == RunStatus.cancelled,
            )
            .order_by(StudyRun.position)
        )
    )


def study_runs(session: Session, study_id: int) -> list[Run]:
    """Its released runs, in release order."""
    return list(
        session.scalars(
            select(Run)
            .join(StudyRun, StudyRun.run_id == Run.id)
            .where(StudyRun.study_id == study_id)
            .order_by(StudyRun.position)
        ).unique()
    )


def plan_rows(session: Session, study_ids: Sequence[int]) -> list[PlanRow]:
    """Every row of these studies (released or not, cancelled too) with its config's steps and
    its run's status and steps (None before it is released): what
    ``backend.studies.progress`` counts."""
    if not study_ids:
        return []
    rows = session.execute(
        select(
            StudyRun.study_id,
            StudyRun.state,
            StudyRun.config,
            Run.status,
            Run.step,
            Run.total_steps,
        )
        .outerjoin(Run, Run.id == StudyRun.run_id)
        .where(StudyRun.study_id.in_(list(study_ids)))
        .order_by(StudyRun.study_id, StudyRun.position)
    )
    return [
        PlanRow(study_id, state, int((config or {}).get("steps") or 0), status, step, total)
        for study_id, state, config, status, step, total in rows
    ]
