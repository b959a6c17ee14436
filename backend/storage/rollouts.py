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
    return [_row(r) for r in session.scalars(stmt)]


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


def _text_of() -> Any:
    """The join of a rollout to its stored prompt and completion."""
    return and_(
        RolloutText.run_id == Rollout.run_id,
        RolloutText.step == Rollout.step,
        RolloutText.group == Rollout.group,
        RolloutText.index == Rollout.index,
    )


def stored_texts(session: Session, run_id: int) -> list[tuple[str, str, float | None]]:
    """(prompt, completion, reward) of every rollout of ``run_id`` stored with its text, in
    (step, group, index) order (a job kind's inputs: DPO pairs from a run)."""
    rows = session.execute(
        select(RolloutText.prompt, RolloutText.completion, Rollout.reward)
        .join(Rollout, _text_of())
        .where(RolloutText.run_id == run_id)
        .order_by(RolloutText.step, RolloutText.group, RolloutText.index)
    )
    return [(prompt, completion, reward) for prompt, completion, reward in rows]


def _with_text(
    session: Session, run_id: int, step_min: int | None, step_max: int | None, limit: int
) -> list[dict[str, Any]]:
    stmt = (
        select(Rollout, RolloutText.prompt, RolloutText.completion)
        .outerjoin(RolloutText, _text_of())
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
