"""Pipelines: stage configs submitted as one unit (SFT → RL, SFT → DPO → RL), each stage's run
queued when the one before succeeds (``backend.pipelines``).

``POST /api/pipelines/{id}/cancel`` stops the current stage and every later one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, status

from backend.api.body import JSONBodyRoute
from backend.api.contract import QUEUE_DOWN, STARTS_FROM_UNSHARED, refusals
from backend.api.deps import (
    ClusterDep,
    CurrentUser,
    JobsDep,
    OwnedPipelineDep,
    PipelineDep,
    SessionDep,
    SettingsDep,
)
from backend.pipelines import service
from backend.runs.submit import Submitted, refuse_unfit
from backend.schemas import NotePatch, PipelineCreate, PipelineList, PipelineOut
from backend.storage import pipelines as stored

router = APIRouter(prefix="/pipelines", tags=["pipelines"], route_class=JSONBodyRoute)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PipelineOut,
    responses=refusals({403: STARTS_FROM_UNSHARED, 503: QUEUE_DOWN}),
)
def create(
    body: PipelineCreate,
    user: CurrentUser,
    session: SessionDep,
    jobs: JobsDep,
    settings: SettingsDep,
    cluster: ClusterDep,
) -> dict[str, Any]:
    """Queue stage 0; the later stages wait for the stage before them to succeed."""
    service.check_stages(body.stages, ("body", "stages"))
    stages = [Submitted(("body", "stages", i), c) for i, c in enumerate(body.stages)]
    refuse_unfit(session, settings, stages, user)
    pipeline, _ = service.queue_pipeline(
        session, jobs, user, body.name, body.stages, tags=body.tags
    )
    return service.pipeline_view(session, pipeline, cluster)


@router.get("", response_model=PipelineList)
def list_pipelines(session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    pipelines = stored.list_pipelines(session)
    return {"pipelines": [service.pipeline_view(session, p, cluster) for p in pipelines]}


@router.get("/{pipeline_id}", response_model=PipelineOut)
def read(pipeline: PipelineDep, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    return service.pipeline_view(session, pipeline, cluster)


@router.patch("/{pipeline_id}", response_model=PipelineOut)
def patch(
    pipeline: OwnedPipelineDep, body: NotePatch, session: SessionDep, cluster: ClusterDep
) -> dict[str, Any]:
    """Set the pipeline's note (Markdown; the owner or an admin)."""
    pipeline.note = body.note
    session.commit()
    return service.pipeline_view(session, pipeline, cluster)


@router.post(
    "/{pipeline_id}/cancel",
    response_model=PipelineOut,
    responses=refusals({409: "The pipeline has ended (its status is named): nothing to cancel."}),
)
def cancel(pipeline: OwnedPipelineDep, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    """The current stage's run is cancelled (queued: at once; running: the worker stops within
    seconds) and the later stages are never queued. A finished pipeline is a 409."""
    service.cancel_pipeline(session, pipeline)
    return service.pipeline_view(session, pipeline, cluster)
