"""The baselines users compare ConSPO against, as registered objectives (docs/objectives.md §6).

Each is one function of the shared ``PolicyBatch`` plus one parameter model, like the objectives
of ``conspo.objectives``; the trainer never branches on them. Every design choice of a method is a
parameter (bounds and help text feed the form and docs/config.md). Shapes follow
``conspo.objectives``: B rollouts, T response positions, ``mask`` 1.0 on response tokens.

"Positive" is ``positive_mask`` of ``conspo.objectives`` everywhere, as in the objectives there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives import (
    LossAgg,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    _masked_seq_mean,
    _with_kl,
    aggregate_tokens,
    dense_group_index,
    group_advantages,
    segment_sum,
    token_ratio,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")

# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


class ClippedSurrogateParams(ObjectiveParams):
    """PPO's clipped token surrogate, shared by RLOO and REINFORCE++ (they differ in Â only)."""

    clip_low: float = Field(0.2, gt=0, le=1, description="ε_low: ratio clipped below at 1-ε_low.")
    clip_high: float = Field(0.2, gt=0, description="ε_high: ratio clipped above at 1+ε_high.")
    loss_agg: LossAgg = Field(
        "token-mean",
        description="How token losses are averaged: per-sequence then over sequences, over all"
        " tokens (the reference implementations' default), or token sums over max_new_tokens.",
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with ε = clip_high, the upper clip of its own token ratio."""
        view = super().separation_view(progress)
        return SeparationView(tau=view.tau, margin=view.margin, clip_eps=self.clip_high)


def clipped_surrogate(
    batch: PolicyBatch, advantages: torch.Tensor, clip_low: float, clip_high: float, agg: LossAgg
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clip fraction) of −agg_t min(ρ_t Â, clip(ρ_t, 1−ε_low, 1+ε_high) Â) (§1.2).

    advantages: (B,) one advantage per rollout, broadcast over its tokens. The clip fraction is
    the share of response tokens where the clipped term is the active one.
    """
    ratio = token_ratio(batch.logprobs, batch.old_logprobs, batch.mask)
    adv = advantages.to(ratio.dtype)[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    loss = aggregate_tokens(
        -torch.minimum(unclipped, clipped), batch.mask, agg, batch.max_response_len
    )
    was_clipped = (clipped < unclipped).to(ratio.dtype)
    return loss, aggregate_tokens(was_clipped, batch.mask, "token-mean", 1).detach()


def _finish(
    loss: torch.Tensor,
    stats: dict[str, torch.Tensor],
    batch: PolicyBatch,
    beta: float,
    agg: LossAgg,
) -> ObjectiveOutput:
    """The optional β·KL to the reference (§1.4) and the loss statistic every objective logs."""
    loss = _with_kl(loss, stats, batch, beta, agg)
    stats[metrics.LOSS] = loss.detach()
    return ObjectiveOutput(loss, stats)


def token_log_ratio(batch: PolicyBatch) -> torch.Tensor:
    """(B, T) log ρ_t = log π_θ − log π_old, 0 at padding; π_old = π_θ.detach() when absent."""
    old = batch.logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs
    zero = torch.zeros_like(batch.logprobs)
    return torch.where(batch.mask > 0, batch.logprobs - old, zero)


def _float_rewards(batch: PolicyBatch) -> torch.Tensor:
    r = batch.rewards
    return r if r.is_floating_point() else r.float()


def _group_sizes(group_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """((B,) dense group index of each rollout, (B,) size of each group slot)."""
    idx = dense_group_index(group_ids)
    n = group_ids.shape[0]
    return idx, segment_sum(torch.ones(n, dtype=dtype, device=group_ids.device), idx, n)


# --------------------------------------------------------------------------------------------
# RLOO
# --------------------------------------------------------------------------------------------


class RLOOParams(ClippedSurrogateParams):
    pass


def leave_one_out_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) RLOO advantages Â_i = r_i − (1/(G−1)) Σ_{j≠i} r_j over i's group (§6.1).

    A group of one rollout has no baseline and gets Â = 0.
    """
    idx, size = _group_sizes(group_ids, rewards.dtype)
    total = segment_sum(rewards, idx, rewards.shape[0])[idx]
    others = (size[idx] - 1).clamp_min(1)
    return torch.where(size[idx] > 1, rewards - (total - rewards) / others, 0.0)


@register_objective(
    "rloo",
    params=RLOOParams,
    description="RLOO: leave-one-out baseline Â = r − mean of the group's other rewards, in the"
    " clipped surrogate.",
    metrics=(metrics.CLIP_FRAC,),
)
def rloo_objective(batch: PolicyBatch, params: RLOOParams) -> ObjectiveOutput:
    """RLOO (Ahmadian et al., 2024) in the PPO-clip form of TRL / veRL / OpenRLHF (§6.1)."""
    adv = leave_one_out_advantages(_float_rewards(batch), batch.group_ids)
    loss, clip_frac = clipped_surrogate(
        batch, adv, params.clip_low, params.clip_high, params.loss_agg
    )
    return _finish(loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg)


# --------------------------------------------------------------------------------------------
# GSPO
# --------------------------------------------------------------------------------------------


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
    return _masked_seq_mean(token_log_ratio(batch), batch.mask).exp()


@register_objective(
    "gspo",
    params=GSPOParams,
    description="GSPO: sequence-level length-normalised ratio, clipped per sequence.",
    metrics=(metrics.CLIP_FRAC,),
)
def gspo_objective(batch: PolicyBatch, params: GSPOParams) -> ObjectiveOutput:
    """GSPO (Zheng et al., 2025): −mean_i min(s_i Â_i, clip(s_i, 1−ε_low, 1+ε_high) Â_i) (§6.2).

    Clip fraction: the share of response tokens whose sequence is clipped (veRL's convention).
    """
    adv = group_advantages(
        _float_rewards(batch),
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
    return _finish(loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, "seq-mean-token-mean")


# --------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------


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
)
def cispo_objective(batch: PolicyBatch, params: CISPOParams) -> ObjectiveOutput:
    """CISPO (MiniMax-M1, 2025): −agg_t sg(clip(ρ_t, 1−ε_low, 1+ε_high)) Â log π_θ(o_t) (§6.3).

    Clip fraction: the share of response tokens whose IS weight lies outside the clip range.
    """
    adv = group_advantages(
        _float_rewards(batch),
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
    return _finish(loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg)
