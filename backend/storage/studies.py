"""Reading studies and their rows (the state changes are ``backend.studies.service``'s)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import Run, RunStatus, Study, StudyRun, StudyRunState, StudyStatus

ACTIVE = (RunStatus.queued, RunStatus.running)


def list_studies(session: Session, limit: int, offset: int) -> tuple[list[Study], int]:
    """(one page of the studies, newest first; how many there are)."""
    total = session.scalar(select(func.count()).select_from(Study)) or 0
    rows = session.scalars(select(Study).order_by(Study.id.desc()).limit(limit).offset(offset))
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


def planned_progress(session: Session, study_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Per study, its progress against the planned work: ``runs`` planned (cancelled rows are
    no longer planned), ``started`` (released into runs), ``steps`` done and ``total_steps``
    planned (a pending row counts its config's steps). A runs list that sees only the released
    runs would otherwise show a study as further along than it is."""
    out = {i: {"runs": 0, "started": 0, "steps": 0, "total_steps": 0} for i in study_ids}
    if not study_ids:
        return out
    rows = session.execute(
        select(StudyRun.study_id, StudyRun.state, StudyRun.config, Run.step, Run.total_steps)
        .outerjoin(Run, Run.id == StudyRun.run_id)
        .where(StudyRun.study_id.in_(list(study_ids)))
    )
    for study_id, state, config, step, total in rows:
        if state == StudyRunState.cancelled:
            continue
        p = out[study_id]
        p["runs"] += 1
        p["started"] += total is not None
        p["steps"] += int(step or 0)
        p["total_steps"] += int(total if total is not None else (config or {}).get("steps") or 0)
    return out
