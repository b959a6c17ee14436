"""External logging: a trainer running elsewhere creates a run and logs batches into it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status

from backend.api.deps import CurrentUser, OwnedRunDep, SessionDep
from backend.crud import run_out
from backend.models import FINISHED, Run, RunStatus, utcnow
from backend.schemas import (
    MAX_LOG_POINTS,
    ExternalRunCreate,
    LogBatch,
    LogResult,
    RunOut,
)
from backend.storage.writes import RolloutPoint, StepPoints, write_points

router = APIRouter(prefix="/runs", tags=["external logging"])


@router.post("/external", status_code=status.HTTP_201_CREATED, response_model=RunOut)
def create_external(
    body: ExternalRunCreate, user: CurrentUser, session: SessionDep
) -> dict[str, Any]:
    """A run with status ``running`` that nothing queues; log into it with ``/log``."""
    now = utcnow()
    run = Run(
        name=body.name,
        owner_id=user.id,
        status=RunStatus.running,
        algorithm=body.algorithm,
        task=body.task,
        model=body.model,
        config=body.config,
        seed=int(body.config.get("seed", 0)) if isinstance(body.config.get("seed"), int) else 0,
        tags=list(dict.fromkeys(body.tags)),
        total_steps=body.total_steps or 0,
        started_at=now,
        heartbeat_at=now,
        external=True,
        summary={},
    )
    if not 0 <= run.seed < 2**63:
        run.seed = 0
    session.add(run)
    session.commit()
    session.refresh(run)
    return run_out(run)


@router.post("/{run_id}/log", response_model=LogResult)
def log_batch(run: OwnedRunDep, body: LogBatch, session: SessionDep) -> dict[str, int]:
    """Idempotent upsert of points on (run, key, step); at most 10,000 points per call."""
    if not run.external:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"run {run.id} is run by a worker; only external runs accept logged points",
        )
    if run.status in FINISHED:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"run {run.id} is {run.status}; it accepts no more points",
        )
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
    rollouts = [
        RolloutPoint(r.step, r.group, r.index, r.reward, r.score, r.length, r.truncated)
        for r in body.rollouts
    ]
    now = utcnow()
    values: dict[str, Any] = {"heartbeat_at": now}
    if body.status in ("succeeded", "failed"):
        values |= {"status": body.status, "finished_at": now}
    if body.error is not None:
        values["error"] = body.error
    written = write_points(session, run.id, steps, rollouts, run_values=values)
    session.commit()
    return {"written": written.points + written.rollouts}
