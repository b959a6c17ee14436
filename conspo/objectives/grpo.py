"""GRPO: group-normalised advantages in PPO's clipped token surrogate (docs/objectives.md §1).

DAPO and Dr. GRPO are parameter presets of this objective (``dapo.py``, ``dr_grpo.py``).
"""

from __future__ import annotations

from dataclasses import replace
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
    clipped_surrogate,
    finish_objective,
    group_advantages,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class GRPOParams(ObjectiveParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="Divide advantages by the group's population std, the batch std, or not at"
        " all (none = Dr. GRPO).",
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="ε_low: ratio clipped below at 1-ε_low.")
    clip_high: float = Field(0.2, gt=0, description="ε_high: ratio clipped above at 1+ε_high.")
    loss_agg: LossAgg = Field(
        "seq-mean-token-mean",
        description="How token losses are averaged: per-sequence then over sequences (GRPO),"
        " over all tokens (DAPO), or token sums over a constant (Dr. GRPO).",
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with the GRPO family's own clip range [1 − ε_low, 1 + ε_high]."""
        default = super().separation_view(progress)
        return replace(default, clip_eps=self.clip_high, clip_low=self.clip_low)


# What the GRPO family's stats add to the statistics every run logs.
GRPO_FAMILY_METRICS = (metrics.CLIP_FRAC,)


@register_objective(
    "grpo",
    params=GRPOParams,
    description="GRPO: group-normalised advantages, clipped ratio.",
    metrics=GRPO_FAMILY_METRICS,
    linear_on_policy=True,
    turn_credit=True,
)
def grpo_objective(batch: PolicyBatch, params: GRPOParams) -> ObjectiveOutput:
    """GRPO / DAPO / Dr. GRPO: −agg_t min(ρ·Â, clip(ρ, 1−ε_low, 1+ε_high)·Â) + β·KL (§1, §3).

    Stats: loss, grpo/clip_frac (fraction of response tokens where the clipped term is the active
    one), kl (when reference log-probs are given).
    """
    adv = group_advantages(
        batch.rewards, batch.group_ids, params.scale_rewards, batch_std=batch.batch_reward_std
    )  # (B,)
    loss, clip_frac = clipped_surrogate(
        batch, adv, params.clip_low, params.clip_high, params.loss_agg
    )
    return finish_objective(
        loss, {metrics.CLIP_FRAC: clip_frac}, batch, params.beta, params.loss_agg
    )
