"""brevity: a reward for short completions, 1 at an empty one down to 0 at ``limit`` characters.

Give it a small weight beside the verifier's reward so that, of two right answers, the shorter wins.

few_turns: in a run that plays an environment, 1 for an episode of one turn down to 0 at
``max_turns``; it reads the episode the rollout played (``example.data["episode"]``).
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


class FewTurnsParams(RewardParams):
    max_turns: int = Field(10, ge=1, le=1_000, description="Turns at which it reaches 0.")


@register_reward(
    "few_turns",
    params=FewTurnsParams,
    description="1 at a one-turn episode down to 0 at max_turns: fewer turns score more"
    " (example plugin; 0 where the rollout played no environment).",
    default_weight=0.1,
)
def few_turns(
    completion: str, example: Example, context: RewardContext, params: FewTurnsParams
) -> float:
    episode = example.data.get("episode")
    if episode is None or not episode.turns:
        return 0.0
    return max(0.0, 1.0 - (episode.turn_count - 1) / params.max_turns)
