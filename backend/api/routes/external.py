"""External logging: a trainer running elsewhere creates a run and logs batches into it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from pydantic_core import to_json

from backend.api.body import JSONBodyRoute
from backend.api.contract import refusals
from backend.api.deps import CurrentUser, OwnedRunDep, SessionDep
from backend.api.query import JSONBytes
from backend.models import RunStatus, utcnow
from backend.runs import lifecycle
from backend.schemas import (
    MAX_LOG_POINTS,
    ExternalRunCreate,
    LogBatch,
    LogResult,
    RunOut,
    run_out,
)
from backend.storage.prompts import PromptPoint
from backend.storage.writes import RolloutPoint, StepPoints, write_points

router = APIRouter(prefix="/runs", tags=["external logging"], route_class=JSONBodyRoute)


@router.post("/external", status_code=status.HTTP_201_CREATED, response_model=RunOut)
def create_external(
    body: ExternalRunCreate, user: CurrentUser, session: SessionDep
) -> dict[str, Any]:
    """A run with status ``running`` that nothing queues; log into it with ``/log``."""
    run = lifecycle.open_external(
        session,
        user,
        name=body.name,
        config=body.config,
        algorithm=body.algorithm,
        task=body.task,
        model=body.model,
        tags=body.tags,
        total_steps=body.total_steps,
    )
    return run_out(run)


@router.post(
    "/{run_id}/log",
    response_model=LogResult,
    responses=refusals({409: "The run is run by a worker, or finished: it accepts no points."}),
)
def log_batch(run: OwnedRunDep, body: LogBatch, session: SessionDep) -> Response:
    """Idempotent upsert of points on (run, key, step), rollouts on (run, step, group, index)
    and prompt pass rates on (run, step, key); at most 10,000 points and 10,000 prompts per
    call."""
    lifecycle.check_accepts_points(run)
    points = sum(len(s.metrics) for s in body.steps)
    if points > MAX_LOG_POINTS:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=[
                {
                    "loc": ["body", "steps"],
                    "msg": f"{points} points in one call; the limit is {MAX_LOG_POINTS}",
                    "type": "too_long",
                }
            ],
        )
    steps = [StepPoints(s.step, dict(s.metrics), s.wall_time) for s in body.steps]
    rollouts = [RolloutPoint.model_validate(r, from_attributes=True) for r in body.rollouts]
    prompts = [PromptPoint(p.step, p.key, p.n, p.correct) for p in body.prompts]
    values: dict[str, Any] = {"heartbeat_at": utcnow()}
    if body.error is not None:
        values["error"] = body.error
    written = write_points(session, run.id, steps, rollouts, prompts=prompts, run_values=values)
    if body.status in ("succeeded", "failed"):  # in the same transaction as the last points
        lifecycle.close_external(session, run.id, RunStatus(body.status), body.error)
    session.commit()
    # encoded here, in the handler's thread: a dict would be checked against LogResult in
    # another worker-thread call
    return JSONBytes(to_json({"written": written.points + written.rollouts + written.prompts}))
