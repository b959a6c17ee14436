"""RRPO, reference-relative advantages (arXiv:2607.18470, Xiong et al.), as far as its summary
states it: verified rollouts build a positive and a negative anchor set, a projection head is
trained contrastively on them and frozen, and each rollout's advantage is its group-centred
score against the anchors (docs/objectives.md §10, which marks every step that was inferred:
the paper's text could not be read from here).

    head = train_projection(features, positive, params, seed)   # once, on the anchors; frozen
    scores = anchor_scores(head, features)                       # (B,) s(o) = z·(c⁺ − c⁻)
    loss = rrpo_objective(batch, params).loss                    # clipped surrogate on Â

The trainer (``conspo.training.anchors``) draws the anchors from the first ``anchor_steps``
steps' rollouts, trains and freezes the head, and from then on fills ``PolicyBatch.
anchor_scores``; until then the advantages are GRPO's group-normalised verifier advantages.

Shapes: B rollouts, T response positions, M anchors, H the reference model's hidden size, P the
projection's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    LossAgg,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    clipped_surrogate,
    dense_group_index,
    finish_objective,
    float_rewards,
    group_advantages,
    positive_mask,
    segment_sum,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class RRPOParams(ObjectiveParams):
    anchor_steps: int = Field(
        2,
        ge=1,
        le=1000,
        description="Steps 1 … k collect anchors from their verified rollouts (the policy"
        " trains on GRPO's verifier advantages meanwhile); the projection head is trained on"
        " them at the end of step k, or of the first later step by which both sets hold"
        " min_anchors, and frozen.",
    )
    anchors_per_stratum: int = Field(
        4,
        ge=1,
        le=256,
        description="Stratified anchors: from each prompt's group at most this many positives"
        " and this many negatives become anchors (the first ones sampled), so that prompts"
        " the policy always solves cannot fill the positive set alone.",
    )
    max_anchors: int = Field(
        2048,
        ge=2,
        le=16_384,
        description="At most this many anchors in all (the first collected): they are kept in"
        " memory and in every checkpoint, M × hidden size floats.",
    )
    min_anchors: int = Field(
        4,
        ge=1,
        le=10_000,
        description="Each anchor set needs at least this many rollouts before the head is"
        " trained; collection goes on past anchor_steps until both have them.",
    )
    projection_dim: int = Field(
        64, ge=1, le=4096, description="P: the projection head's output size (H → P, linear)."
    )
    head_steps: int = Field(
        200,
        ge=1,
        le=10_000,
        description="Full-batch Adam steps of the head's contrastive loss on the anchors.",
    )
    head_lr: float = Field(1e-2, gt=0, le=10, description="The head's Adam learning rate.")
    anchor_temperature: float = Field(
        0.1,
        gt=0,
        le=100,
        description="τ_a of the contrastive loss: each anchor's cosine to its own set's centre"
        " against the other set's, divided by τ_a.",
    )
    verifier_weight: float = Field(
        0.0,
        ge=0,
        le=100,
        description="w: once the head is frozen Â = (s − mean_group s) + w · Â_GRPO, the"
        " verifier's group-normalised advantage. 0 is the advantage as the paper's summary"
        " states it (the anchor score alone).",
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="ε_low: ratio clipped below at 1-ε_low.")
    clip_high: float = Field(0.2, gt=0, description="ε_high: ratio clipped above at 1+ε_high.")
    loss_agg: LossAgg = Field(
        "seq-mean-token-mean", description="How the policy's token losses are averaged."
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with RRPO's own clip range [1 − ε_low, 1 + ε_high]."""
        default = super().separation_view(progress)
        return replace(default, clip_eps=self.clip_high, clip_low=self.clip_low)


@dataclass(frozen=True)
class ProjectionHead:
    """The frozen head: standardise the features by the anchors' own mean and std, project by
    ``weight``, normalise; ``centre`` is c⁺ − c⁻, the difference of the two anchor sets' unit
    centres in that space."""

    mean: torch.Tensor  # (H,)
    std: torch.Tensor  # (H,)
    weight: torch.Tensor  # (H, P)
    centre: torch.Tensor  # (P,)


def projected(
    features: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """(B, P) unit-norm projections z of ``features`` (B, H): standardised by ``mean`` and
    ``std`` (H,), mapped by ``weight`` (H, P)."""
    z = ((features.float() - mean) / std) @ weight
    return torch.nn.functional.normalize(z, dim=-1)


def set_centres(z: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c⁺, c⁻): the unit means of the positive and the negative rows of ``z`` (M, P)."""
    pos = z[positive].mean(0)
    neg = z[~positive].mean(0)
    normalize = torch.nn.functional.normalize
    return normalize(pos, dim=0), normalize(neg, dim=0)


def contrastive_loss(z: torch.Tensor, positive: torch.Tensor, temperature: float) -> torch.Tensor:
    """0-d: each anchor's cross-entropy of its own set against the other, over the logits
    (z·c⁺, z·c⁻)/τ_a, averaged within each set and then over the two (so an unbalanced pair of
    sets weighs alike). ``z``: (M, P) unit rows; ``positive``: (M,) bool."""
    c_pos, c_neg = set_centres(z, positive)
    logits = torch.stack([z @ c_pos, z @ c_neg], dim=-1) / temperature
    target = (~positive).long()  # column 0 is the positive set's
    each = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    return 0.5 * (each[positive].mean() + each[~positive].mean())


def train_projection(
    features: torch.Tensor,
    positive: torch.Tensor,
    params: RRPOParams,
    seed: int,
    between_steps: Callable[[], None] | None = None,
) -> tuple[ProjectionHead, list[float]]:
    """The head trained on the anchors ``features`` (M, H) with labels ``positive`` (M,) bool
    (both sets non-empty): a Gaussian start drawn from ``seed``, ``params.head_steps`` full-batch
    Adam steps on ``contrastive_loss``; returns the frozen head and the loss before the first and
    after the last step. Float32 on the features' device; deterministic for one seed.
    ``between_steps`` is called before each step (the trainer's cancel check)."""
    if bool(positive.all()) or not bool(positive.any()):
        raise ValueError("the projection head needs both a positive and a negative anchor")
    x = features.detach().float()
    mean = x.mean(0)
    std = x.std(0, correction=0).clamp_min(1e-6)
    generator = torch.Generator().manual_seed(seed)
    h = x.shape[1]
    start = torch.randn(h, params.projection_dim, generator=generator) / h**0.5
    weight = start.to(x.device).requires_grad_(True)
    optimizer = torch.optim.Adam([weight], lr=params.head_lr)
    losses: list[float] = []
    with torch.enable_grad():
        for _ in range(params.head_steps):
            if between_steps is not None:
                between_steps()
            z = projected(x, mean, std, weight)
            loss = contrastive_loss(z, positive, params.anchor_temperature)
            if not losses:
                losses.append(float(loss.detach()))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    frozen = weight.detach()
    with torch.no_grad():
        z = projected(x, mean, std, frozen)
        losses.append(float(contrastive_loss(z, positive, params.anchor_temperature)))
        c_pos, c_neg = set_centres(z, positive)
    return ProjectionHead(mean, std, frozen, c_pos - c_neg), losses


def anchor_scores(head: ProjectionHead, features: torch.Tensor) -> torch.Tensor:
    """(B,) s(o) = cos(z, c⁺) − cos(z, c⁻) = z·(c⁺ − c⁻) in [−2, 2]: how much nearer the positive
    anchors' centre than the negative's each rollout's features (B, H) project."""
    with torch.no_grad():
        return projected(features, head.mean, head.std, head.weight) @ head.centre


def rrpo_advantages(batch: PolicyBatch, params: RRPOParams) -> torch.Tensor:
    """(B,) Â: without anchor scores (the head not yet frozen) GRPO's group-normalised verifier
    advantage; with them s − mean_group(s) + w · Â_GRPO."""
    verifier = group_advantages(float_rewards(batch), batch.group_ids, "group")
    if batch.anchor_scores is None:
        return verifier
    s = batch.anchor_scores.to(verifier.dtype)
    n = s.shape[0]
    idx = dense_group_index(batch.group_ids)
    count = segment_sum(torch.ones_like(s), idx, n).clamp_min(1)
    centred = s - (segment_sum(s, idx, n) / count)[idx]
    return centred + params.verifier_weight * verifier


def anchor_agreement(
    scores: torch.Tensor, outcome: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-d (AUC, gap) of the anchor scores (B,) against the verified ``outcome`` (B,): the
    chance a positive scores above a negative (ties ½), and the mean s of the positives less
    the negatives'. NaN when the rollouts lack either class (no host sync)."""
    pos = positive_mask(outcome)
    s = scores.float()
    pairs = (pos[:, None] & ~pos[None]).float()  # (B, B) positive i, negative j
    above = (s[:, None] > s[None]).float() + 0.5 * (s[:, None] == s[None]).float()
    n_pairs = pairs.sum()
    nan = torch.full_like(n_pairs, float("nan"))
    auc = torch.where(n_pairs > 0, (above * pairs).sum() / n_pairs.clamp_min(1), nan)
    n_pos = pos.float().sum()
    n_neg = (~pos).float().sum()
    mean_pos = torch.where(pos, s, torch.zeros_like(s)).sum() / n_pos.clamp_min(1)
    mean_neg = torch.where(pos, torch.zeros_like(s), s).sum() / n_neg.clamp_min(1)
    return auc, torch.where(n_pairs > 0, mean_pos - mean_neg, nan)


RRPO_METRICS = (
    metrics.CLIP_FRAC,
    metrics.RRPO_ANCHOR_AUC,
    metrics.RRPO_ANCHOR_GAP,
    metrics.RRPO_ANCHORS,
)


@register_objective(
    "rrpo",
    params=RRPOParams,
    description="RRPO (designed from its summary): group-centred scores against frozen"
    " positive/negative anchors (arXiv:2607.18470).",
    metrics=RRPO_METRICS,
    linear_on_policy=True,
    turn_credit=True,
    anchors=True,
)
def rrpo_objective(batch: PolicyBatch, params: RRPOParams) -> ObjectiveOutput:
    """−agg_t min(ρ_t Â, clip(ρ_t, 1−ε_low, 1+ε_high) Â) + β·KL with ``rrpo_advantages`` (§10).

    Stats: loss, grpo/clip_frac. The trainer adds rrpo/anchors and, once the head is frozen,
    rrpo/anchor_auc and rrpo/anchor_gap over the whole rollout batch (``anchor_agreement``:
    how well the anchor scores agree with the verifier).
    """
    advantages = rrpo_advantages(batch, params)
    loss, clip_frac = clipped_surrogate(
        batch, advantages, params.clip_low, params.clip_high, params.loss_agg
    )
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg
    )
