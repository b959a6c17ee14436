"""GMPO: the geometric mean of clipped token ratios (docs/objectives.md §6.4)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
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


class GMPOParams(ObjectiveParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage scaling, as GRPO's (GMPO uses the group std)."
    )
    clip_low: float = Field(
        0.4,
        gt=0,
        le=10,
        description="ε_low in log space: each token's log-ratio is clipped below at −ε_low"
        " (GMPO paper: 0.4, i.e. a ratio range of (e^-0.4, e^0.4)).",
    )
    clip_high: float = Field(
        0.4, gt=0, le=10, description="ε_high in log space: log-ratio clipped above at ε_high."
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with ε = e^ε_high − 1: its upper clip moved from log to ratio space."""
        view = super().separation_view(progress)
        return SeparationView(view.tau, view.margin, clip_eps=math.expm1(self.clip_high))


@register_objective(
    "gmpo",
    params=GMPOParams,
    description="GMPO: geometric mean of the token ratios, each clipped in log space.",
    metrics=(metrics.CLIP_FRAC,),
    linear_on_policy=True,
)
def gmpo_objective(batch: PolicyBatch, params: GMPOParams) -> ObjectiveOutput:
    """GMPO (Zhao et al., 2025): −mean_i Â_i exp((1/|o_i|) Σ_t ℓ_{i,t}) (§6.4), with

        ℓ = sgn(Â) · min(sgn(Â) log ρ_t, sgn(Â) clip(log ρ_t, −ε_low, ε_high))

    the pessimistic clip of each token's log-ratio. Clip fraction: the share of response tokens
    whose clipped log-ratio is the active one.
    """
    adv = group_advantages(
        float_rewards(batch),
        batch.group_ids,
        params.scale_rewards,
        batch_std=batch.batch_reward_std,
    )
    log_ratio = token_log_ratio(batch)
    adv = adv.to(log_ratio.dtype)
    sign = adv.sign()[:, None]
    clamped = log_ratio.clamp(-params.clip_low, params.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    loss = -(adv * masked_seq_mean(pessimistic, batch.mask).exp()).mean()
    was_clipped = (sign * clamped < sign * log_ratio).to(log_ratio.dtype)
    clip_frac = aggregate_tokens(was_clipped, batch.mask, "token-mean", 1).detach()
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, "seq-mean-token-mean"
    )
