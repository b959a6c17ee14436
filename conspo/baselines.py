"""The baselines users compare ConSPO against, as registered objectives (docs/objectives.md §6).

Each is one function of the shared ``PolicyBatch`` plus one parameter model, like the objectives
of ``conspo.objectives``; the trainer never branches on them. Every design choice of a method is a
parameter (bounds and help text feed the form and docs/config.md). Shapes follow
``conspo.objectives``: B rollouts, T response positions, ``mask`` 1.0 on response tokens.

"Positive" is ``positive_mask`` of ``conspo.objectives`` everywhere, as in the objectives there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives import (
    PAPER_TAU,
    STD_EPS,
    GRPOParams,
    LossAgg,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    _group_counts,
    _masked_seq_mean,
    _with_kl,
    aggregate_tokens,
    dense_group_index,
    group_advantages,
    grpo_objective,
    positive_mask,
    segment_sum,
    sequence_scores,
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


# --------------------------------------------------------------------------------------------
# GMPO
# --------------------------------------------------------------------------------------------


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
)
def gmpo_objective(batch: PolicyBatch, params: GMPOParams) -> ObjectiveOutput:
    """GMPO (Zhao et al., 2025): −mean_i Â_i exp((1/|o_i|) Σ_t ℓ_{i,t}) (§6.4), with

        ℓ = sgn(Â) · min(sgn(Â) log ρ_t, sgn(Â) clip(log ρ_t, −ε_low, ε_high))

    the pessimistic clip of each token's log-ratio. Clip fraction: the share of response tokens
    whose clipped log-ratio is the active one.
    """
    adv = group_advantages(
        _float_rewards(batch),
        batch.group_ids,
        params.scale_rewards,
        batch_std=batch.batch_reward_std,
    )
    log_ratio = token_log_ratio(batch)
    adv = adv.to(log_ratio.dtype)
    sign = adv.sign()[:, None]
    clamped = log_ratio.clamp(-params.clip_low, params.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    loss = -(adv * _masked_seq_mean(pessimistic, batch.mask).exp()).mean()
    was_clipped = (sign * clamped < sign * log_ratio).to(log_ratio.dtype)
    clip_frac = aggregate_tokens(was_clipped, batch.mask, "token-mean", 1).detach()
    return _finish(loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, "seq-mean-token-mean")


# --------------------------------------------------------------------------------------------
# SAPO
# --------------------------------------------------------------------------------------------


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
)
def sapo_objective(batch: PolicyBatch, params: SAPOParams) -> ObjectiveOutput:
    """SAPO (Gao et al., 2025): −agg_t f(ρ_t) Â, f(ρ) = (4/τ) σ(τ(ρ − 1)) (§6.5).

    τ = τ_pos where Â > 0, else τ_neg. The gradient in log π is w·Â with w = 4σ(1−σ)ρ, which is 1
    at ρ = 1 (the policy gradient) and decays smoothly as ρ leaves 1; ``sapo/gate_weight`` logs
    the token-mean of w.
    """
    adv = group_advantages(
        _float_rewards(batch),
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
    return _finish(loss, stats, batch, params.beta, params.loss_agg)


# --------------------------------------------------------------------------------------------
# DisCO
# --------------------------------------------------------------------------------------------


class DisCOParams(ObjectiveParams):
    tau: float = Field(
        PAPER_TAU,
        gt=0,
        description="τ of the log-sum-exp over a group's negatives (authors: 10 for"
        " log-likelihood scores).",
    )
    delta: float = Field(
        1e-4,
        ge=0,
        description="δ: the KL budget between the rollout policy and the trained one (authors:"
        " 1e-4).",
    )
    penalty: float = Field(
        1e3,
        ge=0,
        description="β of the squared-hinge penalty (β/2)·max(0, KL − δ)² (authors: 1e3).",
    )
    negatives: Literal["log_sum_exp", "mean"] = Field(
        "log_sum_exp",
        description="How a group's negatives enter: τ·log mean exp(s⁻/τ) (DisCO), or the plain"
        " mean of s⁻ (DisCO-b).",
    )
    group_average: Literal["all_groups", "valid_groups"] = Field(
        "all_groups",
        description="Divide the summed group objectives by every group of the batch (the"
        " authors' code) or only by those with both outcomes.",
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with DisCO's own τ: its log-sum-exp is P⁺'s softmax at that τ."""
        view = super().separation_view(progress)
        return SeparationView(tau=self.tau, margin=view.margin, clip_eps=view.clip_eps)


def old_policy_kl(batch: PolicyBatch) -> torch.Tensor:
    """(B, T) k3 estimate of KL(π_old ‖ π_θ) per token: e^x − x − 1, x = log π_θ − log π_old.

    0 in value when π_old = π_θ (one optimiser pass per rollout batch), 0 at padding.
    """
    x = token_log_ratio(batch)
    return x.exp() - x - 1


def _group_log_mean_exp(
    values: torch.Tensor, members: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """(B,) per group slot: log mean_{j ∈ members of the group} e^{values_j}; 0 where a group
    has no members. Shifted by the group's detached max, with non-members at −inf before exp so
    no overflow reaches the backward pass."""
    n = values.shape[0]
    inside = torch.where(members, values, torch.full_like(values, -math.inf))
    shift = torch.full((n,), -math.inf, dtype=values.dtype, device=values.device)
    shift = shift.scatter_reduce(0, idx, inside.detach(), "amax", include_self=True)
    count = segment_sum(members.to(values.dtype), idx, n)
    shift = torch.where(count > 0, shift, torch.zeros_like(shift))
    sum_exp = segment_sum((inside - shift[idx]).exp(), idx, n)
    sum_exp = torch.where(count > 0, sum_exp, torch.ones_like(sum_exp))
    return sum_exp.log() + shift - count.clamp_min(1).log()


def disco_score_objective(
    scores: torch.Tensor, outcome: torch.Tensor, group_ids: torch.Tensor, params: DisCOParams
) -> torch.Tensor:
    """0-d DisCO J = (1/K) Σ_g [mean s⁺ − τ log mean_j e^{s_j⁻/τ}] over groups with both
    outcomes (§6.6); K = every group or only those, per ``group_average``. ``negatives="mean"``
    replaces the log-mean-exp by mean s⁻ (DisCO-b). Positives: verified ``outcome`` (§4.5)."""
    c = _group_counts(outcome, group_ids, scores.dtype)
    n = scores.shape[0]
    if params.group_average == "all_groups":
        k = (segment_sum(torch.ones_like(scores), c.idx, n) > 0).sum().to(scores.dtype)
    else:
        k = c.n_valid
    valid = c.valid[c.idx]
    pos_weight = torch.where(valid & c.pos, 1.0 / c.n_pos[c.idx].clamp_min(1), 0.0)
    if params.negatives == "mean":
        neg_weight = torch.where(valid & ~c.pos, 1.0 / c.n_neg[c.idx].clamp_min(1), 0.0)
        return ((pos_weight - neg_weight) * scores).sum() / k
    lme = params.tau * _group_log_mean_exp(scores / params.tau, ~c.pos, c.idx)
    return ((pos_weight * scores).sum() - torch.where(c.valid, lme, 0.0).sum()) / k


@register_objective(
    "disco",
    params=DisCOParams,
    description="DisCO: log-likelihood scores, log-sum-exp over a group's negatives, and a"
    " squared-hinge KL constraint to the rollout policy.",
    metrics=(metrics.DISCO_KL, metrics.DISCO_CONSTRAINT_ACTIVE),
)
def disco_objective(batch: PolicyBatch, params: DisCOParams) -> ObjectiveOutput:
    """DisCO (Li et al., 2025): −J + (β/2)·max(0, KL̂ − δ)² (§6.6).

    KL̂ is the token-mean over the batch of the k3 estimate of KL(π_old ‖ π_θ); its gradient
    β·max(0, KL̂ − δ)·∇KL̂ is the one the authors' code applies. Stats: disco/kl (KL̂),
    disco/constraint_active (1 when KL̂ > δ).
    """
    scores = sequence_scores(batch.logprobs, batch.mask)
    objective = disco_score_objective(scores, batch.outcome, batch.group_ids, params)
    kl = aggregate_tokens(old_policy_kl(batch), batch.mask, "token-mean", 1)
    excess = (kl - params.delta).clamp_min(0)
    loss = -objective + 0.5 * params.penalty * excess**2
    stats = {
        metrics.DISCO_KL: kl.detach(),
        metrics.DISCO_CONSTRAINT_ACTIVE: (kl > params.delta).to(kl.dtype).detach(),
    }
    return _finish(loss, stats, batch, params.beta, "token-mean")


# --------------------------------------------------------------------------------------------
# REINFORCE++
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# MCPO (designed from the abstract: docs/objectives.md §5.1)
# --------------------------------------------------------------------------------------------


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
)
def mcpo_objective(batch: PolicyBatch, params: MCPOParams) -> ObjectiveOutput:
    """MCPO as designed in §5.1: GRPO's clipped surrogate on Â·(1 + γ(2p̂ − 1)) for groups with
    ½ < p̂ < 1, plus λ_m · mean over mastered groups of the group-mean of max(0, KL̂_i − δ),
    KL̂_i the mean over rollout i's tokens of the k3 estimate of KL(π_old ‖ π_θ).

    The hinge has a gradient only once π_θ ≠ π_old (several updates per rollout batch).
    """
    rewards = _float_rewards(batch)
    c = _group_counts(batch.outcome, batch.group_ids, rewards.dtype)  # mastered: all verified
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
    kl = _masked_seq_mean(old_policy_kl(batch), batch.mask)  # (B,) KL̂_i
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
    return _finish(loss, stats, batch, params.beta, params.loss_agg)


# --------------------------------------------------------------------------------------------
# ISPO (designed from the abstract: docs/objectives.md §5.2)
# --------------------------------------------------------------------------------------------


class ISPOParams(GRPOParams):
    hinge_top_frac: float = Field(
        0.1,
        gt=0,
        le=1,
        description="k: share of a wrong rollout's tokens, highest entropy first (the decision"
        " tokens), that the confidence hinge looks at (at least one). Designed from the"
        " abstract.",
    )
    hinge_confidence: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="c: a decision token of a wrong rollout chosen with probability above c is"
        " pushed down. Designed from the abstract.",
    )
    hinge_weight: float = Field(
        0.05,
        ge=0,
        description="β_tok: weight of the confidence hinge in the loss. Designed from the"
        " abstract. The sequence signal is the `info_gain` reward (rewards).",
    )


def decision_tokens(entropy: torch.Tensor, mask: torch.Tensor, frac: float) -> torch.Tensor:
    """(B, T) bool: each row's ⌈frac·|o|⌉ (at least 1) response positions of highest entropy."""
    masked = torch.where(mask > 0, entropy.float(), torch.full_like(entropy.float(), -math.inf))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
    rank = order.argsort(-1)  # 0 = the highest entropy of the row
    k = (mask.sum(-1) * frac).ceil().clamp_min(1)
    return (rank < k[:, None]) & (mask > 0)


@register_objective(
    "ispo",
    params=ISPOParams,
    description="ISPO (designed from the abstract): GRPO + a hinge on confidently chosen decision"
    " tokens of wrong rollouts; its sequence signal is the info_gain reward.",
    metrics=(metrics.CLIP_FRAC, metrics.ISPO_HINGE_ACTIVE),
)
def ispo_objective(batch: PolicyBatch, params: ISPOParams) -> ObjectiveOutput:
    """ISPO's token part as designed in §5.2: GRPO (§1) plus β_tok · the mean, over the decision
    tokens of wrong rollouts (``decision_tokens``), of max(0, log π_θ(o_t) − log c).

    The denser sequence reward (β_seq · group-normalised information gain) reaches GRPO through
    ``batch.rewards`` when the run lists the ``info_gain`` reward.
    """
    if batch.entropy is None:
        raise ValueError("ispo needs the per-token entropy in PolicyBatch.entropy")
    out = grpo_objective(batch, params)
    wrong = ~positive_mask(batch.outcome)
    chosen = decision_tokens(batch.entropy, batch.mask, params.hinge_top_frac) & wrong[:, None]
    excess = (_upcast_logprobs(batch) - math.log(params.hinge_confidence)).clamp_min(0)
    n_chosen = chosen.sum().clamp_min(1)
    hinge = torch.where(chosen, excess, 0.0).sum() / n_chosen
    loss = out.loss + params.hinge_weight * hinge
    active = (chosen & (excess > 0)).sum() / n_chosen
    stats = {**out.stats, metrics.ISPO_HINGE_ACTIVE: active.to(excess.dtype).detach()}
    stats[metrics.LOSS] = loss.detach()
    return ObjectiveOutput(loss, stats)


def _upcast_logprobs(batch: PolicyBatch) -> torch.Tensor:
    return batch.logprobs.to(torch.promote_types(batch.logprobs.dtype, torch.float32))
