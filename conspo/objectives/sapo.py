"""SAPO: a smooth sigmoid gate instead of the hard clip (docs/objectives.md §6.5)."""

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


class SAPOParams(ObjectiveParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage scaling, as GRPO's (SAPO uses the group std)."
    )
    tau_pos: float = Field(
        1.0,
        gt=0,
        le=100,
        description="Gate temperature τ_pos for positive advantages (paper: 1.0). Larger τ"
        " shuts off-policy tokens off faster.",
    )
    tau_neg: float = Field(
        1.05,
        gt=0,
        le=100,
        description="Gate temperature τ_neg for non-positive advantages (paper: 1.05 > τ_pos:"
        " negative updates are damped faster).",
    )
    loss_agg: LossAgg = Field(
        "seq-mean-token-mean",
        description="Token-loss averaging; the paper's (1/G) Σ_i (1/|o_i|) Σ_t is"
        " seq-mean-token-mean.",
    )


@register_objective(
    "sapo",
    params=SAPOParams,
    description="SAPO: a smooth sigmoid gate on each token ratio instead of a hard clip.",
    metrics=(metrics.SAPO_GATE_WEIGHT,),
    linear_on_policy=True,
)
def sapo_objective(batch: PolicyBatch, params: SAPOParams) -> ObjectiveOutput:
    """SAPO (Gao et al., 2025): −agg_t f(ρ_t) Â, f(ρ) = (4/τ) σ(τ(ρ − 1)) (§6.5).

    τ = τ_pos where Â > 0, else τ_neg. The gradient in log π is w·Â with w = 4σ(1−σ)ρ, which is 1
    at ρ = 1 (the policy gradient) and decays smoothly as ρ leaves 1; ``sapo/gate_weight`` logs
    the token-mean of w.
    """
    adv = group_advantages(
        float_rewards(batch),
        batch.group_ids,
        params.scale_rewards,
        batch_std=batch.batch_reward_std,
    )
    ratio = token_ratio(batch.logprobs, batch.old_logprobs, batch.mask)
    adv = adv.to(ratio.dtype)[:, None]
    tau = torch.where(adv > 0, adv.new_tensor(params.tau_pos), adv.new_tensor(params.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    per_token = -(4 / tau) * gate * adv
    loss = aggregate_tokens(per_token, batch.mask, params.loss_agg, batch.max_response_len)
    weight = (4 * gate * (1 - gate) * ratio).detach()
    stats = {metrics.SAPO_GATE_WEIGHT: aggregate_tokens(weight, batch.mask, "token-mean", 1)}
    return finish_objective(loss, stats, batch, params.beta, params.loss_agg)
