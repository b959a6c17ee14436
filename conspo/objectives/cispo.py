"""CISPO: clipped, stop-gradient importance weights on REINFORCE (docs/objectives.md §6.3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    LossAgg,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    aggregate_tokens,
    finish_objective,
    float_rewards,
    group_advantages,
    token_ratio,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class CISPOParams(ObjectiveParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage scaling, as GRPO's (MiniMax-M1 uses group-normalised Â)."
    )
    clip_low: float = Field(
        1.0,
        gt=0,
        le=1,
        description="ε_low^IS: IS weight clipped below at 1-ε_low. 1 = no lower bound, as in"
        " MiniMax-M1.",
    )
    clip_high: float = Field(
        0.28,
        gt=0,
        le=100,
        description="ε_high^IS: IS weight clipped above at 1+ε_high (the one MiniMax-M1 tunes;"
        " 0.28 is Trinity-RFT's default, the paper gives no value).",
    )
    loss_agg: LossAgg = Field(
        "token-mean", description="Token-loss averaging; CISPO divides by Σ|o_i| (token-mean)."
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with ε = clip_high: the upper clip of its IS weight."""
        view = super().separation_view(progress)
        return SeparationView(tau=view.tau, margin=view.margin, clip_eps=self.clip_high)


@register_objective(
    "cispo",
    params=CISPOParams,
    description="CISPO: REINFORCE with clipped, detached IS weights; no token is dropped.",
    metrics=(metrics.CLIP_FRAC,),
    linear_on_policy=True,
)
def cispo_objective(batch: PolicyBatch, params: CISPOParams) -> ObjectiveOutput:
    """CISPO (MiniMax-M1, 2025): −agg_t sg(clip(ρ_t, 1−ε_low, 1+ε_high)) Â log π_θ(o_t) (§6.3).

    Clip fraction: the share of response tokens whose IS weight lies outside the clip range.
    """
    adv = group_advantages(
        float_rewards(batch),
        batch.group_ids,
        params.scale_rewards,
        batch_std=batch.batch_reward_std,
    )
    ratio = token_ratio(batch.logprobs, batch.old_logprobs, batch.mask).detach()
    weight = ratio.clamp(1 - params.clip_low, 1 + params.clip_high)
    logprobs = torch.where(batch.mask > 0, batch.logprobs, torch.zeros_like(batch.logprobs))
    per_token = -weight * adv.to(ratio.dtype)[:, None] * logprobs
    loss = aggregate_tokens(per_token, batch.mask, params.loss_agg, batch.max_response_len)
    outside = (weight != ratio).to(ratio.dtype)
    clip_frac = aggregate_tokens(outside, batch.mask, "token-mean", 1)
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg
    )
