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
    WholeBatch,
    clipped_surrogate,
    finish_objective,
    float_rewards,
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
        description="Whiten advantages over every response token of the rollout batch (the"
        " global normalisation REINFORCE++ is built on; off only for ablations).",
    )


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    baseline: Literal["none", "group_mean"],
    normalize: bool,
    whole: WholeBatch | None = None,
) -> torch.Tensor:
    """(B,) REINFORCE++ advantages (§6.7): a_i = r_i (or r_i − mean of its group), then
    (a_i − μ)/σ with μ, σ the token-weighted mean and population std over the rollout batch's
    tokens (each rollout counts |o_i| times, as OpenRLHF whitens per token). σ <= STD_EPS
    gives 0. ``whole``: the rollout batch this mini-batch is part of (μ and σ are its, as
    OpenRLHF computes them once per batch before splitting it); None: this batch is all of it.
    Groups are never split across mini-batches, so a group's mean is the same in either.
    """

    def centred(r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return r if baseline == "none" else group_advantages(r, g, "none")

    a = centred(rewards, group_ids)
    if not normalize:
        return a
    if whole is None:
        ref, weight = a, mask.sum(-1).to(a.dtype)
    else:
        ref = centred(whole.rewards.to(a.dtype), whole.group_ids)
        weight = whole.lengths.to(a.dtype)
    total = weight.sum().clamp_min(1)
    mean = (weight * ref).sum() / total
    std = ((weight * (ref - mean) ** 2).sum() / total).sqrt()
    mean, std = mean.to(a.device), std.to(a.device)
    return torch.where(std > STD_EPS, (a - mean) / std.clamp_min(STD_EPS), torch.zeros_like(a))


@register_objective(
    "reinforce_pp",
    params=ReinforcePPParams,
    description="REINFORCE++: advantages normalised over the whole batch instead of per group"
    " (baseline=group_mean: REINFORCE++-baseline), in the clipped surrogate.",
    metrics=(metrics.CLIP_FRAC,),
    linear_on_policy=True,
    turn_credit=True,
)
def reinforce_pp_objective(batch: PolicyBatch, params: ReinforcePPParams) -> ObjectiveOutput:
    """REINFORCE++ (Hu, 2025; OpenRLHF) with outcome rewards: the clipped surrogate (§1.2) on
    batch-whitened advantages (§6.7)."""
    adv = reinforce_pp_advantages(
        float_rewards(batch),
        batch.group_ids,
        batch.mask,
        params.baseline,
        params.normalize,
        batch.whole,
    )
    loss, clip_frac = clipped_surrogate(
        batch, adv, params.clip_low, params.clip_high, params.loss_agg
    )
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg
    )
