"""RLVR objectives (GRPO, ConSPO, DAPO, Dr. GRPO): the math of ../shared/docs/objectives.md.

Every objective takes the same ``PolicyBatch`` and its own parameter model, and returns an
``ObjectiveOutput`` (a scalar loss to *minimise* plus detached statistics). The trainer never
branches on the algorithm.

SKELETON: parameter models, PolicyBatch and the registrations are fixed (the config model, the
API and the form read them); the function bodies are filled in by the objectives work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from conspo.registry import register_objective

# --------------------------------------------------------------------------------------------
# Parameter models (one per registered objective). Field descriptions feed the form and the docs.
# --------------------------------------------------------------------------------------------


class ObjectiveParams(BaseModel):
    """Knobs every objective shares: batch refill, overlong shaping and the optional KL."""

    model_config = ConfigDict(extra="forbid")

    refill_groups: bool = Field(
        False,
        description="Drop all-correct / all-wrong groups and generate more prompts until the batch"
        " is full again (DAPO's dynamic sampling). Default off, not in the ConSPO paper.",
    )
    max_refill_rounds: int = Field(
        3,
        ge=0,
        le=32,
        description="Bound on extra generation rounds when refill_groups is on.",
    )
    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO overlong shaping: length of the soft penalty zone (L_cache tokens) before"
        " max_new_tokens. 0 disables it.",
    )
    overlong_penalty: float = Field(
        1.0,
        ge=0,
        description="Reward subtracted at max_new_tokens when overlong shaping is on.",
    )
    beta: float = Field(
        0.0,
        ge=0,
        description="KL coefficient to a frozen reference model (k3 estimator). 0 loads no"
        " reference model.",
    )


LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


class GRPOParams(ObjectiveParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="Divide advantages by the group's population std, the batch std, or not at"
        " all (none = Dr. GRPO).",
    )
    clip_low: float = Field(
        0.2, gt=0, lt=1, description="ε_low: ratio clipped below at 1-ε_low."
    )
    clip_high: float = Field(
        0.2, gt=0, description="ε_high: ratio clipped above at 1+ε_high."
    )
    loss_agg: LossAgg = Field(
        "seq-mean-token-mean",
        description="How token losses are averaged: per-sequence then over sequences (GRPO),"
        " over all tokens (DAPO), or token sums over a constant (Dr. GRPO).",
    )


class DAPOParams(GRPOParams):
    clip_high: float = Field(0.28, gt=0, description="ε_high: DAPO's clip-higher.")
    loss_agg: LossAgg = Field(
        "token-mean", description="DAPO averages over all tokens."
    )
    refill_groups: bool = Field(
        True,
        description="Dynamic sampling: drop zero-variance groups and refill the batch.",
    )
    overlong_buffer: int = Field(
        8,
        ge=0,
        description="Soft overlong penalty zone (L_cache tokens) before max_new_tokens.",
    )


class DrGRPOParams(GRPOParams):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "none", description="Dr. GRPO does not divide advantages by a std."
    )
    loss_agg: LossAgg = Field(
        "seq-mean-token-sum-norm",
        description="Dr. GRPO: token sums divided by max_new_tokens.",
    )


class ConSPOParams(ObjectiveParams):
    tau: float = Field(
        10.0, gt=0, description="InfoNCE temperature τ (paper default 10)."
    )
    margin_max: float = Field(
        0.01, ge=0, description="Final margin M (paper default 0.01)."
    )
    margin_warmup: float = Field(
        0.3,
        gt=0,
        le=1,
        description="α: fraction of training over which the margin rises from 0 to M (half-cosine).",
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
        0.2,
        gt=0,
        lt=1,
        description="ε used by score=clipped_ratio (ignored for logprob scores).",
    )


# --------------------------------------------------------------------------------------------
# The uniform input and output of every objective
# --------------------------------------------------------------------------------------------


@dataclass
class PolicyBatch:
    """One optimiser mini-batch of whole groups. B rollouts, T response positions (right-padded).

    logprobs:      (B, T) log π_θ of each response token, with grad.
    old_logprobs:  (B, T) log π_old, or None when there is one optimiser pass per rollout batch
                   (then π_old = π_θ.detach() and ρ = 1 in value; no extra forward pass).
    ref_logprobs:  (B, T) log π_ref of a frozen reference, or None (beta = 0).
    mask:          (B, T) 1.0 on response tokens including EOS, 0.0 on padding.
    rewards:       (B,) verified rewards, {0,1} (after any overlong shaping, maybe fractional).
    group_ids:     (B,) int64 prompt-group id; a group is never split across mini-batches.
    progress:      step / total_steps in [0, 1] (margin curriculum).
    max_response_len: the constant of seq-mean-token-sum-norm (max_new_tokens).
    """

    logprobs: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    progress: float = 0.0
    max_response_len: int = 1
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    # Batch-level reward std for scale_rewards="batch" when the mini-batch is part of a larger
    # rollout batch; None means "compute it from this batch".
    batch_reward_std: float | None = None


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor  # scalar to minimise
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # detached scalars


# --------------------------------------------------------------------------------------------
# Registered objectives (bodies: see the objectives work item)
# --------------------------------------------------------------------------------------------


@register_objective(
    "grpo",
    params=GRPOParams,
    description="GRPO: group-normalised advantages, clipped ratio.",
)
def grpo_objective(batch: PolicyBatch, params: GRPOParams) -> ObjectiveOutput:
    raise NotImplementedError


@register_objective(
    "dapo",
    params=DAPOParams,
    description="DAPO: GRPO with clip-higher, token-mean, dynamic sampling, overlong shaping.",
)
def dapo_objective(batch: PolicyBatch, params: DAPOParams) -> ObjectiveOutput:
    return grpo_objective(batch, params)


@register_objective(
    "dr_grpo",
    params=DrGRPOParams,
    description="Dr. GRPO: no std scaling, token sums over a constant.",
)
def dr_grpo_objective(batch: PolicyBatch, params: DrGRPOParams) -> ObjectiveOutput:
    return grpo_objective(batch, params)


@register_objective(
    "conspo",
    params=ConSPOParams,
    description="ConSPO: group-wise InfoNCE on length-normalised log-prob scores with a margin curriculum.",
)
def conspo_objective(batch: PolicyBatch, params: ConSPOParams) -> ObjectiveOutput:
    raise NotImplementedError
