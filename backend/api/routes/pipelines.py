"""Pipelines: stage configs submitted as one unit (SFT → RL, SFT → DPO → RL), each stage's run
queued when the one before succeeds (``lifecycle.release_next_stage``).

``GET /api/pipelines/{id}`` gives each stage's run, the checkpoint it started from and its
held-out evaluation at its first and last evaluated steps (so a chained stage's start can be read
beside its predecessor's end); ``POST /api/pipelines/{id}/cancel`` stops the current stage and
every later one (``lifecycle.cancel_pipeline``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import lifecycle
from backend.api.body import JSONBodyRoute
from backend.api.deps import (
    ClusterDep,
    CurrentUser,
    JobsDep,
    SessionDep,
    SettingsDep,
    refuse_unless_owner,
)
from backend.models import FINISHED, Metric, Pipeline, Run, RunStatus
from backend.schemas import PipelineCreate, run_out
from backend.submit_checks import Submitted, refuse_unfit

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
        if i > 0 and config.model.from_run is not None:
            raise _stage_error(i, "a later stage starts from the previous stage's run; drop it")
    stages = [Submitted(("body", "stages", i), c) for i, c in enumerate(body.stages)]
    refuse_unfit(session, settings, stages)
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


def get_pipeline(pipeline_id: PipelineId, session: SessionDep) -> Pipeline:
    pipeline = session.get(Pipeline, pipeline_id)
    if pipeline is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"pipeline {pipeline_id} not found")
    return pipeline


PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]


def get_owned_pipeline(pipeline: PipelineDep, user: CurrentUser) -> Pipeline:
    refuse_unless_owner(
        user,
        pipeline.owner_id,
        lambda: f"pipeline {pipeline.id} is not yours; only its owner or an admin may change it",
    )
    return pipeline


OwnedPipelineDep = Annotated[Pipeline, Depends(get_owned_pipeline)]


@router.get("/{pipeline_id}")
def read(pipeline: PipelineDep, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    return pipeline_out(session, pipeline, cluster)


@router.post("/{pipeline_id}/cancel")
def cancel(pipeline: OwnedPipelineDep, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    """The current stage's run is cancelled (queued: at once; running: the worker stops within
    seconds) and the later stages are never queued. A finished pipeline is left as it is."""
    runs = session.scalars(select(Run).where(Run.pipeline_id == pipeline.id)).all()
    if pipeline_status(pipeline, {r.pipeline_stage: r for r in runs}) in ENDED:
        return pipeline_out(session, pipeline, cluster)
    lifecycle.cancel_pipeline(session, pipeline)
    return pipeline_out(session, pipeline, cluster)


ENDED = ("succeeded", "failed", "cancelled")


def pipeline_out(session: Session, pipeline: Pipeline, cluster: Any = None) -> dict[str, Any]:
    """The pipeline with one entry per stage: its run once it has one, else its config; where
    the stage starts from (``from_run``, ``step``); its first and last held-out evaluation."""
    runs = {
        r.pipeline_stage: r
        for r in session.scalars(select(Run).where(Run.pipeline_id == pipeline.id))
    }
    overall = pipeline_status(pipeline, runs)
    stages = []
    for i, entry in enumerate(pipeline.stages):
        run = runs.get(i)
        config = run.config if run is not None else entry["config"]
        model = config.get("model", {})
        previous = runs.get(i - 1)
        stages.append(
            {
                "stage": i,
                "kind": config.get("kind", "rl"),
                "algorithm": config.get("algorithm") if config.get("kind", "rl") == "rl" else None,
                "name": config.get("name"),
                "run": run_out(run, cluster) if run is not None else None,
                "waiting_for": None if run is not None or i == 0 else i - 1,
                # a stage without a run in an ended pipeline never runs
                "skipped": run is None and overall in ENDED,
                "from": {
                    "run": model.get("from_run") or (previous.id if previous else None),
                    "step": model.get("step", "last"),
                    "base": model.get("name"),
                },
                "eval": stage_eval(session, run.id) if run is not None else None,
            }
        )
    return {
        "id": pipeline.id,
        "name": pipeline.name,
        "status": overall,
        "released": pipeline.released,
        "created_at": pipeline.created_at.timestamp(),
        "stages": stages,
    }


def stage_eval(session: Session, run_id: int) -> dict[str, Any] | None:
    """{start: {step, values}, end: {step, values}} of the run's held-out evaluation (``eval/*``
    keys) at its first and last evaluated steps; None before its first evaluation."""
    rows = session.execute(
        select(Metric.step, Metric.key, Metric.value)
        .where(Metric.run_id == run_id, Metric.key.startswith("eval/"))
        .order_by(Metric.step)
    ).all()
    if not rows:
        return None
    first, last = rows[0].step, rows[-1].step

    def at(step: int) -> dict[str, Any]:
        return {"step": step, "values": {r.key: r.value for r in rows if r.step == step}}

    return {"start": at(first), "end": at(last)}


def pipeline_status(pipeline: Pipeline, runs: dict[int | None, Run]) -> str:
    """succeeded (every stage did), failed / cancelled (a stage did, or the pipeline was
    cancelled: the rest never run), running (a stage is), else queued."""
    statuses = [runs[i].status for i in sorted(k for k in runs if k is not None)]
    for stopped in (RunStatus.failed, RunStatus.cancelled):
        if stopped in statuses:
            return str(stopped)
    if len(statuses) == len(pipeline.stages) and statuses[-1] == RunStatus.succeeded:
        return "succeeded"
    if pipeline.released == lifecycle.STOPPED:
        # cancelled while a stage was finishing anyway: stopping when it stops
        return "cancelled" if all(s in FINISHED for s in statuses) else "running"
    return "running" if RunStatus.running in statuses or len(statuses) > 1 else "queued"
