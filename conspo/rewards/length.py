"""The ``length`` reward: DAPO's soft overlong penalty (also what an objective's
params.overlong_buffer / overlong_penalty become: conspo.config)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from conspo.registry import register_reward
from conspo.rewards.base import RewardContext, RewardParams
from conspo.tasks.base import Example


class LengthParams(RewardParams):
    buffer: int = Field(
        8,
        ge=1,
        le=32_768,
        description="L_cache: length of the penalty zone before sampling.max_new_tokens (must be"
        " smaller than it). The penalty's size at the cap is the reward's weight.",
    )


@register_reward(
    "length",
    params=LengthParams,
    description="DAPO's soft overlong penalty: 0 up to max_new_tokens − buffer tokens, then"
    " linear down to −1 at max_new_tokens (times the weight). It counts the model's own tokens,"
    " as len/* does: a tool's output, which max_new_tokens bounds too, is not the model's"
    " length.",
)
def length_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    assert isinstance(params, LengthParams)
    start = context.max_new_tokens - params.buffer
    return -min(max(context.length - start, 0) / params.buffer, 1.0)
