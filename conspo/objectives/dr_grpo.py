"""Dr. GRPO: GRPO without std scaling, token sums over a constant (docs/objectives.md §3), as a
parameter preset of ``grpo``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

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


class DrGRPOParams(GRPOParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "none", description="Dr. GRPO does not divide advantages by a std."
    )
    loss_agg: LossAgg = Field(
        "seq-mean-token-sum-norm",
        description="Dr. GRPO: token sums divided by max_new_tokens.",
    )


@register_objective(
    "dr_grpo",
    params=DrGRPOParams,
    description="Dr. GRPO: no std scaling, token sums over a constant.",
    metrics=GRPO_FAMILY_METRICS,
    linear_on_policy=True,
    turn_credit=True,
)
def dr_grpo_objective(batch: PolicyBatch, params: DrGRPOParams) -> ObjectiveOutput:
    return grpo_objective(batch, params)
