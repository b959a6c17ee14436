"""DAPO: GRPO with clip-higher, token-mean aggregation, dynamic sampling and overlong shaping
(docs/objectives.md §3), as a parameter preset of ``grpo``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from conspo.lazy import lazy_import
from conspo.objectives.base import (
    LossAgg,
    ObjectiveOutput,
    PolicyBatch,
)
from conspo.objectives.grpo import GRPO_FAMILY_METRICS, GRPOParams, grpo_objective
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class DAPOParams(GRPOParams):
    clip_high: float = Field(0.28, gt=0, description="ε_high: DAPO's clip-higher.")
    loss_agg: LossAgg = Field("token-mean", description="DAPO averages over all tokens.")
    refill_groups: bool = Field(
        True,
        description="Dynamic sampling: drop zero-variance groups and refill the batch.",
    )
    overlong_buffer: int = Field(
        8,
        ge=0,
        description="Soft overlong penalty zone (L_cache tokens) before max_new_tokens; moved onto"
        " a `length` reward (rewards) unless the run lists one.",
    )


@register_objective(
    "dapo",
    params=DAPOParams,
    description="DAPO: GRPO with clip-higher, token-mean, dynamic sampling, overlong shaping.",
    metrics=GRPO_FAMILY_METRICS,
    linear_on_policy=True,
    turn_credit=True,
)
def dapo_objective(batch: PolicyBatch, params: DAPOParams) -> ObjectiveOutput:
    return grpo_objective(batch, params)
