"""Pipelines: stage configs submitted as one unit (SFT → RL, SFT → DPO → RL), each stage's run
queued when the one before succeeds (``lifecycle.release_next_stage``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import chaining, lifecycle, run_inputs
from backend.api.body import JSONBodyRoute
from backend.api.deps import ClusterDep, CurrentUser, JobsDep, SessionDep, SettingsDep
from backend.models import Pipeline, Run, RunStatus
from backend.schemas import PipelineCreate, run_out

router = APIRouter(prefix="/pipelines", tags=["pipelines"], route_class=JSONBodyRoute)
PipelineId = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.post("", status_code=status.HTTP_201_CREATED)
def create(
    body: PipelineCreate,
    user: CurrentUser,
    session: SessionDep,
    jobs: JobsDep,
    settings: SettingsDep,
    cluster: ClusterDep,
) -> dict[str, Any]:
    """Queue stage 0; the later stages wait for the stage before them to succeed."""
    for i, config in enumerate(body.stages):
        loc = ("body", "stages", i)
        if i > 0 and config.model.from_run is not None:
            raise _stage_error(i, "a later stage starts from the previous stage's run; drop it")
        run_inputs.refuse_missing_software(config, session, settings, loc)
        run_inputs.refuse_unavailable(config, settings, loc)
        chaining.refuse_bad_start(config, session, settings, loc)
    pipeline, _ = lifecycle.queue_pipeline(
        session, jobs, user, body.name, body.stages, tags=body.tags
    )
    return pipeline_out(session, pipeline, cluster)


def _stage_error(stage: int, message: str) -> Exception:
    from fastapi.exceptions import RequestValidationError

    loc = ("body", "stages", stage, "model", "from_run")
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": message}])


@router.get("")
def list_pipelines(session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    pipelines = session.scalars(select(Pipeline).order_by(Pipeline.id.desc()).limit(200))
    return {"pipelines": [pipeline_out(session, p, cluster) for p in pipelines]}


@router.get("/{pipeline_id}")
def read(pipeline_id: PipelineId, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    pipeline = session.get(Pipeline, pipeline_id)
    if pipeline is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"pipeline {pipeline_id} not found")
    return pipeline_out(session, pipeline, cluster)


def pipeline_out(session: Session, pipeline: Pipeline, cluster: Any = None) -> dict[str, Any]:
    """The pipeline with one entry per stage: its run once it has one, else its config."""
    runs = {
        r.pipeline_stage: r
        for r in session.scalars(select(Run).where(Run.pipeline_id == pipeline.id))
    }
    stages = []
    for i, entry in enumerate(pipeline.stages):
        run = runs.get(i)
        config = entry["config"]
        stages.append(
            {
                "stage": i,
                "kind": config.get("kind", "rl"),
                "name": config.get("name"),
                "run": run_out(run, cluster) if run is not None else None,
                "waiting_for": None if run is not None or i == 0 else i - 1,
            }
        )
    return {
        "id": pipeline.id,
        "name": pipeline.name,
        "status": pipeline_status(pipeline, runs),
        "released": pipeline.released,
        "created_at": pipeline.created_at.timestamp(),
        "stages": stages,
    }


def pipeline_status(pipeline: Pipeline, runs: dict[int | None, Run]) -> str:
    """succeeded (every stage did), failed / cancelled (a stage did: the rest never run),
    running (a stage is), else queued."""
    statuses = [runs[i].status for i in sorted(k for k in runs if k is not None)]
    for stopped in (RunStatus.failed, RunStatus.cancelled):
        if stopped in statuses:
            return str(stopped)
    if len(statuses) == len(pipeline.stages) and statuses[-1] == RunStatus.succeeded:
        return "succeeded"
    return "running" if RunStatus.running in statuses or len(statuses) > 1 else "queued"
