"""REINFORCE++: advantages whitened over the whole rollout batch instead of per group
(docs/objectives.md §6.7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    STD_EPS,
    ClippedSurrogateParams,
    ObjectiveOutput,
    PolicyBatch,
    _finish,
    _float_rewards,
    clipped_surrogate,
    group_advantages,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class ReinforcePPParams(ClippedSurrogateParams):
    baseline: Literal["none", "group_mean"] = Field(
        "none",
        description="none: REINFORCE++ (the reward itself); group_mean: REINFORCE++-baseline"
        " (the reward minus its group's mean) before the batch normalisation.",
    )
    normalize: bool = Field(
        True,
        description="Whiten advantages over every response token of the mini-batch (the global"
        " normalisation REINFORCE++ is built on; off only for ablations).",
    )


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    baseline: Literal["none", "group_mean"],
    normalize: bool,
) -> torch.Tensor:
    """(B,) REINFORCE++ advantages (§6.7): a_i = r_i (or r_i − mean of its group), then
    (a_i − μ)/σ with μ, σ the token-weighted mean and population std over the batch's tokens
    (each rollout counts |o_i| times, as OpenRLHF whitens per token). σ <= STD_EPS gives 0.
    """
    a = rewards if baseline == "none" else group_advantages(rewards, group_ids, "none")
    if not normalize:
        return a
    weight = mask.sum(-1).to(a.dtype)
    total = weight.sum().clamp_min(1)
    mean = (weight * a).sum() / total
    std = ((weight * (a - mean) ** 2).sum() / total).sqrt()
    return torch.where(std > STD_EPS, (a - mean) / std.clamp_min(STD_EPS), torch.zeros_like(a))


@register_objective(
    "reinforce_pp",
    params=ReinforcePPParams,
    description="REINFORCE++: advantages normalised over the whole batch instead of per group"
    " (baseline=group_mean: REINFORCE++-baseline), in the clipped surrogate.",
    metrics=(metrics.CLIP_FRAC,),
)
def reinforce_pp_objective(batch: PolicyBatch, params: ReinforcePPParams) -> ObjectiveOutput:
    """REINFORCE++ (Hu, 2025; OpenRLHF) with outcome rewards: the clipped surrogate (§1.2) on
    batch-whitened advantages (§6.7)."""
    adv = reinforce_pp_advantages(
        _float_rewards(batch), batch.group_ids, batch.mask, params.baseline, params.normalize
    )
    loss, clip_frac = clipped_surrogate(
        batch, adv, params.clip_low, params.clip_high, params.loss_agg
    )
    return _finish(loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg)
