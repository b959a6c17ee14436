"""Reading pipelines and their stage runs (the state changes are ``backend.pipelines``')."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Pipeline, Run


def list_pipelines(session: Session, limit: int = 200) -> list[Pipeline]:
    """The newest ``limit`` pipelines, newest first."""
    return list(session.scalars(select(Pipeline).order_by(Pipeline.id.desc()).limit(limit)))


def stage_runs(session: Session, pipeline_id: int) -> dict[int | None, Run]:
    """The pipeline's runs by stage."""
    runs = session.scalars(select(Run).where(Run.pipeline_id == pipeline_id))
    return {r.pipeline_stage: r for r in runs}
