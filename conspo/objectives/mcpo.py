"""MCPO, designed from the abstract (docs/objectives.md §5.1): GRPO's clipped surrogate with
advantages scaled by the group's pass rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    ObjectiveOutput,
    PolicyBatch,
    clipped_surrogate,
    finish_objective,
    float_rewards,
    group_advantages,
    group_counts,
    masked_seq_mean,
    old_policy_kl,
)
from conspo.objectives.grpo import GRPOParams
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class MCPOParams(GRPOParams):
    mastery_weight: float = Field(
        1.0,
        ge=0,
        description="λ_m: weight of the hinge-KL on mastered (all-correct) groups. Designed from"
        " the abstract.",
    )
    mastery_delta: float = Field(
        0.01,
        ge=0,
        description="δ: KL(π_old ‖ π_θ) per token a mastered rollout may drift before the"
        " hinge acts. Designed from the abstract.",
    )
    majority_gamma: float = Field(
        1.0,
        ge=0,
        description="γ: advantages of majority-correct groups (½ < p̂ < 1) are multiplied by"
        " 1 + γ(2p̂ − 1). Designed from the abstract.",
    )


@register_objective(
    "mcpo",
    params=MCPOParams,
    description="MCPO (designed from the abstract): GRPO + a hinge-KL to π_old on mastered"
    " groups + extra weight on majority-correct groups.",
    metrics=(metrics.CLIP_FRAC, metrics.MCPO_KL_MASTERED, metrics.MCPO_HINGE_ACTIVE),
    linear_on_policy=True,
)
def mcpo_objective(batch: PolicyBatch, params: MCPOParams) -> ObjectiveOutput:
    """MCPO as designed in §5.1: GRPO's clipped surrogate on Â·(1 + γ(2p̂ − 1)) for groups with
    ½ < p̂ < 1, plus λ_m · mean over mastered groups of the group-mean of max(0, KL̂_i − δ),
    KL̂_i the mean over rollout i's tokens of the k3 estimate of KL(π_old ‖ π_θ).

    The hinge has a gradient only once π_θ ≠ π_old (several updates per rollout batch).
    """
    rewards = float_rewards(batch)
    c = group_counts(batch.outcome, batch.group_ids, rewards.dtype)  # mastered: all verified
    size = (c.n_pos + c.n_neg).clamp_min(1)
    p_hat = c.n_pos / size
    boost = torch.where(
        (p_hat > 0.5) & (p_hat < 1), 1 + params.majority_gamma * (2 * p_hat - 1), 1.0
    )
    adv = group_advantages(
        rewards, batch.group_ids, params.scale_rewards, batch_std=batch.batch_reward_std
    )
    loss, clip_frac = clipped_surrogate(
        batch, adv * boost[c.idx], params.clip_low, params.clip_high, params.loss_agg
    )
    kl = masked_seq_mean(old_policy_kl(batch), batch.mask)  # (B,) KL̂_i
    mastered = ((c.n_neg == 0) & (c.n_pos > 0))[c.idx]  # (B,) rollout of a mastered group
    n_mastered_groups = ((c.n_neg == 0) & (c.n_pos > 0)).sum().clamp_min(1)
    hinge = (kl - params.mastery_delta).clamp_min(0)
    group_share = torch.where(mastered, 1.0 / size[c.idx], 0.0).to(kl.dtype)
    loss = loss + params.mastery_weight * (group_share * hinge).sum() / n_mastered_groups
    n_mastered = mastered.sum().clamp_min(1)
    stats = {
        metrics.CLIP_FRAC: clip_frac,
        metrics.MCPO_KL_MASTERED: (torch.where(mastered, kl, 0.0).sum() / n_mastered).detach(),
        metrics.MCPO_HINGE_ACTIVE: ((mastered & (kl > params.mastery_delta)).sum() / n_mastered).to(
            kl.dtype
        ),
    }
    return finish_objective(loss, stats, batch, params.beta, params.loss_agg)
