"""The update of one RL step: optimiser steps on mini-batches of whole groups, the objective's
gradient in micro-batches, and the statistics the step logs.

    stats, scores, taken = update(state, rollouts, step, lr)

``update_plan`` orders the step's mini-batches (``optim.epochs`` × ``optim.mini_batches``);
``optimise_chunk`` runs one of them (backward, gradient sync, clip, step); ``backward`` is the
one routine that puts a mini-batch's gradient in the trainable parameters, in one process and
in a process group alike: it is handed the rows this rank computes, runs the model on those
only, and either differentiates the loss through one forward's graph or takes the two-pass
route (no-grad log-probs, ∂loss/∂log-probs, then one forward per micro-batch), or, for an
objective linear on policy, the one-pass route (∂loss/∂log-probs first, then one forward per
micro-batch). π_old, the reference policy and the objective's input (``policy_batch``) are
built here too.

Shapes: N rollouts of the step, B of a mini-batch, b of this rank's share, T response positions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from conspo import metrics as M
from conspo import stopping
from conspo.config import RunConfig
from conspo.distributed import collectives as distributed
from conspo.generation.batch import RolloutBatch
from conspo.objectives.base import (
    ObjectiveOutput,
    PolicyBatch,
    SeparationView,
    clipped_ratio_scores,
    k3_kl,
    positive_mask,
    sequence_scores,
)
from conspo.objectives.ppo import PPOParams
from conspo.objectives.rrpo import RRPOParams
from conspo.registry import get_objective
from conspo.training.anchors import rollout_features
from conspo.training.critic import ScoredBatch, critic_values, placed_rewards, train_critic
from conspo.training.logprobs import logprob_mode, token_logprobs
from conspo.training.loop import TrainState, step_seed
from conspo.training.microbatch import length_buckets, micro_batches, piece_group_size, trimmed
from conspo.training.mismatch import correction_weights, mismatch_stats, reweighted
from conspo.training.rollouts import Rollouts
from conspo.training.stats import offpolicy_stats, separation_stats


def update(
    state: TrainState, r: Rollouts, step: int, lr: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
    """Optimiser steps at ``lr`` on mini-batches of whole groups, ``optim.epochs`` passes over
    the rollout batch; returns (stats, (N,) scores s_θ, optimiser steps taken).

    Loss-side stats (loss, grad_norm, ...) are averaged over updates (the off-policy ratio's
    extremes are the extremes over updates); the §4 separation statistics are computed once on
    the whole rollout batch, so group counts add up and one mini-batch without a valid group
    cannot turn the step's curves into NaN.
    """
    cfg, device = state.cfg, state.device
    logprob_mode(state.model)
    plan = update_plan(cfg, len(r.group_ids) // cfg.sampling.group_size, step)
    before_update = None
    current = None  # the whole batch's (log-probs, entropy) under π_θ = π_old, where computed
    if len(plan) > 1 or state.params.kl_in_reward > 0:
        current = whole_no_grad_logprobs(state, r)
    if len(plan) > 1:  # π_old must be frozen before the first optimiser step moves π_θ
        before_update = current
    kl_stats: dict[str, torch.Tensor] = {}
    if state.critic is not None:  # values and per-token rewards (its KL in the reward per token)
        r, kl_stats = critic_scored(state, r, None if current is None else current[0])
    elif state.params.kl_in_reward > 0:
        assert current is not None
        r, kl_stats = kl_in_reward(state, r, current[0])
    anchor_features = None
    if state.anchors is not None:  # scored by the frozen head, or collected until it is
        anchor_features = rollout_features(
            state.model, state.ref_model, r.batch, cfg, state.precision
        )
        if state.anchors.frozen:
            r = dataclasses.replace(r, anchor_scores=state.anchors.scores(anchor_features))
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    view = state.params.separation_view(step / cfg.steps)
    per_update: list[dict[str, torch.Tensor]] = []
    measured = measured_parameters(state.trainable)
    before = [p.detach().clone() for p in measured]
    scores = torch.empty(len(r.group_ids), device=device)
    clipped = torch.empty(len(r.group_ids), device=device)
    taken = 0
    for i, chunk in enumerate(plan):
        stopping.check()  # a cancel between mini-batches (the run is abandoned, not saved)
        rows = (r.group_ids[:, None] == chunk[None]).any(-1).to(device)  # (N,) whole groups
        # The first mini-batch's π_θ is still π_old: its no-grad pass is already done.
        known = None
        if current is not None and i == 0:
            known = current[0][rows], current[1][rows]
        old_logprobs = None if before_update is None else before_update[0][rows]
        # Behaviour scores are π_old's in every epoch; clipped-ratio scores end as the last's.
        stats, scores[rows], clipped[rows], stepped = optimise_chunk(
            state, r, rows, old_logprobs, step, view, known
        )
        per_update.append(stats)
        taken += stepped
    beside: dict[str, torch.Tensor] = {}  # what the critic's update and the anchors log
    if state.critic is not None:
        assert isinstance(state.params, PPOParams) and r.values is not None
        assert r.token_rewards is not None
        scored = ScoredBatch(r.batch, r.group_ids, r.rewards, r.values, r.token_rewards)
        beside = train_critic(state.critic, state.cfg, state.params, state.precision, scored, plan)
    if state.anchors is not None:  # before a head frozen below could score this step
        beside.update(state.anchors.stats(r.anchor_scores, r.correct))
    if state.anchors is not None and not state.anchors.frozen:
        assert isinstance(state.params, RRPOParams) and anchor_features is not None
        state.anchors.collect(anchor_features, r.correct, r.group_ids, state.params)
        if state.anchors.ready(state.params, step):  # scores the next step's rollouts
            state.anchors.freeze(state.params, step_seed(cfg.seed, step, "anchors"))
    # §4 on log-prob scores whatever the objective; τ, m_t, ε are the objective's own view.
    sep = separation_stats(
        scores,
        r.correct.to(device),
        r.group_ids.to(device),
        r.batch.model_lengths.to(device),
        margin=view.margin,
        tau=view.tau,
        clipped_scores=clipped,
    )
    truncated = {M.LEN_TRUNCATED_FRAC: r.batch.truncated.float().mean()}
    size = {M.OPTIM_UPDATE_SIZE: relative_change(before, measured)}
    stats = {**combined(per_update), **sep, **truncated, **kl_stats, **size, **beside}
    return stats, scores, taken


def critic_scored(
    state: TrainState, r: Rollouts, old_logprobs: torch.Tensor | None
) -> tuple[Rollouts, dict[str, torch.Tensor]]:
    """``r`` with what an objective with a critic reads: each token's value V(s_t) under the
    critic now (``Rollouts.values``) and each token's reward (``Rollouts.token_rewards``,
    ``conspo.training.critic.placed_rewards``), less, with params.kl_in_reward = β,
    InstructGPT's per-token β·(log π_old − log π_ref) on every model token (the KL in the
    reward where a critic can credit it token by token, not summed onto the last). Returns
    policy/kl_in_reward with it. ``old_logprobs``: (N, T) log π_old, read only for that KL."""
    assert state.critic is not None
    values = critic_values(state.critic, r.batch, state.cfg, state.precision)
    rewards = placed_rewards(r.batch, r.rewards)
    stats: dict[str, torch.Tensor] = {}
    beta = state.params.kl_in_reward
    if beta > 0:
        assert old_logprobs is not None
        ref = whole_reference_logprobs(state, r)
        per_token = ((old_logprobs - ref) * r.batch.model_mask.to(ref.device)).cpu()
        rewards = rewards - beta * per_token
        stats[M.KL_IN_REWARD] = per_token.sum(-1).float().mean()
    return dataclasses.replace(r, values=values, token_rewards=rewards), stats


# The update size is measured on at most this many elements of the trainable parameters (whole
# tensors, spread over the model): a copy of LoRA's adapters whole, of a full fine-tune's
# weights only a sample, not a second model in memory.
UPDATE_SIZE_ELEMENTS = 8_000_000


def measured_parameters(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The trainable tensors ``optim/update_size`` reads: all of them when they hold at most
    ``UPDATE_SIZE_ELEMENTS``, else every k-th tensor (k the smallest that fits), so the sample
    spans the layers from first to last."""
    total = sum(p.numel() for p in params)
    stride = max(1, math.ceil(total / UPDATE_SIZE_ELEMENTS))
    while stride > 1 and sum(p.numel() for p in params[::stride]) > UPDATE_SIZE_ELEMENTS:
        stride += 1
    return list(params[::stride])


def relative_change(before: list[torch.Tensor], after: list[torch.nn.Parameter]) -> torch.Tensor:
    """‖θ_after − θ_before‖ / ‖θ_before‖ over the tensors given (0-d): how far the step moved
    the policy, comparable across objectives whatever their loss's scale (0 when it took no
    optimiser step)."""
    if not before:
        return torch.zeros(())
    moved = torch.nn.utils.get_total_norm(
        [a.detach() - b for a, b in zip(after, before, strict=True)]
    )
    size = torch.nn.utils.get_total_norm(before)
    moved, size = distributed.plain(moved), distributed.plain(size)
    return (moved / size.clamp_min(1e-12)).float()


def kl_in_reward(
    state: TrainState, r: Rollouts, old_logprobs: torch.Tensor
) -> tuple[Rollouts, dict[str, torch.Tensor]]:
    """``r`` with InstructGPT's KL penalty in its rewards (params.kl_in_reward = β): each
    rollout's reward less β · Σ_t (log π_old − log π_ref) over its own tokens, before any
    advantage is formed, so group normalisation, RLOO's leave-one-out and REINFORCE++'s
    whitening all see the penalised return. The per-token sum is the k1 estimate (unbiased for
    the sequence's KL; k3 is a per-token loss estimator, not a return). Only the objective's
    input changes: the verified outcome (who is positive), the logged rewards and the stored
    rollouts keep the task's own values. ``old_logprobs``: (N, T) log π_old of the batch."""
    ref = whole_reference_logprobs(state, r)
    mask = r.batch.model_mask.to(ref.device)  # a tool's or environment's tokens are not π's
    per_rollout = ((old_logprobs - ref) * mask).sum(-1)  # (N,) nats
    penalty = state.params.kl_in_reward * per_rollout.to(r.rewards.device, r.rewards.dtype)
    penalised = dataclasses.replace(r, rewards=r.rewards - penalty)
    return penalised, {M.KL_IN_REWARD: per_rollout.float().mean()}


def update_plan(cfg: RunConfig, n_groups: int, step: int) -> list[torch.Tensor]:
    """The group indices of each update of a step, in order: ``optim.epochs`` passes, each
    split into ``optim.mini_batches`` of whole groups. The first pass takes the groups in sampled
    order (the prompts are already a random draw); each later one reshuffles them from
    (seed, step, epoch)."""
    plan: list[torch.Tensor] = []
    for epoch in range(cfg.optim.epochs):
        order = torch.arange(n_groups)
        if epoch > 0 and cfg.optim.mini_batches > 1:
            generator = torch.Generator().manual_seed(step_seed(cfg.seed, step, f"mb{epoch}"))
            order = torch.randperm(n_groups, generator=generator)
        plan += [c for c in order.tensor_split(cfg.optim.mini_batches) if len(c)]
    return plan


# How one step's per-update statistics combine: the mean, except the ratio's extremes and the
# split entropies (NaN for an update without correct, or without wrong, rollouts).
COMBINE = {
    M.OFFPOLICY_RATIO_MAX: torch.amax,
    M.OFFPOLICY_RATIO_MIN: torch.amin,
    M.ENTROPY_POS: torch.nanmean,
    M.ENTROPY_NEG: torch.nanmean,
    M.MISMATCH_LOGP_DIFF_MAX: torch.amax,
}


def combined(per_update: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One value per key over the step's updates (``COMBINE``, else the mean)."""
    return {
        k: COMBINE.get(k, torch.mean)(torch.stack([s[k] for s in per_update]))
        for k in per_update[0]
    }


def optimise_chunk(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    step: int,
    view: SeparationView,
    known: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, bool]:
    """Score, objective, backward, clip, step on the rollouts in ``rows`` (N,) bool.

    ``known``: their (log-probs, entropy) under the current π_θ when already computed.
    Returns (loss-side and off-policy stats, behaviour-policy scores s_θ, clipped-ratio scores of
    §1 at ``view.clip_eps``, whether an optimiser step was taken), the scores (B,) for the B
    rollouts of ``rows``.
    """
    state.optimizer.zero_grad(set_to_none=True)
    batch, entropy, out, skipped = backward(state, r, rows, old_logprobs, step, known)
    # Each rank holds its rows' share: summed (fsdp: into each rank's shard).
    if distributed.is_sharded(state.model):
        distributed.sync_sharded_gradients(state.model, partial(zero_backward, state, r))
    else:
        distributed.reduce_gradients(state.trainable)
    stepped = has_gradient(state.trainable)
    if stepped:
        grad_norm = distributed.plain(
            state.precision.step(state.optimizer, state.trainable, state.cfg.optim.max_grad_norm)
        )
    else:  # AdamW would still move the weights (momentum, decay) on a zero gradient
        grad_norm = torch.zeros((), device=state.device)
    distributed.gather_parameters(state.model)  # fsdp: the updated weights, for what follows
    logprobs, mask = batch.logprobs.detach(), batch.mask
    # Scores of the policy that sampled (π_old): before this chunk's update.
    behaviour = logprobs if batch.old_logprobs is None else batch.old_logprobs
    scores = sequence_scores(behaviour, mask)
    # π_θ here may already have moved (earlier mini-batches), which is what grpo/clip_gap shows.
    clipped = clipped_ratio_scores(logprobs, batch.old_logprobs, mask, batch.outcome, view.clip_eps)
    stats = {
        **out.stats,
        **offpolicy_stats(
            logprobs, batch.old_logprobs, mask, clip_low=view.clip_low, clip_high=view.clip_eps
        ),
        M.LOSS: out.loss.detach(),
        M.ENTROPY: (entropy * mask).sum() / mask.sum().clamp(min=1),
        **entropy_by_outcome(entropy, mask, batch.outcome),
        M.GRAD_NORM: grad_norm.detach(),
        M.OPTIM_BACKWARD_SKIPPED: torch.tensor(float(skipped)),
    }
    sampled = r.batch.sampled_logprobs
    if sampled is not None:  # the engine said what it sampled with: how far from π_old
        sampling = state.cfg.sampling
        stats |= mismatch_stats(
            behaviour, sampled[rows], mask, sampling.correction, sampling.mismatch_cap
        )
    ref = batch.ref_logprobs
    if ref is not None and M.KL not in stats:
        stats[M.KL] = (k3_kl(logprobs, ref, mask) * mask).sum() / mask.sum().clamp(min=1)
    return {k: v.float() for k, v in stats.items()}, scores, clipped, stepped


def entropy_by_outcome(
    entropy: torch.Tensor, mask: torch.Tensor, outcome: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Token-mean entropy (B, T) over the correct and over the wrong rollouts ((B,) verified
    outcome); NaN for a side without a token, so the step's value averages the updates with one."""
    pos = positive_mask(outcome)[:, None]
    out = {}
    for key, rows in ((M.ENTROPY_POS, pos), (M.ENTROPY_NEG, ~pos)):
        tokens = mask * rows
        out[key] = (entropy * tokens).sum() / tokens.sum()  # 0/0 = NaN: no such rollout
    return out


def has_gradient(params: list[torch.nn.Parameter]) -> bool:
    """Whether any trainable parameter got a non-zero gradient: an objective without signal (no
    valid group, zero advantages, no KL term) gives exactly 0. One host sync per update (fsdp:
    the max over every rank's shards, so all ranks agree)."""
    grads = [p.grad for p in params if p.grad is not None]
    return bool(grads) and bool(
        distributed.plain(torch.nn.utils.get_total_norm(grads, math.inf)) > 0
    )


def zero_backward(state: TrainState, r: Rollouts) -> None:
    """A one-token forward of the whole model and a backward of 0 × its logits: a gradient of
    exactly zero that every rank runs once per update, for fsdp's reduce-scatter (``distributed.
    sync_sharded_gradients``) to fire in lockstep whatever each rank's own backwards were. It must
    call the model itself: FSDP's hooks are on its forward, which ``token_logprobs`` bypasses
    (decoder and head apart), so the backwards before only accumulated gradients."""
    token = r.batch.prompt_ids[:1, -1:]  # (1, 1)
    with state.precision.autocast():
        logits = state.model(input_ids=token, use_cache=False).logits
    state.precision.backward(logits.float().sum() * 0.0)


@dataclass(frozen=True)
class RankRows:
    """Which rows of a mini-batch this process runs the model on, and how their results become
    the whole mini-batch's: in one process every row, as computed; in a process group this
    rank's own groups, gathered from every rank (``distributed.gather_rows``) so that the
    objective sees the whole mini-batch on each."""

    mine: torch.Tensor  # (N,) bool: the rows of the step's batch this process computes
    owners: torch.Tensor | None  # (B,) the rank computing each mini-batch row; None: this one
    own_in_batch: torch.Tensor | None  # (B,) bool: which mini-batch rows are this rank's

    @classmethod
    def of(cls, r: Rollouts, rows: torch.Tensor) -> RankRows:
        if not distributed.active():
            return cls(rows, None, None)
        mine = rows & distributed.owned(r.group_ids).to(rows.device)
        return cls(mine, distributed.owner(r.group_ids[rows.cpu()]), mine[rows])

    @property
    def sharded(self) -> bool:
        return self.owners is not None

    def gather(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """(b, T) tensors of this rank's rows → the (B, T) tensors of the whole mini-batch."""
        return tensors if self.owners is None else distributed.gather_rows(self.owners, tensors)

    def own(self, values: torch.Tensor) -> torch.Tensor:
        """(B, T) values of the whole mini-batch → (b, T) those of this rank's rows, in order."""
        return values if self.own_in_batch is None else values[self.own_in_batch]


def backward(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    step: int,
    known: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[PolicyBatch, torch.Tensor, ObjectiveOutput, bool]:
    """The objective on the rollouts in ``rows`` and its gradient in the trainable parameters'
    ``.grad``; returns (the objective's input, its (B, T) entropy, the objective's output,
    whether the backward was skipped). ``known``: the rows' (log-probs, entropy) under the
    current π_θ when already computed.

    An objective linear on policy whose gradient in the log-probs is zero everywhere (no group
    with signal: every group's rewards equal, no KL, no turn credit) is known to be so before any
    forward (``on_policy_gradient``): its rows then run one forward without grad (the step's
    scores, entropy and statistics as ever) and no backward at all.

    The model runs on this process's rows only (``RankRows``); the objective always on the
    whole mini-batch. Within ``optim.micro_batch_tokens`` one forward (in length buckets) keeps
    its graph. In one process the loss is differentiated through it directly. Otherwise the
    gradient comes in two passes, exactly the same: the objective is not a sum over rows (group
    normalisation, ConSPO's in-group InfoNCE, the token mean over the mini-batch), but it is a
    function of the (B, T) log-probs alone, so (a) the log-probs are computed (no grad, per
    micro-batch; or taken from the graph, or ``known``), (b) the objective's gradient in them,
    g = ∂loss/∂logprobs, comes from a backward through the objective only, and (c) each of this
    rank's micro-batches backpropagates Σ logprobs_mb · g_mb, whose gradients add up to the
    mini-batch's by the chain rule; in a process group the ranks' gradients then sum to the
    one-process gradient whatever the objective normalises by.
    """
    cfg, g = state.cfg, state.cfg.sampling.group_size
    share = RankRows.of(r, rows)
    sub = r.batch.select(share.mine)
    pieces = micro_batches(sub, g, cfg.optim.micro_batch_tokens) if bool(share.mine.any()) else []
    probe: torch.Tensor | None = None  # ∂loss/∂log-probs, where known before any forward
    if state.critic is not None and step <= state.critic.warmup:  # the critic learns alone
        return *without_gradient(state, r, rows, share, sub, pieces, step, known), True
    if old_logprobs is None and signal_known_before_forward(state):
        probe = on_policy_gradient(state, r, rows, step)
        if probe is None or not bool(probe.any()):
            return *without_gradient(state, r, rows, share, sub, pieces, step, known), True
    ref = None
    if state.params.beta > 0:
        own_ref = reference_logprobs(state, sub, pieces) if pieces else empty_rows(state, sub)
        assert own_ref is not None
        (ref,) = share.gather([own_ref])
    graph: torch.Tensor | None = None  # one forward with grad: its graph is kept for backward
    # Log-probs already known spare a process group nothing (its loss needs the gathered values
    # either way), so it reuses them; one process still runs its one forward with grad.
    if len(pieces) == 1 and (known is None or not share.sharded):
        with state.precision.autocast():
            graph, own_entropy = bucketed_logprobs(state, sub, length_buckets(sub, g), g)
        values, entropy = share.gather([graph.detach(), own_entropy.detach()])
    elif known is not None:
        values, entropy = known
    elif probe is not None and linear_on_policy(state):
        return *on_policy_backward(state, r, rows, share, sub, pieces, step, probe), False
    else:
        own = no_grad_logprobs(state, sub, pieces) if pieces else (empty_rows(state, sub),) * 2
        values, entropy = share.gather(list(own))
    if graph is not None and not share.sharded:
        batch = policy_batch(state, r, rows, graph, old_logprobs, ref, step, entropy)
        out = state.objective(batch, state.params)
        state.precision.backward(out.loss)
        return batch, entropy, out, False
    leaf = values.detach().requires_grad_()
    batch = policy_batch(state, r, rows, leaf, old_logprobs, ref, step, entropy)
    out = state.objective(batch, state.params)
    (dloss,) = torch.autograd.grad(out.loss, leaf, allow_unused=True)
    if dloss is None:  # the loss does not depend on the log-probs: no gradient anywhere
        return batch, entropy, out, False
    own_dloss = share.own(dloss)
    if graph is not None:
        state.precision.backward((graph * own_dloss[:, : graph.shape[1]]).sum())
    else:
        backward_pieces(state, sub, pieces, g, own_dloss)
    return batch, entropy, out, False


def linear_on_policy(state: TrainState) -> bool:
    """Whether the objective's gradient in the log-probs is known before any forward: registered
    ``linear_on_policy`` and no reference term (β = 0), and no mismatch correction (its weights
    are π_old's, known only after a forward). Callers add π_old = π_θ."""
    return signal_known_before_forward(state) and state.cfg.sampling.correction == "off"


def signal_known_before_forward(state: TrainState) -> bool:
    """Whether a zero gradient is known before any forward (``on_policy_gradient``): the
    objective is registered ``linear_on_policy`` and has no reference term (β = 0). A mismatch
    correction only scales each token's gradient, so zero stays zero under it."""
    algorithm = state.cfg.algorithm
    return (
        algorithm is not None
        and get_objective(algorithm).linear_on_policy
        and state.params.beta <= 0
    )


def on_policy_backward(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    share: RankRows,
    sub: RolloutBatch,
    pieces: list[torch.Tensor],
    step: int,
    dloss: torch.Tensor,
) -> tuple[PolicyBatch, torch.Tensor, ObjectiveOutput]:
    """``backward``'s split pass for an objective linear on policy (``linear_on_policy``, π_old =
    π_θ): ∂loss/∂log-probs does not depend on the log-probs, so it was taken at stand-in values
    (zeros) before any forward (``dloss``, not all zero: ``backward`` skips those), and each
    micro-batch's one forward is backpropagated as it runs, its log-probs and entropy kept (no
    grad) — no no-grad pass over the mini-batch first. The objective then runs on the real
    values, without grad, for its loss and stats: the same gradient, loss and stats as the
    two-pass route (tests/conspo/test_micro_batches.py)."""
    g = state.cfg.sampling.group_size
    if pieces:
        own = backward_pieces(state, sub, pieces, g, share.own(dloss), keep=True)
    else:
        own = (empty_rows(state, sub),) * 2
    values, entropy = share.gather(list(own))
    with torch.no_grad():
        batch = policy_batch(state, r, rows, values, None, None, step, entropy)
        out = state.objective(batch, state.params)
    return batch, entropy, out


def on_policy_gradient(
    state: TrainState, r: Rollouts, rows: torch.Tensor, step: int
) -> torch.Tensor | None:
    """(B, T) ∂loss/∂log-probs of an objective linear on policy (``linear_on_policy``) on the
    rollouts in ``rows``, taken at stand-in values (zeros) before any forward: it does not
    depend on the values. None where the loss does not read the log-probs at all."""
    n, t = int(rows.sum()), r.batch.response_ids.shape[1]
    stand_in = torch.zeros(n, t, device=state.device, requires_grad=True)
    blank = torch.zeros(n, t, device=state.device)
    probe = policy_batch(state, r, rows, stand_in, None, None, step, blank, correct=False)
    (dloss,) = torch.autograd.grad(
        state.objective(probe, state.params).loss, stand_in, allow_unused=True
    )
    return dloss


def without_gradient(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    share: RankRows,
    sub: RolloutBatch,
    pieces: list[torch.Tensor],
    step: int,
    known: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[PolicyBatch, torch.Tensor, ObjectiveOutput]:
    """``backward`` for rows whose gradient is known to be zero: their log-probs and entropy
    without grad (``known``, else one no-grad forward per micro-batch), the objective on them for
    its loss and stats, and no backward: no parameter gets a gradient, so no optimiser step."""
    if known is not None:
        values, entropy = known
    else:
        own = no_grad_logprobs(state, sub, pieces) if pieces else (empty_rows(state, sub),) * 2
        values, entropy = share.gather(list(own))
    with torch.no_grad():
        batch = policy_batch(state, r, rows, values, None, None, step, entropy)
        out = state.objective(batch, state.params)
    return batch, entropy, out


def bucketed_logprobs(
    state: TrainState, batch: RolloutBatch, buckets: list[torch.Tensor], g: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) log-probs (with grad) and entropy (no grad) of ``batch`` under π_θ, one forward
    per length bucket (``length_buckets``: whole groups or one group's rows, each run only as
    long as its longest answer), every bucket's graph kept for the one backward: the same
    values and gradient as a single forward over the whole batch, without its padding. 0 past a
    bucket's longest answer."""
    temperature = state.cfg.sampling.temperature
    if len(buckets) == 1:
        logprobs, entropy = token_logprobs(state.model, batch, temperature, True, g)
        assert entropy is not None
        return logprobs, entropy
    n, t = batch.response_ids.shape
    parts: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for idx in buckets:
        stopping.check()
        piece = trimmed(batch.select(idx.to(batch.response_ids.device)))
        logprobs, entropy = token_logprobs(
            state.model, piece, temperature, True, piece_group_size(idx, g)
        )
        assert entropy is not None
        parts.append(F.pad(logprobs.float(), (0, t - logprobs.shape[1])))
        entropies.append(F.pad(entropy.float(), (0, t - entropy.shape[1])))
    order = torch.cat(buckets)
    where = torch.empty_like(order)
    where[order] = torch.arange(n)  # row i of the batch is row where[i] of the buckets' rows
    where = where.to(state.device)
    return torch.cat(parts)[where], torch.cat(entropies)[where]


def backward_pieces(
    state: TrainState,
    sub: RolloutBatch,
    pieces: list[torch.Tensor],
    g: int,
    dloss: torch.Tensor,
    keep: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The second pass: each micro-batch's log-probs again, with grad, backpropagated weighted
    by ∂loss/∂log-prob (``dloss``, one row per row of ``sub``) — the exact gradient of the
    objective on the whole mini-batch, one micro-batch's activations at a time. With ``keep``,
    returns the (N, T) log-probs and entropy the forwards computed (no grad; else empty)."""
    n, t = sub.response_ids.shape
    values = torch.zeros(n if keep else 0, t, device=state.device)
    entropy = torch.zeros_like(values)
    for idx in pieces:
        stopping.check()
        piece = trimmed(sub.select(idx.to(sub.response_ids.device)))
        with state.precision.autocast():
            logprobs, piece_entropy = token_logprobs(
                state.model,
                piece,
                state.cfg.sampling.temperature,
                with_entropy=keep,
                group_size=piece_group_size(idx, g),
            )
        weights = dloss[idx.to(dloss.device), : logprobs.shape[1]]
        state.precision.backward((logprobs * weights).sum())
        if keep:
            assert piece_entropy is not None
            where = idx.to(state.device)
            values[where, : logprobs.shape[1]] = logprobs.detach().float()
            entropy[where, : logprobs.shape[1]] = piece_entropy.float()
    return values, entropy


def empty_rows(state: TrainState, batch: RolloutBatch) -> torch.Tensor:
    """(0, T): what a rank without rows in a mini-batch contributes to a gathered tensor."""
    return torch.zeros(0, batch.response_ids.shape[1], device=state.device)


def whole_no_grad_logprobs(state: TrainState, r: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
    """``no_grad_logprobs`` of the whole rollout batch; in a process group each rank computes
    its own groups' and they are gathered."""
    if not distributed.active():
        return no_grad_logprobs(state, r.batch)
    mine = distributed.owned(r.group_ids).to(r.batch.response_ids.device)
    sub = r.batch.select(mine)
    own = no_grad_logprobs(state, sub) if bool(mine.any()) else (empty_rows(state, sub),) * 2
    values, entropy = distributed.gather_rows(distributed.owner(r.group_ids), list(own))
    return values, entropy


def no_grad_logprobs(
    state: TrainState, batch: RolloutBatch, pieces: list[torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) log-probs and entropy of every row under the current π_θ, without grad, one
    micro-batch (``pieces``, default by optim.micro_batch_tokens) at a time."""
    temperature = state.cfg.sampling.temperature

    def run(piece: RolloutBatch, size: int) -> list[torch.Tensor]:
        logprobs, entropy = token_logprobs(state.model, piece, temperature, True, size)
        assert entropy is not None
        return [logprobs, entropy]

    logprobs, entropy = per_micro_batch(state, batch, pieces, run)
    return logprobs, entropy


def whole_reference_logprobs(state: TrainState, r: Rollouts) -> torch.Tensor:
    """``reference_logprobs`` of the whole rollout batch; in a process group each rank
    computes its own groups' and they are gathered."""
    if not distributed.active():
        ref = reference_logprobs(state, r.batch, None)
        assert ref is not None
        return ref
    mine = distributed.owned(r.group_ids).to(r.batch.response_ids.device)
    sub = r.batch.select(mine)
    own = reference_logprobs(state, sub, None) if bool(mine.any()) else empty_rows(state, sub)
    assert own is not None
    (values,) = distributed.gather_rows(distributed.owner(r.group_ids), [own])
    return values


def reference_logprobs(
    state: TrainState, batch: RolloutBatch, pieces: list[torch.Tensor] | None
) -> torch.Tensor | None:
    """(N, T) log π_ref (no grad), or None without a reference (no KL in the loss or the
    reward). With LoRA π_ref is the base model: the policy with its adapters disabled."""
    if not state.params.needs_reference:
        return None
    temperature = state.cfg.sampling.temperature

    def run(piece: RolloutBatch, size: int) -> list[torch.Tensor]:
        if state.ref_model is not None:
            return [token_logprobs(state.ref_model, piece, temperature, group_size=size)[0]]
        with state.model.disable_adapter():  # type: ignore[operator]  # a peft model
            return [token_logprobs(state.model, piece, temperature, group_size=size)[0]]

    (logprobs,) = per_micro_batch(state, batch, pieces, run)
    return logprobs


def per_micro_batch(
    state: TrainState,
    batch: RolloutBatch,
    pieces: list[torch.Tensor] | None,
    run: Callable[[RolloutBatch, int], list[torch.Tensor]],
) -> list[torch.Tensor]:
    """The (k, t) results of ``run(micro-batch, its group size)`` on each micro-batch, without
    grad, assembled into (N, T) float32 (0 past a micro-batch's t: ``trimmed``)."""
    g = state.cfg.sampling.group_size
    if pieces is None:
        pieces = micro_batches(batch, g, state.cfg.optim.micro_batch_tokens)
    n, t = batch.response_ids.shape
    results: list[torch.Tensor] = []
    with torch.no_grad(), state.precision.autocast():
        for idx in pieces:
            stopping.check()
            rows = idx.to(batch.response_ids.device)
            parts = run(trimmed(batch.select(rows)), piece_group_size(idx, g))
            if not results:
                results = [torch.zeros(n, t, device=state.device) for _ in parts]
            for full, part in zip(results, parts, strict=True):
                full[rows, : part.shape[1]] = part.float()
    return results


def policy_batch(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    step: int,
    entropy: torch.Tensor | None = None,
    correct: bool = True,
) -> PolicyBatch:
    """The objective's input for the rollouts in ``rows`` (N,) bool, whose π_θ log-probs are
    ``logprobs`` (B, T) (with grad) and per-token entropy ``entropy`` (B, T) (no grad).

    Under a mismatch correction (``sampling.mismatch_correction``) the log-probs keep their
    values and each token's gradient takes its importance weight π_old/μ
    (``conspo.training.mismatch``), π_old being ``old_logprobs`` or, with one update per batch,
    these log-probs' own values; ``correct=False`` leaves them unweighted (a probe at stand-in
    values, whose π_old would be the stand-ins)."""
    cfg, device = state.cfg, state.device
    rows_cpu = rows.cpu()
    mask = r.batch.model_mask[rows]  # the model's tokens: never a tool's output
    sampled = r.batch.sampled_logprobs
    if correct and cfg.sampling.correction != "off" and sampled is not None:
        old = logprobs.detach() if old_logprobs is None else old_logprobs
        weights = correction_weights(
            old, sampled[rows], mask, cfg.sampling.correction, cfg.sampling.mismatch_cap
        )
        logprobs = reweighted(logprobs, weights)
    return PolicyBatch(
        logprobs=logprobs,
        mask=mask,
        rewards=r.rewards[rows_cpu].to(device),
        group_ids=r.group_ids[rows_cpu].to(device),
        progress=step / cfg.steps,
        max_response_len=cfg.sampling.max_new_tokens,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        batch_reward_std=r.reward_std,  # the whole rollout batch's, not this mini-batch's
        whole=None if bool(rows_cpu.all()) else r.whole,
        correct=r.correct[rows_cpu].to(device),
        entropy=entropy,
        turn_advantages=None
        if r.turn_advantages is None
        else r.turn_advantages[rows_cpu].to(device),
        values=None if r.values is None else r.values[rows].to(device),
        token_rewards=None if r.token_rewards is None else r.token_rewards[rows_cpu].to(device),
        turn_index=None
        if r.values is None or r.batch.turn_index is None
        else r.batch.turn_index[rows].to(device),
        anchor_scores=None if r.anchor_scores is None else r.anchor_scores[rows_cpu].to(device),
    )
