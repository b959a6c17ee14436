"""What every RLVR objective shares: its input, its output, its parameters' base and the tensor
pieces several objectives use (docs/objectives.md).

Each objective is one module of this package (``grpo.py``, ``conspo.py``, …): a parameter model and
a function registered with ``@register_objective``. Every module here is imported on the first
registry lookup, so a new objective is a new file and nothing else.

Every objective takes the same ``PolicyBatch`` and its own parameter model, and returns an
``ObjectiveOutput`` (a scalar loss to *minimise* plus detached 0-d statistics). The trainer never
branches on the algorithm. Objectives never call ``.item()``: the trainer syncs once per step.

Shapes: B rollouts, T response positions (right-padded), mask 1.0 on response tokens incl. EOS.
Group ids are arbitrary integers (not necessarily contiguous or sorted). A rollout is *positive*
exactly when its verified outcome is 1 (``PolicyBatch.outcome``, read by ``positive_mask``), in
the objectives, the trainer's refill and the statistics alike: shaped rewards (overlong penalty)
change advantages, never who is positive, so a correct answer stays a positive however long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from conspo import metrics
from conspo.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


# ConSPO's paper defaults (arXiv:2605.12969): ConSPOParams' defaults, and the separation view of
# every objective that has no τ or margin of its own.
PAPER_TAU = 10.0


PAPER_MARGIN_MAX = 0.01


PAPER_MARGIN_WARMUP = 0.3


PAPER_CLIP = 0.2


@dataclass(frozen=True)
class SeparationView:
    """How the §4 separation statistics read a run at one point of training.

    tau: τ of conspo/p_pos and conspo/hard_neg_share; margin: m_t of conspo/margin and
    sep/margin_acc; clip_eps: ε of the §1 clipped-ratio scores behind grpo/clip_gap and the upper
    edge 1 + ε of the trust region of offpolicy/clip_high; clip_low: its lower edge 1 − ε_low
    (offpolicy/clip_low).
    """

    tau: float
    margin: float
    clip_eps: float
    clip_low: float = PAPER_CLIP


# The objectives' shared vocabulary: a parameter of one of these names means the same in every
# objective, so its label and its symbol in the papers are declared once, here; every params
# model's JSON schema carries them (``title``, ``symbol``), and the run form and the runs list
# read them from there.
PARAM_LABELS: dict[str, tuple[str, str]] = {
    "tau": ("τ (temperature)", "τ"),
    "margin_max": ("Margin M", "M"),
    "margin_warmup": ("Margin warmup α", "α"),
    "clip": ("Clip ε", "ε"),
    "clip_low": ("Clip ε low", "ε_low"),
    "clip_high": ("Clip ε high", "ε_high"),
    "beta": ("KL β", "β"),
    "kl_in_reward": ("KL β in the reward", "β_r"),
    "loss_agg": ("Loss aggregation", ""),
}


def _labelled(schema: dict[str, Any]) -> None:
    for name, prop in schema.get("properties", {}).items():
        if name in PARAM_LABELS:
            prop["title"], symbol = PARAM_LABELS[name]
            if symbol:
                prop["symbol"] = symbol


class ObjectiveParams(BaseModel):
    """Knobs every objective shares: batch refill, overlong shaping and the optional KL."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_labelled)

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
        " max_new_tokens. 0 disables it. Becomes a `length` reward (rewards) when the run lists"
        " none; a listed one takes precedence.",
    )
    overlong_penalty: float = Field(
        1.0,
        ge=0,
        description="Reward subtracted at max_new_tokens when overlong shaping is on (the weight"
        " of the `length` reward it becomes).",
    )
    beta: float = Field(
        0.0,
        ge=0,
        description="KL coefficient to a frozen reference model (k3 estimator). 0 loads no"
        " reference model.",
    )
    kl_in_reward: float = Field(
        0.0,
        ge=0,
        le=100,
        description="β of InstructGPT's KL penalty in the reward: before advantages, each"
        " rollout's reward loses β · Σ_t (log π_old − log π_ref) over its own tokens (the"
        " per-token k1 estimate of KL(π ‖ π_ref), as InstructGPT and veRL's use_kl_in_reward),"
        " so the penalty is part of the return the advantage normalises, not a loss term."
        " Independent of beta (the KL in the loss); either loads the reference. 0: none.",
    )

    @property
    def needs_reference(self) -> bool:
        """Whether the run computes log π_ref (the KL in the loss or in the reward)."""
        return self.beta > 0 or self.kl_in_reward > 0

    def separation_view(self, progress: float) -> SeparationView:
        """τ, m_t and ε of the §4 statistics at ``progress`` = step / total_steps.

        The default is ConSPO's paper defaults (τ = 10, half-cosine margin to M = 0.01 over
        α = 0.3, ε = 0.2), so runs of objectives without a τ or margin of their own share one
        axis with ConSPO runs. Subclasses override what they have their own value for.
        """
        margin = margin_at(progress, margin_max=PAPER_MARGIN_MAX, warmup=PAPER_MARGIN_WARMUP)
        return SeparationView(tau=PAPER_TAU, margin=margin, clip_eps=PAPER_CLIP)


LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


@dataclass(frozen=True)
class WholeBatch:
    """The step's whole rollout batch, for a normaliser that spans it rather than one optimiser
    mini-batch (REINFORCE++ whitens over every token of the rollout batch). N rollouts."""

    rewards: torch.Tensor  # (N,) shaped rewards
    group_ids: torch.Tensor  # (N,)
    lengths: torch.Tensor  # (N,) response tokens of each rollout


@dataclass
class PolicyBatch:
    """One optimiser mini-batch of whole groups. B rollouts, T response positions (right-padded).

    logprobs:      (B, T) log π_θ of each response token, with grad.
    old_logprobs:  (B, T) log π_old, or None when there is one optimiser pass per rollout batch
                   (then π_old = π_θ.detach() and ρ = 1 in value; no extra forward pass).
    ref_logprobs:  (B, T) log π_ref of a frozen reference, or None (beta = 0).
    mask:          (B, T) 1.0 on response tokens including EOS, 0.0 on padding.
    rewards:       (B,) rewards the advantages see: the verified outcome after any shaping
                   (overlong penalty), so maybe fractional.
    correct:       (B,) verified outcome in {0,1}, or None when ``rewards`` are unshaped (then
                   the outcome is ``rewards``). Decides who is positive (``outcome``).
    entropy:       (B, T) per-token entropy of π_θ (detached), or None; ISPO's token hinge
                   picks the decision tokens by it.
    group_ids:     (B,) int64 prompt-group id; a group is never split across mini-batches.
    progress:      step / total_steps in [0, 1] (margin curriculum).
    max_response_len: the constant of seq-mean-token-sum-norm (max_new_tokens).
    turn_advantages: (B, T) a turn-level advantage added to each token's, or None: an
                   environment run's per-turn credit (``conspo.credit``), 0 off the model's
                   tokens. Objectives registered with ``turn_credit`` take it.
    values:        (B, T) the critic's V(s_t) of the state before each token, taken when the
                   rollouts were scored (no grad), or None: objectives registered with
                   ``critic`` (PPO) read it; None there means no critic (V ≡ 0).
    token_rewards: (B, T) the reward each token earned, or None: the rollout's reward at its
                   last model token. The trainer fills it for a critic's objective: an
                   environment's turn rewards at each turn's last token, InstructGPT's
                   per-token KL penalty (params.kl_in_reward) on every token.
    turn_index:    (B, T) the model turn of each token (−1 off the model's tokens), or None (one
                   turn): a critic's recursion steps over turns where it is given.
    anchor_scores: (B,) each rollout's score against the frozen anchors (RRPO), or None: no
                   head frozen yet, or an objective registered without ``anchors``.
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
    # The whole rollout batch when this mini-batch is only part of it; None: this is all of it.
    whole: WholeBatch | None = None
    correct: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    turn_advantages: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    anchor_scores: torch.Tensor | None = None

    @property
    def outcome(self) -> torch.Tensor:
        """(B,) the verified outcome, the only thing ``positive_mask`` is ever given."""
        return self.rewards if self.correct is None else self.correct


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor  # scalar to minimise
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # detached scalars


# A rollout whose verified outcome is above this is a positive (O = 1); outcomes are {0, 1}.
POSITIVE_THRESHOLD = 0.5


# A reward std at or below this counts as zero: the group (or batch) has no variance and its
# advantages are 0. Without the guard, float noise in a constant group (e.g. shaped rewards of
# 0.7) would be divided by a std of ~1e-8. Above it we divide by the exact std, so binary
# groups get the exact advantages of Proposition 1.
STD_EPS = 1e-6


def positive_mask(outcome: torch.Tensor) -> torch.Tensor:
    """(B,) bool: which rollouts are positives, from their (B,) verified outcome in {0, 1}.

    The one definition of "positive": objectives, the trainer's refill and the statistics all
    call it on the verified outcome, never on a shaped reward (docs/objectives.md, notation:
    "Positive means verified correct").
    """
    return outcome > POSITIVE_THRESHOLD


def is_positive(outcome: float | None) -> bool:
    """``positive_mask`` for one stored outcome (None, a rollout never verified: not positive)."""
    return outcome is not None and outcome > POSITIVE_THRESHOLD


def dense_group_index(group_ids: torch.Tensor) -> torch.Tensor:
    """Map arbitrary integer group ids (B,) to dense indices (B,) in [0, B).

    Equal ids get equal indices, different ids different ones. Built from a sort instead of
    ``torch.unique`` so the objectives never sync with the host; per-group buffers are sized B
    and slots past the number of groups stay empty (count 0, never valid).
    """
    sorted_ids, order = torch.sort(group_ids)
    starts = torch.zeros_like(sorted_ids, dtype=torch.long)
    starts[1:] = (sorted_ids[1:] != sorted_ids[:-1]).long()
    dense = torch.empty_like(starts)
    dense[order] = starts.cumsum(0)
    return dense


def segment_sum(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """(size,) sums of ``values`` (B,) per slot ``index`` (B,); differentiable in ``values``."""
    return values.new_zeros(size).index_add(0, index, values)


def _upcast(values: torch.Tensor) -> torch.Tensor:
    """At least float32: sums over tokens in bf16 lose the differences the objectives need."""
    return values.to(torch.promote_types(values.dtype, torch.float32))


def masked_seq_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) → (B,) mean over the unmasked positions of each row.

    ``torch.where`` instead of ``values * mask`` so that inf/NaN at padded positions can
    neither leak into the value nor (as 0·inf) into the gradient.
    """
    values = _upcast(values)
    masked = torch.where(mask > 0, values, torch.zeros_like(values))
    return masked.sum(-1) / mask.sum(-1).clamp_min(1).to(values.dtype)


def token_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """(B, T) ρ_t = π_θ/π_old = exp(logprobs − old_logprobs); 1 at padded positions.

    ``old_logprobs=None`` means one optimiser pass per rollout batch: π_old = π_θ.detach(), so
    ρ = 1 in value while its gradient is still ∂ρ/∂logprob = 1 (§1; no second forward pass).
    """
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    log_ratio = torch.where(mask > 0, logprobs - old, torch.zeros_like(logprobs))
    return log_ratio.exp()


def sequence_scores(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) ConSPO's rollout score s_θ(o) = (1/|o|) Σ_t log π_θ(o_t|q, o_<t) (§2).

    logprobs, mask: (B, T); |o| = mask.sum(-1) counts response tokens incl. EOS.
    """
    return masked_seq_mean(logprobs, mask)


def clipped_ratio_scores(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    outcome: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """(B,) GRPO's clipped-ratio scores of Proposition 1 (arXiv:2605.12969, §1 of the spec).

    Positives: s⁺(o) = mean_t min(ρ_t, 1+ε); negatives: s⁻(o) = mean_t max(ρ_t, 1−ε).
    logprobs, old_logprobs, mask: (B, T); outcome: (B,) verified. ``old_logprobs=None`` ⇒ ρ = 1.
    """
    ratio = token_ratio(logprobs, old_logprobs, mask)
    pos = positive_mask(outcome)[:, None]
    clipped = torch.where(pos, ratio.clamp(max=1 + eps), ratio.clamp(min=1 - eps))
    return masked_seq_mean(clipped, mask)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    scale: Literal["group", "batch", "none"],
    *,
    batch_std: float | None = None,
) -> torch.Tensor:
    """(B,) GRPO advantages Â_i = (r_i − mean_group(r)) / std (§1).

    scale="group": the group's population std (divide by G); "batch": the population std of
    ``batch_std`` if given (the whole rollout batch), else of ``rewards``; "none": no division
    (Dr. GRPO). A std <= STD_EPS gives advantage 0 (zero-variance group: no signal).
    """
    r = rewards if rewards.is_floating_point() else rewards.float()
    n = r.shape[0]
    idx = dense_group_index(group_ids)
    count = segment_sum(torch.ones_like(r), idx, n).clamp_min(1)
    centered = r - (segment_sum(r, idx, n) / count)[idx]
    if scale == "none":
        return centered
    if scale == "group":
        std = (segment_sum(centered**2, idx, n) / count).sqrt()[idx]
    elif scale == "batch":
        std = r.std(correction=0) if batch_std is None else torch.tensor(batch_std, dtype=r.dtype)
        std = std.to(r.device).expand_as(r)
    else:
        raise ValueError(f"unknown scale_rewards {scale!r}; valid: group, batch, none")
    return torch.where(std > STD_EPS, centered / std.clamp_min(STD_EPS), torch.zeros_like(r))


def aggregate_tokens(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: LossAgg, max_len: int
) -> torch.Tensor:
    """0-d aggregate of per-token losses ``loss_mat`` (B, T) under ``mask`` (B, T) (§1).

    seq-mean-token-mean (GRPO): mean over each rollout's tokens, then mean over rollouts.
    token-mean (DAPO): sum over all response tokens of the batch / their number.
    seq-mean-token-sum-norm (Dr. GRPO): each rollout's token sum / ``max_len`` (a constant,
    max_new_tokens), then mean over rollouts.
    """
    loss_mat = _upcast(loss_mat)
    masked = torch.where(mask > 0, loss_mat, torch.zeros_like(loss_mat))
    if mode == "seq-mean-token-mean":
        return masked_seq_mean(loss_mat, mask).mean()
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp_min(1).to(loss_mat.dtype)
    if mode == "seq-mean-token-sum-norm":
        return (masked.sum(-1) / max_len).mean()
    raise ValueError(
        f"unknown loss_agg {mode!r}; valid: seq-mean-token-mean, token-mean,"
        " seq-mean-token-sum-norm"
    )


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token k3 estimate of KL(π_θ‖π_ref): exp(x) − x − 1, x = log π_ref − log π_θ.

    Non-negative, unbiased, 0 at padded positions.
    """
    x = torch.where(mask > 0, ref_logprobs - logprobs, torch.zeros_like(logprobs))
    return torch.expm1(x) - x  # not exp(x) − 1 − x: at |x| ~ 1e-6 float32 cancels it below 0


def margin_at(progress: float, *, margin_max: float, warmup: float) -> float:
    """ConSPO's half-cosine margin curriculum m_t = (M/2)(1 − cos(π·min(λ_t/α, 1))) (§2).

    progress λ_t = step / total_steps; warmup α in (0, 1]. Rises from 0 to M over the first α of
    training, then stays at M. Negative progress is treated as 0.
    """
    rho = min(max(progress, 0.0) / warmup, 1.0)
    return 0.5 * margin_max * (1.0 - math.cos(math.pi * rho))


@dataclass(frozen=True)
class GroupCounts:
    idx: torch.Tensor  # (B,) dense group index of each rollout
    pos: torch.Tensor  # (B,) bool, positive rollouts
    n_pos: torch.Tensor  # (B,) N⁺ per group slot
    n_neg: torch.Tensor  # (B,) N⁻ per group slot
    valid: torch.Tensor  # (B,) bool per group slot: 0 < N⁺ < G
    n_valid: torch.Tensor  # 0-d, number of valid groups, at least 1 (a divisor)


def group_counts(outcome: torch.Tensor, group_ids: torch.Tensor, dtype: torch.dtype) -> GroupCounts:
    n = outcome.shape[0]
    idx = dense_group_index(group_ids)
    pos = positive_mask(outcome)
    n_pos = segment_sum(pos.to(dtype), idx, n)
    n_neg = segment_sum((~pos).to(dtype), idx, n)
    valid = (n_pos > 0) & (n_neg > 0)
    return GroupCounts(idx, pos, n_pos, n_neg, valid, valid.sum().clamp_min(1).to(dtype))


def with_kl(
    loss: torch.Tensor,
    stats: dict[str, torch.Tensor],
    batch: PolicyBatch,
    beta: float,
    loss_agg: LossAgg,
) -> torch.Tensor:
    """Add β·KL_k3 (aggregated like the policy loss) when β > 0 and a reference is given.

    The KL statistic is logged whenever reference log-probs are present, even at β = 0.
    """
    if batch.ref_logprobs is None:
        return loss
    kl = aggregate_tokens(
        k3_kl(batch.logprobs, batch.ref_logprobs, batch.mask),
        batch.mask,
        loss_agg,
        batch.max_response_len,
    )
    stats[metrics.KL] = kl.detach()
    return loss + beta * kl if beta > 0 else loss


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

    advantages: (B,) one advantage per rollout, broadcast over its tokens, or (B, T) one per
    token (PPO's GAE), plus the batch's per-turn credit where it has one
    (``PolicyBatch.turn_advantages``: Â_t = Â + ω·Â_turn(t), GiGPO's combination). The clip
    fraction is the share of response tokens where the clipped term is the active one.
    """
    ratio = token_ratio(batch.logprobs, batch.old_logprobs, batch.mask)
    adv = advantages.to(ratio.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv
    if batch.turn_advantages is not None:
        adv = adv + batch.turn_advantages.to(ratio.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    loss = aggregate_tokens(
        -torch.minimum(unclipped, clipped), batch.mask, agg, batch.max_response_len
    )
    was_clipped = (clipped < unclipped).to(ratio.dtype)
    return loss, aggregate_tokens(was_clipped, batch.mask, "token-mean", 1).detach()


def finish_objective(
    loss: torch.Tensor,
    stats: dict[str, torch.Tensor],
    batch: PolicyBatch,
    beta: float,
    agg: LossAgg,
) -> ObjectiveOutput:
    """The optional β·KL to the reference (§1.4) and the loss statistic every objective logs."""
    loss = with_kl(loss, stats, batch, beta, agg)
    stats[metrics.LOSS] = loss.detach()
    return ObjectiveOutput(loss, stats)


def token_log_ratio(batch: PolicyBatch) -> torch.Tensor:
    """(B, T) log ρ_t = log π_θ − log π_old, 0 at padding; π_old = π_θ.detach() when absent."""
    old = batch.logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs
    zero = torch.zeros_like(batch.logprobs)
    return torch.where(batch.mask > 0, batch.logprobs - old, zero)


def float_rewards(batch: PolicyBatch) -> torch.Tensor:
    r = batch.rewards
    return r if r.is_floating_point() else r.float()


def group_sizes(group_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """((B,) dense group index of each rollout, (B,) size of each group slot)."""
    idx = dense_group_index(group_ids)
    n = group_ids.shape[0]
    return idx, segment_sum(torch.ones(n, dtype=dtype, device=group_ids.device), idx, n)


def upcast_logprobs(batch: PolicyBatch) -> torch.Tensor:
    return batch.logprobs.to(torch.promote_types(batch.logprobs.dtype, torch.float32))


KLEstimator = Literal["k1", "k3"]


def old_policy_kl(batch: PolicyBatch, estimator: KLEstimator = "k3") -> torch.Tensor:
    """(B, T) estimate of KL(π_old ‖ π_θ) per token from x = log π_θ − log π_old (samples
    drawn from π_old): k3 = e^x − x − 1 (unbiased, never negative, low variance) or k1 = −x
    (unbiased, either sign, high variance).

    0 in value when π_old = π_θ (one optimiser pass per rollout batch), 0 at padding.
    """
    x = token_log_ratio(batch)
    return -x if estimator == "k1" else torch.expm1(x) - x
