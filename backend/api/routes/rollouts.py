"""Per-rollout samples (score, reward, length) for the positive/negative distributions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from backend.api.deps import RunDep, SessionDep
from backend.schemas import INT32_MAX, RolloutList
from backend.storage.rollouts import query_rollouts

router = APIRouter(tags=["rollouts"])
StepQ = Annotated[int | None, Query(ge=0, le=INT32_MAX)]


@router.get(
    "/runs/{run_id}/rollouts", response_model=RolloutList, response_model_exclude_unset=True
)
def rollouts(
    run: RunDep,
    session: SessionDep,
    step_min: StepQ = None,
    step_max: StepQ = None,
    limit: Annotated[int, Query(ge=1, le=50_000)] = 5_000,
    text: Annotated[
        bool,
        Query(
            description="Include each rollout's prompt and completion text (at most 2,000"
            ' characters each; "" when none was stored).'
        ),
    ] = False,
) -> dict[str, Any]:
    return {"items": query_rollouts(session, run.id, step_min, step_max, limit, text)}
