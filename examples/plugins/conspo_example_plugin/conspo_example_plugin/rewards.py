"""brevity: a reward for short completions, 1 at an empty one down to 0 at ``limit`` characters.

Give it a small weight beside the verifier's reward so that, of two right answers, the shorter wins.
"""

from __future__ import annotations

from pydantic import Field

from conspo.registry import register_reward
from conspo.rewards.base import RewardContext, RewardParams
from conspo.tasks.base import Example


class BrevityParams(RewardParams):
    limit: int = Field(64, ge=1, le=100_000, description="Characters at which it reaches 0.")


@register_reward(
    "brevity",
    params=BrevityParams,
    description="1 − length/limit, floored at 0: shorter completions score more (example plugin).",
    default_weight=0.1,
)
def brevity(
    completion: str, example: Example, context: RewardContext, params: BrevityParams
) -> float:
    return max(0.0, 1.0 - len(completion) / params.limit)
