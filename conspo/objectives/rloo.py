"""RLOO: leave-one-out advantages in the clipped surrogate (docs/objectives.md §6.1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    ClippedSurrogateParams,
    ObjectiveOutput,
    PolicyBatch,
    clipped_surrogate,
    finish_objective,
    float_rewards,
    group_sizes,
    segment_sum,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class RLOOParams(ClippedSurrogateParams):
    pass


def leave_one_out_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) RLOO advantages Â_i = r_i − (1/(G−1)) Σ_{j≠i} r_j over i's group (§6.1).

    A group of one rollout has no baseline and gets Â = 0.
    """
    idx, size = group_sizes(group_ids, rewards.dtype)
    total = segment_sum(rewards, idx, rewards.shape[0])[idx]
    others = (size[idx] - 1).clamp_min(1)
    return torch.where(size[idx] > 1, rewards - (total - rewards) / others, 0.0)


@register_objective(
    "rloo",
    params=RLOOParams,
    description="RLOO: leave-one-out baseline Â = r − mean of the group's other rewards, in the"
    " clipped surrogate.",
    metrics=(metrics.CLIP_FRAC,),
    linear_on_policy=True,
    turn_credit=True,
)
def rloo_objective(batch: PolicyBatch, params: RLOOParams) -> ObjectiveOutput:
    """RLOO (Ahmadian et al., 2024) in the PPO-clip form of TRL / veRL / OpenRLHF (§6.1)."""
    adv = leave_one_out_advantages(float_rewards(batch), batch.group_ids)
    loss, clip_frac = clipped_surrogate(
        batch, adv, params.clip_low, params.clip_high, params.loss_agg
    )
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg
    )
