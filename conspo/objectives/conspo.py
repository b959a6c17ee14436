"""ConSPO (arXiv:2605.12969): group-wise InfoNCE on length-normalised log-prob scores with a margin
curriculum, and the paper's ablation switches (docs/objectives.md §2).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    PAPER_CLIP,
    PAPER_MARGIN_MAX,
    PAPER_MARGIN_WARMUP,
    PAPER_TAU,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    clipped_ratio_scores,
    clipped_surrogate,
    group_counts,
    margin_at,
    segment_sum,
    sequence_scores,
    with_kl,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class ConSPOParams(ObjectiveParams):
    tau: float = Field(PAPER_TAU, gt=0, description="InfoNCE temperature τ (paper default 10).")
    margin_max: float = Field(
        PAPER_MARGIN_MAX, ge=0, description="Final margin M (paper default 0.01)."
    )
    margin_warmup: float = Field(
        PAPER_MARGIN_WARMUP,
        gt=0,
        le=1,
        description="α: fraction of training over which the margin rises from 0 to M"
        " (half-cosine).",
    )
    contrast: Literal["infonce", "linear"] = Field(
        "infonce",
        description="Ablation: InfoNCE contrast, or the linear mean s⁺ − mean s⁻.",
    )
    score: Literal["logprob", "clipped_ratio"] = Field(
        "logprob",
        description="Ablation: length-normalised log-prob scores, or GRPO's clipped-ratio scores.",
    )
    margin: Literal["cosine", "fixed", "none"] = Field(
        "cosine",
        description="Ablation: half-cosine curriculum, fixed m=M, or no margin.",
    )
    clip: float = Field(
        PAPER_CLIP,
        gt=0,
        lt=1,
        description="ε used by score=clipped_ratio (ignored for logprob scores).",
        # When the parameter is used, in the metric catalogue's condition syntax: the runs list
        # shows no ε for a run with log-prob scores.
        json_schema_extra={"needs": "params.score=clipped_ratio"},
    )

    def separation_view(self, progress: float) -> SeparationView:
        """ConSPO's own τ, its effective m_t (``margin`` ablation switch) and its ε."""
        margin = effective_margin(self, progress)
        return SeparationView(tau=self.tau, margin=margin, clip_eps=self.clip, clip_low=self.clip)


def effective_margin(params: ConSPOParams, progress: float) -> float:
    """m_t under the ``margin`` ablation switch: cosine curriculum, fixed M, or none (0)."""
    if params.margin == "cosine":
        return margin_at(progress, margin_max=params.margin_max, warmup=params.margin_warmup)
    if params.margin == "fixed":
        return params.margin_max
    return 0.0


def conspo_score_loss(
    scores: torch.Tensor,
    outcome: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    tau: float,
    margin: float,
) -> torch.Tensor:
    """0-d ConSPO loss −J, J of Eq. 13 of arXiv:2605.12969, averaged over valid groups (§2).

    Per group with N⁺ > 0 and N⁻ > 0 and ŝ_i = s_i⁺ − m:

        −J(q) = (τ/N⁺) Σ_i [ logsumexp({ŝ_i/τ} ∪ {s_j⁻/τ}_j) − ŝ_i/τ ]

    Each positive competes only with the group's negatives. scores, outcome (verified, {0, 1}),
    group_ids: (B,); group ids are arbitrary integers. All-positive / all-negative groups
    contribute 0; with no valid group the result is a 0 that still depends on ``scores``
    (backward works).
    """
    c = group_counts(outcome, group_ids, scores.dtype)
    n = scores.shape[0]
    logits = scores / tau
    # log Σ_j e^{s_j⁻/τ} per group, shifted by the group's (detached) max negative logit.
    # Positives enter as −inf *before* exp so no overflow can turn into 0·inf = NaN in backward.
    neg_logits = torch.where(c.pos, torch.full_like(logits, -math.inf), logits)
    shift = torch.full((n,), -math.inf, dtype=logits.dtype, device=logits.device)
    shift = shift.scatter_reduce(0, c.idx, neg_logits.detach(), "amax", include_self=True)
    shift = torch.where(c.n_neg > 0, shift, torch.zeros_like(shift))
    sum_exp = segment_sum((neg_logits - shift[c.idx]).exp(), c.idx, n)
    # Groups without negatives get log(1): finite and unused (weight 0), never log(0).
    sum_exp = torch.where(c.n_neg > 0, sum_exp, torch.ones_like(sum_exp))
    lse_neg = sum_exp.log() + shift  # (B,) per group slot
    pos_logits = (scores - margin) / tau
    per_rollout = tau * (torch.logaddexp(pos_logits, lse_neg[c.idx]) - pos_logits)  # −τ log P⁺
    use = c.pos & c.valid[c.idx]
    weight = torch.where(use, 1.0 / (c.n_pos[c.idx].clamp_min(1) * c.n_valid), 0.0)
    return (weight * per_rollout).sum()


def linear_contrast_loss(
    scores: torch.Tensor, outcome: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """0-d loss −mean_groups(mean s⁺ − mean s⁻) over valid groups (the `contrast: linear` ablation).

    scores, outcome (verified, {0, 1}), group_ids: (B,). All-positive / all-negative groups
    contribute 0.
    """
    c = group_counts(outcome, group_ids, scores.dtype)
    n_own = torch.where(c.pos, c.n_pos[c.idx], c.n_neg[c.idx]).clamp_min(1)
    sign = torch.where(c.pos, 1.0, -1.0).to(scores.dtype)
    weight = torch.where(c.valid[c.idx], sign / (n_own * c.n_valid), 0.0)
    return -(weight * scores).sum()


@register_objective(
    "conspo",
    params=ConSPOParams,
    description="ConSPO: group-wise InfoNCE on length-normalised log-prob scores with a margin"
    " curriculum.",
    turn_credit=True,
)
def conspo_objective(batch: PolicyBatch, params: ConSPOParams) -> ObjectiveOutput:
    """ConSPO (Eq. 13 of arXiv:2605.12969) with the paper's ablation switches (§2).

    score: logprob s_θ(o) or GRPO's clipped-ratio scores; contrast: InfoNCE with margin m_t or
    the linear mean s⁺ − mean s⁻; margin: cosine curriculum at ``batch.progress``, fixed M, or 0.
    Batch loss = mean over valid groups; optional β·KL (token-mean k3). Stats: loss, kl.
    """
    if params.score == "logprob":
        scores = sequence_scores(batch.logprobs, batch.mask)
    else:
        scores = clipped_ratio_scores(
            batch.logprobs, batch.old_logprobs, batch.mask, batch.outcome, params.clip
        )
    if params.contrast == "infonce":
        margin = effective_margin(params, batch.progress)
        loss = conspo_score_loss(
            scores, batch.outcome, batch.group_ids, tau=params.tau, margin=margin
        )
    else:
        loss = linear_contrast_loss(scores, batch.outcome, batch.group_ids)
    if batch.turn_advantages is not None:
        # Per-turn credit: the contrast ranks whole rollouts, the turn-level advantages move
        # each turn's tokens beside it (GiGPO's step term, in the clipped token surrogate).
        zero = torch.zeros_like(batch.rewards, dtype=torch.float32)
        turn_loss, _ = clipped_surrogate(batch, zero, params.clip, params.clip, "token-mean")
        loss = loss + turn_loss
    stats: dict[str, torch.Tensor] = {}
    loss = with_kl(loss, stats, batch, params.beta, "token-mean")
    stats[metrics.LOSS] = loss.detach()
    return ObjectiveOutput(loss, stats)
