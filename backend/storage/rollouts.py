"""Per-rollout samples of a run, in (step, group, index) order."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from backend.models import Rollout, RolloutText


def query_rollouts(
    session: Session,
    run_id: int,
    step_min: int | None,
    step_max: int | None,
    limit: int,
    text: bool = False,
) -> list[dict[str, Any]]:
    """The rollouts of steps ``step_min``..``step_max``; with ``text``, each with its prompt and
    completion ("" when none was stored)."""
    if text:
        return _with_text(session, run_id, step_min, step_max, limit)
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


def _row(r: Rollout) -> dict[str, Any]:
    return {
        "step": r.step,
        "group": r.group,
        "index": r.index,
        "reward": r.reward,
        "score": r.score,
        "length": r.length,
        "truncated": r.truncated,
    }


def _with_text(
    session: Session, run_id: int, step_min: int | None, step_max: int | None, limit: int
) -> list[dict[str, Any]]:
    on = and_(
        RolloutText.run_id == Rollout.run_id,
        RolloutText.step == Rollout.step,
        RolloutText.group == Rollout.group,
        RolloutText.index == Rollout.index,
    )
    stmt = (
        select(Rollout, RolloutText.prompt, RolloutText.completion)
        .outerjoin(RolloutText, on)
        .where(Rollout.run_id == run_id)
    )
    if step_min is not None:
        stmt = stmt.where(Rollout.step >= step_min)
    if step_max is not None:
        stmt = stmt.where(Rollout.step <= step_max)
    stmt = stmt.order_by(Rollout.step, Rollout.group, Rollout.index).limit(limit)
    return [
        {**_row(r), "prompt": prompt or "", "completion": completion or ""}
        for r, prompt, completion in session.execute(stmt)
    ]
