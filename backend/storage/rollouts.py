"""Per-rollout samples of a run, in (step, group, index) order."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Rollout


def query_rollouts(
    session: Session,
    run_id: int,
    step_min: int | None,
    step_max: int | None,
    limit: int,
) -> list[dict[str, Any]]:
    stmt = select(Rollout).where(Rollout.run_id == run_id)
    if step_min is not None:
        stmt = stmt.where(Rollout.step >= step_min)
    if step_max is not None:
        stmt = stmt.where(Rollout.step <= step_max)
    stmt = stmt.order_by(Rollout.step, Rollout.group, Rollout.index).limit(limit)
    return [
        {
            "step": r.step,
            "group": r.group,
            "index": r.index,
            "reward": r.reward,
            "score": r.score,
            "length": r.length,
            "truncated": r.truncated,
        }
        for r in session.scalars(stmt)
    ]
