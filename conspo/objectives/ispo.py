"""ISPO's token part, designed from the abstract (docs/objectives.md §5.2): GRPO plus a hinge on
the decision tokens of highest entropy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import Field

from conspo import metrics
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    ObjectiveOutput,
    PolicyBatch,
    positive_mask,
    upcast_logprobs,
)
from conspo.objectives.grpo import GRPOParams, grpo_objective
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


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
    excess = (upcast_logprobs(batch) - math.log(params.hinge_confidence)).clamp_min(0)
    n_chosen = chosen.sum().clamp_min(1)
    hinge = torch.where(chosen, excess, 0.0).sum() / n_chosen
    loss = out.loss + params.hinge_weight * hinge
    active = (chosen & (excess > 0)).sum() / n_chosen
    stats = {**out.stats, metrics.ISPO_HINGE_ACTIVE: active.to(excess.dtype).detach()}
    stats[metrics.LOSS] = loss.detach()
    return ObjectiveOutput(loss, stats)
