"""The ``verifier`` reward: the task's verify, the verified outcome O that every run has."""

from __future__ import annotations

from pydantic import BaseModel

from conspo.registry import register_reward
from conspo.rewards.base import VERIFIER, RewardContext, RewardParams
from conspo.tasks.base import Example


@register_reward(
    VERIFIER,
    params=RewardParams,
    description="The task's verifier: the verified outcome O (1 correct, 0 wrong). Every run has"
    " it; it alone decides who is positive.",
)
def verifier_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    return float(context.task.verify(completion, example))
