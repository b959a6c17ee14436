"""How hard each prompt was over training: pass-rate bands per step and learned / forgotten /
never-solved / always-solved counts (``backend.storage.prompts`` defines them)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from backend.api.deps import RunDep, SessionDep
from backend.schemas import INT32_MAX, PromptDifficulty
from backend.storage.prompts import prompt_difficulty

router = APIRouter(tags=["prompts"])


@router.get("/runs/{run_id}/prompts", response_model=PromptDifficulty)
def prompts(
    run: RunDep,
    session: SessionDep,
    step_min: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    step_max: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
    max_steps: Annotated[int, Query(ge=1, le=10_000)] = 2_000,
) -> dict[str, Any]:
    """Counts for the steps with prompt data in [step_min, step_max], at most ``max_steps``
    of them; ``next_step_min`` starts the next page. The fates count every prompt since the
    run's first step, whatever ``step_min`` is. Empty lists: the run logged no prompt data."""
    return prompt_difficulty(session, run.id, step_min, step_max, max_steps)
