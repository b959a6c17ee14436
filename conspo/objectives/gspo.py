"""GSPO: the clipped surrogate on the sequence-level geometric-mean ratio
(docs/objectives.md §6.2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    aggregate_tokens,
    finish_objective,
    float_rewards,
    group_advantages,
    masked_seq_mean,
    token_log_ratio,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class GSPOParams(ObjectiveParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage scaling, as GRPO's (GSPO uses the group std)."
    )
    clip_low: float = Field(
        3e-4,
        gt=0,
        lt=1,
        description="ε_low of the sequence ratio (GSPO paper: 3e-4; the sequence ratio is a"
        " geometric mean, so its range is far narrower than a token ratio's).",
    )
    clip_high: float = Field(4e-4, gt=0, description="ε_high of the sequence ratio (paper: 4e-4).")


def sequence_ratio(batch: PolicyBatch) -> torch.Tensor:
    """(B,) GSPO's s_i = exp((1/|o_i|) Σ_t (log π_θ − log π_old)): the geometric-mean ratio."""
    return masked_seq_mean(token_log_ratio(batch), batch.mask).exp()


@register_objective(
    "gspo",
    params=GSPOParams,
    description="GSPO: sequence-level length-normalised ratio, clipped per sequence.",
    metrics=(metrics.CLIP_FRAC,),
    linear_on_policy=True,
)
def gspo_objective(batch: PolicyBatch, params: GSPOParams) -> ObjectiveOutput:
    """GSPO (Zheng et al., 2025): −mean_i min(s_i Â_i, clip(s_i, 1−ε_low, 1+ε_high) Â_i) (§6.2).

    Clip fraction: the share of response tokens whose sequence is clipped (veRL's convention).
    """
    adv = group_advantages(
        float_rewards(batch),
        batch.group_ids,
        params.scale_rewards,
        batch_std=batch.batch_reward_std,
    )
    s = sequence_ratio(batch)
    adv = adv.to(s.dtype)
    unclipped = s * adv
    clipped = s.clamp(1 - params.clip_low, 1 + params.clip_high) * adv
    loss = -torch.minimum(unclipped, clipped).mean()
    seq_clipped = (clipped < unclipped).to(s.dtype)[:, None].expand_as(batch.mask)
    clip_frac = aggregate_tokens(seq_clipped, batch.mask, "token-mean", 1).detach()
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, "seq-mean-token-mean"
    )
