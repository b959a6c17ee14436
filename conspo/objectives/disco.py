"""DisCO: a discriminative score objective with a KL trust region to the old policy
(docs/objectives.md §6.6).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    PAPER_TAU,
    KLEstimator,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    aggregate_tokens,
    finish_objective,
    group_counts,
    old_policy_kl,
    segment_sum,
    sequence_scores,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


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
    kl_estimator: KLEstimator = Field(
        "k3",
        description="Estimator of KL̂ in the constraint: k3 (e^x − x − 1, low variance, never"
        " negative) or k1 (log π_old − log π_θ, the authors' code: ppo_kl_type kl).",
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
    c = group_counts(outcome, group_ids, scores.dtype)
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

    KL̂ is the token-mean over the batch of the k3 (or, ``kl_estimator: k1``, the authors' k1)
    estimate of KL(π_old ‖ π_θ); its gradient
    β·max(0, KL̂ − δ)·∇KL̂ is the one the authors' code applies. Stats: disco/kl (KL̂),
    disco/constraint_active (1 when KL̂ > δ).
    """
    scores = sequence_scores(batch.logprobs, batch.mask)
    objective = disco_score_objective(scores, batch.outcome, batch.group_ids, params)
    kl = aggregate_tokens(old_policy_kl(batch, params.kl_estimator), batch.mask, "token-mean", 1)
    excess = (kl - params.delta).clamp_min(0)
    loss = -objective + 0.5 * params.penalty * excess**2
    stats = {
        metrics.DISCO_KL: kl.detach(),
        metrics.DISCO_CONSTRAINT_ACTIVE: (kl > params.delta).to(kl.dtype).detach(),
    }
    return finish_objective(loss, stats, batch, params.beta, "token-mean")
