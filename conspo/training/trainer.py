"""The RLVR step: prompts → rollouts → rewards → log-probs → objective → update → log.

    result = train(RunConfig.from_file("run.yaml"), JsonlSink("out/metrics.jsonl"),
                   workdir="out", model_store=ModelStore())

``train`` is the one training loop (``conspo.training.loop.run_loop``: setup, resume,
checkpoints, evaluation, cancellation) around ``train_step``.

One step samples ``prompts_per_step`` groups of ``group_size`` rollouts, rewards them (the
configured reward functions, ``conspo.rewards``: the verifier's outcome decides who is positive,
their weighted sum is the reward the objective sees), scores them under the current policy, and
takes ``optim.epochs × optim.mini_batches`` optimiser steps on the registered objective
(``conspo.registry``), each on a mini-batch of whole groups; an update
whose gradient is exactly zero (no group carries signal) takes no optimiser step, and a step that
took none does not tick the learning-rate schedule (``optim/skipped``). The loop never branches
on the algorithm: the objective is a function of a ``PolicyBatch`` and its params, and what the
§4 separation statistics need of the algorithm (τ, m_t, ε) comes from ``params.separation_view``.
The forward passes (shared-prompt prefill, token log-probs) live in ``conspo.generation.forward``.
All randomness of a step (prompts, sampling, mini-batch order, evaluation) is a function of
(seed, step), so a run resumed from a checkpoint reproduces the uninterrupted run exactly on CPU.

Inside a ``torch.distributed`` process group (``conspo.distributed.collectives``: its local
launcher, or Ray Train) the same loop runs on every rank: each samples and differentiates its own
whole groups, every rank sees the whole batch's rollouts and the objective's whole mini-batch,
gradients are summed, and rank 0 alone logs, checkpoints and evaluates. Without a group nothing
changes.

Shapes: N = groups × G rollouts, P prompt positions, T response positions.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

import torch
import torch.nn.functional as F

from conspo import metrics as M
from conspo.access import DataFiles
from conspo.config import RunConfig
from conspo.distributed import collectives as distributed
from conspo.generation.forward import logprob_mode, token_logprobs
from conspo.generation.rollout import RolloutBatch, decode_responses, encode_prompts, end_token_ids
from conspo.models.store import ModelStore
from conspo.objectives.base import (
    ObjectiveOutput,
    PolicyBatch,
    SeparationView,
    WholeBatch,
    clipped_ratio_scores,
    k3_kl,
    positive_mask,
    sequence_scores,
)
from conspo.rewards import RewardContext, score_rollouts
from conspo.sink import (
    PromptRecord,
    RolloutRecord,
    Sink,
    StepRecord,
    clip_text,
    prompt_key,
)
from conspo.tasks import Example
from conspo.training.loop import (
    TrainResult,
    TrainState,
    eval_due,
    lr_at,
    run_eval,
    run_loop,
    step_seed,
)
from conspo.training.microbatch import length_buckets, micro_batches, trimmed
from conspo.training.stats import offpolicy_stats, separation_stats


@dataclass
class Rollouts:
    """The step's training batch: whole groups, rollouts of a group contiguous."""

    batch: RolloutBatch
    rewards: torch.Tensor  # (N,) shaped rewards the objective sees: Σ weight · reward
    correct: torch.Tensor  # (N,) verified rewards in {0,1}
    group_ids: torch.Tensor  # (N,) 0..groups-1
    generated: int  # rollouts sampled this step, refill rounds included
    shortfall: int = 0  # groups missing from prompts_per_step after the last refill round
    refill_rounds: int = 0  # extra generation rounds dynamic sampling drew
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)  # name → (N,) unweighted
    # Every prompt sampled this step, refill rounds and dropped groups included (None: the
    # batch's own groups are all there were).
    prompts: list[PromptRecord] | None = None

    @cached_property
    def reward_std(self) -> float:
        """Population std of the shaped rewards over the whole rollout batch: what
        ``scale_rewards: batch`` divides by in every mini-batch (rewards live on the CPU)."""
        return float(self.rewards.float().std(correction=0))

    @cached_property
    def whole(self) -> WholeBatch:
        """The whole rollout batch, for normalisers that span it (on the CPU, like rewards)."""
        lengths = self.batch.response_mask.sum(-1).cpu()
        return WholeBatch(self.rewards, self.group_ids, lengths)


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


def train(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
) -> TrainResult:
    """Train ``config`` to ``config.steps``, resuming from ``workdir``'s latest checkpoint: the
    one loop (``conspo.training.loop.run_loop``: its arguments) around ``train_step``."""
    return run_loop(
        config,
        sink,
        should_stop,
        workdir=workdir,
        start=lambda state, files, store: partial(train_step, state),
        model_store=model_store,
        files=files,
        memory_limit=memory_limit,
    )


def train_step(state: TrainState, step: int, should_stop: Callable[[], bool]) -> StepRecord | None:
    """One step; None when should_stop() fired between rollout rounds (nothing was updated)."""
    cfg = state.cfg
    t0 = time.perf_counter()
    with state.precision.autocast():
        rollouts = collect_rollouts(state, step, should_stop)
    if rollouts is None:
        return None
    t_rollout = time.perf_counter() - t0
    lr = lr_at(cfg, state.trained_steps + 1)  # the schedule ticks only on steps that updated
    stats, scores, updates = update(state, rollouts, step, lr)
    state.trained_steps += int(updates > 0)
    state.engine.sync(state.model)
    t_step = time.perf_counter() - t0
    state.rollouts_seen += rollouts.generated
    floats = {
        M.TIME_STEP_S: t_step,
        M.TIME_ROLLOUT_S: t_rollout,
        M.THROUGHPUT_ROLLOUTS_PER_S: rollouts.generated / t_step,
        M.ROLLOUTS_SEEN: float(state.rollouts_seen),
        M.LR: lr,
        M.OPTIM_UPDATES: float(updates),
        M.OPTIM_SKIPPED: float(updates == 0),
        M.BATCH_SHORTFALL_GROUPS: float(rollouts.shortfall),
        M.BATCH_REFILL_ROUNDS: float(rollouts.refill_rounds),
        **{M.reward_key(k): float(v.mean()) for k, v in rollouts.reward_parts.items()},
    }
    if eval_due(cfg, step):
        floats.update(run_eval(state, step))
    return make_record(state, step, stats, floats, rollouts, scores)


# --------------------------------------------------------------------------------------------
# Rollouts and rewards
# --------------------------------------------------------------------------------------------


def collect_rollouts(
    state: TrainState, step: int, should_stop: Callable[[], bool]
) -> Rollouts | None:
    """Sample groups; with refill_groups keep only groups with both outcomes and top up, for at
    most params.max_refill_rounds extra rounds; what is still missing then is the shortfall.

    Round r of step s draws its prompts and sampling noise from (seed, s, r) alone.
    """
    cfg, params = state.cfg, state.params
    want, g = cfg.sampling.prompts_per_step, cfg.sampling.group_size
    rounds = 1 + (params.max_refill_rounds if params.refill_groups else 0)
    kept: list[Rollouts] = []
    drawn: list[PromptRecord] = []  # every group sampled, kept or not: the per-prompt history
    n_kept, generated = 0, 0
    for r in range(rounds):
        if r > 0 and should_stop():
            return None
        prompts = state.task.train_prompts(random.Random(step_seed(cfg.seed, step, f"p{r}")), want)
        last = sample_round(state, prompts, step, r)
        generated += last.generated
        if not params.refill_groups:
            return last
        drawn += prompt_records(state, last)
        valid = mixed_groups(last.correct, g)
        if valid.any():
            kept.append(keep_groups(last, valid, g))
            n_kept += int(valid.sum())
        if n_kept >= want:
            break
    if not kept:  # refill found no group with both outcomes: train on the last round (no signal)
        kept = [last]
    merged = concat_rollouts(kept, g, state.tokenizer.pad_token_id)
    if len(merged.group_ids) > want * g:
        merged = keep_groups(merged, torch.arange(len(merged.group_ids) // g) < want, g)
    merged.generated = generated
    merged.shortfall = max(0, want - n_kept)
    merged.refill_rounds = r  # the last round drawn: round 0 is the regular one
    merged.prompts = merge_prompt_records(drawn)
    return merged


def sample_round(state: TrainState, prompts: list[Example], step: int, r: int) -> Rollouts:
    """Round ``r`` of step ``step``: G rollouts per prompt, verified, rows in prompt order.

    In a process group each rank samples its share of the prompts (``distributed.my_share``)
    with sampling noise of its own, and every rank gets the whole round: refill decisions,
    mini-batch plans and logged statistics are then the same everywhere, computed as one
    process would. The rollouts themselves differ from one process's (the noise is per rank).
    """
    seed = step_seed(state.cfg.seed, step, f"s{r}")
    if not distributed.active():
        return sample_groups(state, prompts, seed)
    mine = distributed.my_share(len(prompts))
    seed = step_seed(state.cfg.seed, step, f"s{r}:{distributed.rank()}")
    local = sample_groups(state, [prompts[i] for i in mine], seed)
    everyone = distributed.gather_objects(rollouts_to(local, torch.device("cpu")))
    g = state.cfg.sampling.group_size
    whole = concat_rollouts(
        [rollouts_to(x, state.device) for x in everyone], g, state.tokenizer.pad_token_id
    )
    # Rank-major → prompt order: prompt i is rank (i mod W)'s (i div W)-th group.
    world = distributed.world_size()
    starts = torch.tensor([0] + [len(x.group_ids) // g for x in everyone]).cumsum(0)
    groups = torch.tensor([int(starts[i % world]) + i // world for i in range(len(prompts))])
    rows = (groups[:, None] * g + torch.arange(g)).flatten()
    parts = {k: v[rows] for k, v in whole.reward_parts.items()}
    batch = whole.batch.select(rows.to(whole.batch.response_ids.device))
    group_ids = torch.arange(len(prompts)).repeat_interleave(g)
    return Rollouts(
        batch,
        whole.rewards[rows],
        whole.correct[rows],
        group_ids,
        whole.generated,
        reward_parts=parts,
    )


def rollouts_to(r: Rollouts, device: torch.device) -> Rollouts:
    """``r`` with its rollout batch on ``device`` (rewards and ids stay on the CPU)."""
    b = r.batch
    batch = RolloutBatch(
        b.prompt_ids.to(device),
        b.prompt_mask.to(device),
        b.response_ids.to(device),
        b.response_mask.to(device),
        b.lengths.to(device),
        b.truncated.to(device),
    )
    return Rollouts(
        batch, r.rewards, r.correct, r.group_ids, r.generated, reward_parts=r.reward_parts
    )


def draw_rollouts(
    state: TrainState, prompts: list[Example], seed: int, *, share_prefill: bool = True
) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
    """(batch, prompt ids, prompt mask) of ``sampling.group_size`` G samples of each prompt
    from the policy at the run's sampling settings, drawn from ``seed``; rows [i*G, (i+1)*G)
    belong to prompts[i]. ``share_prefill``: each group's prompt is prefilled once."""
    cfg = state.cfg
    g = cfg.sampling.group_size
    texts = [ex.prompt for ex in prompts for _ in range(g)]
    ids, mask = encode_prompts(state.tokenizer, texts, state.device)
    generator = torch.Generator(device=state.device).manual_seed(seed)
    state.model.eval()
    batch = state.engine.sample(
        state.model,
        ids,
        mask,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_id=end_token_ids(state.tokenizer, state.model),
        pad_id=state.tokenizer.pad_token_id,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        generator=generator,
        group_size=g if share_prefill else 1,
    )
    return batch, ids, mask


def sample_groups(state: TrainState, prompts: list[Example], seed: int) -> Rollouts:
    """G rollouts per prompt, verified; rows [i*G, (i+1)*G) belong to prompts[i]."""
    cfg = state.cfg
    g = cfg.sampling.group_size
    expanded = [ex for ex in prompts for _ in range(g)]
    batch, ids, mask = draw_rollouts(state, prompts, seed)
    texts = decode_responses(state.tokenizer, batch)
    scorer = partial(continuation_logprobs, state, ids, mask)
    context = RewardContext(state.task, cfg.sampling.max_new_tokens, 0, g, scorer)
    lengths = batch.lengths.tolist()
    scored = score_rollouts(state.rewards, texts, expanded, lengths, context)
    parts = {name: torch.tensor(values) for name, values in scored.parts.items()}
    group_ids = torch.arange(len(prompts)).repeat_interleave(g)
    return Rollouts(
        batch,
        torch.tensor(scored.shaped),
        torch.tensor(scored.outcome),
        group_ids,
        generated=len(expanded),
        reward_parts=parts,
    )


def continuation_logprobs(
    state: TrainState,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    rows: Sequence[int],
    contexts: Sequence[str],
    continuations: Sequence[str],
) -> list[float]:
    """For each of ``rows`` (indices into the (N, P) prompts), the mean log π(continuation |
    prompt, context) at the sampling temperature, without grad: what batched rewards read the
    policy through (``RewardContext.continuation_logprob``). Context and continuation are
    tokenised apart, so a continuation is scored as the same tokens after any context."""
    if not rows:
        return []
    encode = state.tokenizer(list(contexts) + list(continuations), add_special_tokens=False)
    heads, tails = encode.input_ids[: len(rows)], encode.input_ids[len(rows) :]
    width = max(len(h) + len(t) for h, t in zip(heads, tails, strict=True))
    ids = torch.full((len(rows), width), state.tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(len(rows), width)
    tail_mask = torch.zeros(len(rows), width)
    for i, (head, tail) in enumerate(zip(heads, tails, strict=True)):
        ids[i, : len(head) + len(tail)] = torch.tensor(head + tail, dtype=torch.long)
        response_mask[i, : len(head) + len(tail)] = 1
        tail_mask[i, len(head) : len(head) + len(tail)] = 1
    index = torch.tensor(list(rows), device=prompt_ids.device)
    lengths = response_mask.sum(-1).long()
    batch = RolloutBatch(
        prompt_ids[index],
        prompt_mask[index],
        ids.to(state.device),
        response_mask.to(state.device),
        lengths.to(state.device),
        torch.zeros(len(rows), dtype=torch.bool, device=state.device),
    )
    with torch.no_grad():
        logprobs, _ = token_logprobs(state.model, batch, state.cfg.sampling.temperature)
    return sequence_scores(logprobs.float(), tail_mask.to(state.device)).tolist()


def mixed_groups(correct: torch.Tensor, g: int) -> torch.Tensor:
    """(groups,) bool: groups with both positives and negatives (``positive_mask``)."""
    n_pos = positive_mask(correct.view(-1, g)).sum(-1)
    return (n_pos > 0) & (n_pos < g)


def keep_groups(r: Rollouts, keep: torch.Tensor, g: int) -> Rollouts:
    """The groups where ``keep`` (groups,) is True, renumbered 0..k-1."""
    rows = keep.repeat_interleave(g)
    batch = r.batch.select(rows.to(r.batch.response_ids.device))
    group_ids = torch.arange(int(keep.sum())).repeat_interleave(g)
    parts = {name: values[rows] for name, values in r.reward_parts.items()}
    return Rollouts(
        batch, r.rewards[rows], r.correct[rows], group_ids, r.generated, reward_parts=parts
    )


def concat_rollouts(parts: list[Rollouts], g: int, pad_id: int) -> Rollouts:
    """Stack rounds: prompts re-padded on the left, responses on the right."""
    if len(parts) == 1:
        return parts[0]
    p = max(x.batch.prompt_ids.shape[1] for x in parts)
    t = max(x.batch.response_ids.shape[1] for x in parts)

    def pad(x: torch.Tensor, width: int, left: bool, value: float) -> torch.Tensor:
        extra = width - x.shape[1]
        return F.pad(x, (extra, 0) if left else (0, extra), value=value)

    batch = RolloutBatch(
        torch.cat([pad(x.batch.prompt_ids, p, True, pad_id) for x in parts]),
        torch.cat([pad(x.batch.prompt_mask, p, True, 0) for x in parts]),
        torch.cat([pad(x.batch.response_ids, t, False, pad_id) for x in parts]),
        torch.cat([pad(x.batch.response_mask, t, False, 0.0) for x in parts]),
        torch.cat([x.batch.lengths for x in parts]),
        torch.cat([x.batch.truncated for x in parts]),
    )
    rewards = torch.cat([x.rewards for x in parts])
    correct = torch.cat([x.correct for x in parts])
    group_ids = torch.arange(len(rewards) // g).repeat_interleave(g)
    reward_parts = {k: torch.cat([x.reward_parts[k] for x in parts]) for k in parts[0].reward_parts}
    return Rollouts(
        batch,
        rewards,
        correct,
        group_ids,
        sum(x.generated for x in parts),
        reward_parts=reward_parts,
    )


# --------------------------------------------------------------------------------------------
# Score → objective → update
# --------------------------------------------------------------------------------------------


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
    if len(plan) > 1:  # π_old must be frozen before the first optimiser step moves π_θ
        before_update = whole_no_grad_logprobs(state, r)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    view = state.params.separation_view(step / cfg.steps)
    per_update: list[dict[str, torch.Tensor]] = []
    scores = torch.empty(len(r.group_ids), device=device)
    clipped = torch.empty(len(r.group_ids), device=device)
    taken = 0
    for i, chunk in enumerate(plan):
        rows = (r.group_ids[:, None] == chunk[None]).any(-1).to(device)  # (N,) whole groups
        # The first mini-batch's π_θ is still π_old: its no-grad pass is already done.
        known = None
        if before_update is not None and i == 0:
            known = before_update[0][rows], before_update[1][rows]
        old_logprobs = None if before_update is None else before_update[0][rows]
        # Behaviour scores are π_old's in every epoch; clipped-ratio scores end as the last's.
        stats, scores[rows], clipped[rows], stepped = optimise_chunk(
            state, r, rows, old_logprobs, step, view, known
        )
        per_update.append(stats)
        taken += stepped
    # §4 on log-prob scores whatever the objective; τ, m_t, ε are the objective's own view.
    sep = separation_stats(
        scores,
        r.correct.to(device),
        r.group_ids.to(device),
        r.batch.lengths.to(device),
        margin=view.margin,
        tau=view.tau,
        clipped_scores=clipped,
    )
    truncated = {M.LEN_TRUNCATED_FRAC: r.batch.truncated.float().mean()}
    return {**combined(per_update), **sep, **truncated}, scores, taken


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
    batch, entropy, out = backward_chunk(state, r, rows, old_logprobs, step, known)
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
    }
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


def backward_chunk(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    step: int,
    known: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[PolicyBatch, torch.Tensor, ObjectiveOutput]:
    """The objective on the rollouts in ``rows`` and its gradient in the trainable parameters'
    ``.grad``; returns (the objective's input, its (B, T) entropy, the objective's output).

    Within ``optim.micro_batch_tokens`` one forward keeps its graph and the loss is
    differentiated through it. Above, exactly the same gradient in micro-batches: the objective is
    not a sum over rows (group normalisation, ConSPO's in-group InfoNCE, the token mean over the
    mini-batch), but it is a function of the (B, T) log-probs alone, so (a) a no-grad pass gives
    the log-probs, (b) the objective's gradient in them, g = ∂loss/∂logprobs, comes from a
    backward through the objective only, and (c) each micro-batch's forward backpropagates
    Σ logprobs_mb · g_mb, whose gradients add up to the mini-batch's by the chain rule.
    """
    if distributed.active():
        return backward_sharded(state, r, rows, old_logprobs, step, known)
    cfg = state.cfg
    sub = r.batch.select(rows)
    g = cfg.sampling.group_size
    pieces = micro_batches(sub, g, cfg.optim.micro_batch_tokens)
    ref = reference_logprobs(state, sub, pieces)
    if len(pieces) == 1:
        with state.precision.autocast():
            logprobs, entropy = bucketed_logprobs(state, sub, length_buckets(sub, g), g)
        batch = policy_batch(state, r, rows, logprobs, old_logprobs, ref, step, entropy.detach())
        out = state.objective(batch, state.params)
        state.precision.backward(out.loss)
        return batch, entropy, out
    values, entropy = known if known is not None else no_grad_logprobs(state, sub, pieces)
    leaf = values.detach().requires_grad_()
    batch = policy_batch(state, r, rows, leaf, old_logprobs, ref, step, entropy)
    out = state.objective(batch, state.params)
    (dloss_dlogprobs,) = torch.autograd.grad(out.loss, leaf)
    backward_pieces(state, sub, pieces, g, dloss_dlogprobs)
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


def backward_sharded(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    step: int,
    known: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[PolicyBatch, torch.Tensor, ObjectiveOutput]:
    """``backward_chunk`` in a process group: this rank runs the model on its own groups of
    ``rows`` only; the objective runs on the whole mini-batch (every rank's log-probs,
    ``distributed.gather_rows``), and this rank backpropagates g = ∂loss/∂logprobs of its own
    rows (the two-pass rule of ``backward_chunk``), so the ranks' gradients sum to the
    1-process gradient whatever the objective normalises by. Returns what ``backward_chunk``
    does, for the whole mini-batch."""
    cfg, g = state.cfg, state.cfg.sampling.group_size
    mine = rows & distributed.owned(r.group_ids).to(rows.device)  # (N,) this rank's rows
    owners = distributed.owner(r.group_ids[rows.cpu()])  # (B,) who computes each row
    sub = r.batch.select(mine)
    pieces = micro_batches(sub, g, cfg.optim.micro_batch_tokens) if bool(mine.any()) else []
    graph: torch.Tensor | None = None  # one forward with grad: keep its graph for the backward
    if known is not None:
        values, entropy = known
    elif len(pieces) == 1:
        with state.precision.autocast():
            graph, own_entropy = token_logprobs(
                state.model, sub, cfg.sampling.temperature, with_entropy=True, group_size=g
            )
        assert own_entropy is not None
        values, entropy = distributed.gather_rows(owners, [graph.detach(), own_entropy.detach()])
    else:
        computed = no_grad_logprobs(state, sub, pieces) if pieces else (empty_rows(state, sub),) * 2
        values, entropy = distributed.gather_rows(owners, list(computed))
    ref = None
    if state.params.beta > 0:
        own_ref = reference_logprobs(state, sub, pieces) if pieces else empty_rows(state, sub)
        assert own_ref is not None
        (ref,) = distributed.gather_rows(owners, [own_ref])
    leaf = values.detach().requires_grad_()
    batch = policy_batch(state, r, rows, leaf, old_logprobs, ref, step, entropy)
    out = state.objective(batch, state.params)
    (dloss,) = torch.autograd.grad(out.loss, leaf, allow_unused=True)
    if dloss is None:  # the loss does not depend on the log-probs: no gradient anywhere
        return batch, entropy, out
    own = dloss[mine[rows]]  # (b, T) this rank's rows, in order
    if graph is not None:
        state.precision.backward((graph * own[:, : graph.shape[1]]).sum())
        return batch, entropy, out
    backward_pieces(state, sub, pieces, g, own)
    return batch, entropy, out


def backward_pieces(
    state: TrainState, sub: RolloutBatch, pieces: list[torch.Tensor], g: int, dloss: torch.Tensor
) -> None:
    """The second pass: each micro-batch's log-probs again, with grad, backpropagated weighted
    by ∂loss/∂log-prob (``dloss``, one row per row of ``sub``) — the exact gradient of the
    objective on the whole mini-batch, one micro-batch's activations at a time."""
    for idx in pieces:
        piece = trimmed(sub.select(idx.to(sub.response_ids.device)))
        with state.precision.autocast():
            logprobs, _ = token_logprobs(
                state.model,
                piece,
                state.cfg.sampling.temperature,
                group_size=piece_group_size(idx, g),
            )
        weights = dloss[idx.to(dloss.device), : logprobs.shape[1]]
        state.precision.backward((logprobs * weights).sum())


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


def reference_logprobs(
    state: TrainState, batch: RolloutBatch, pieces: list[torch.Tensor]
) -> torch.Tensor | None:
    """(N, T) log π_ref (no grad), or None without a reference (β = 0). With LoRA π_ref is the
    base model: the policy with its adapters disabled."""
    if state.params.beta <= 0:
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
            rows = idx.to(batch.response_ids.device)
            parts = run(trimmed(batch.select(rows)), piece_group_size(idx, g))
            if not results:
                results = [torch.zeros(n, t, device=state.device) for _ in parts]
            for full, part in zip(results, parts, strict=True):
                full[rows, : part.shape[1]] = part.float()
    return results


def piece_group_size(idx: torch.Tensor, g: int) -> int:
    """The prompt-sharing group size of a micro-batch: G for whole groups; a piece of one group
    shares its prompt across all its rows (token_logprobs checks either claim)."""
    return len(idx) if len(idx) < g else g


def policy_batch(
    state: TrainState,
    r: Rollouts,
    rows: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    step: int,
    entropy: torch.Tensor | None = None,
) -> PolicyBatch:
    """The objective's input for the rollouts in ``rows`` (N,) bool, whose π_θ log-probs are
    ``logprobs`` (B, T) (with grad) and per-token entropy ``entropy`` (B, T) (no grad)."""
    cfg, device = state.cfg, state.device
    rows_cpu = rows.cpu()
    return PolicyBatch(
        logprobs=logprobs,
        mask=r.batch.response_mask[rows],
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
    )


# --------------------------------------------------------------------------------------------
# Evaluation and logging
# --------------------------------------------------------------------------------------------


def make_record(
    state: TrainState,
    step: int,
    stats: dict[str, torch.Tensor],
    floats: dict[str, float],
    r: Rollouts,
    scores: torch.Tensor,
) -> StepRecord:
    """Build the StepRecord with a single device→host copy of every tensor statistic."""
    n = len(r.group_ids)
    keep = min(state.cfg.logging.rollout_sample, n)
    idx = (
        torch.linspace(0, n - 1, keep).round().long() if keep else torch.empty(0, dtype=torch.long)
    )
    keys = list(stats)
    b = r.batch
    packed = torch.cat(
        [
            torch.stack([stats[k] for k in keys]),
            scores.float()[idx.to(scores.device)],
            b.lengths[idx.to(b.lengths.device)].float().to(scores.device),
            b.truncated[idx.to(b.lengths.device)].float().to(scores.device),
        ]
    )
    values = packed.cpu().tolist()  # the step's one device→host sync
    metrics = {**dict(zip(keys, values[: len(keys)], strict=True)), **floats}
    g = state.cfg.sampling.group_size
    sample_scores, lengths, truncated = (
        values[len(keys) + j * keep : len(keys) + (j + 1) * keep] for j in range(3)
    )
    prompts_text, completions = sampled_texts(state, r, idx.tolist())
    records = [
        RolloutRecord(
            group=i // g,
            index=i % g,
            reward=float(r.correct[i]),
            score=s,
            length=int(n_tok),
            truncated=bool(tr),
            prompt=p_text,
            completion=c_text,
        )
        for i, s, n_tok, tr, p_text, c_text in zip(
            idx.tolist(), sample_scores, lengths, truncated, prompts_text, completions, strict=True
        )
    ]
    metrics = {k: (v if math.isfinite(v) else float("nan")) for k, v in metrics.items()}
    prompts = r.prompts if r.prompts is not None else prompt_records(state, r)
    return StepRecord(step, state.cfg.steps, time.time(), metrics, records, prompts)


def sampled_texts(state: TrainState, r: Rollouts, rows: list[int]) -> tuple[list[str], list[str]]:
    """(prompt, completion) texts of the sampled rollout ``rows``, clipped to
    ``ROLLOUT_TEXT_CHARS``: a few dozen rows decoded once per step, for the rollout table."""
    if not rows:
        return [], []
    b = r.batch
    at = torch.tensor(rows, dtype=torch.long)
    p_ids, p_mask = b.prompt_ids[at.to(b.prompt_ids.device)].cpu(), b.prompt_mask.cpu()[at]
    prompts = state.tokenizer.batch_decode(
        [ids[m.bool()].tolist() for ids, m in zip(p_ids, p_mask, strict=True)]
    )
    completions = state.tokenizer.batch_decode(
        b.response_ids[at.to(b.response_ids.device)].cpu().tolist(), skip_special_tokens=True
    )
    return [clip_text(t) for t in prompts], [clip_text(t) for t in completions]


def prompt_records(state: TrainState, r: Rollouts) -> list[PromptRecord]:
    """One record per distinct prompt of the step: its rollouts and how many were correct.

    The key hashes the prompt text the policy saw (the group's first row, padding dropped);
    a prompt drawn in two groups adds up. ``correct`` lives on the CPU, the prompt ids are a few
    hundred integers: no work that shows next to a step.
    """
    g = state.cfg.sampling.group_size
    firsts = r.batch.prompt_ids[::g].cpu()
    masks = r.batch.prompt_mask[::g].cpu().bool()
    tokens = [ids[m].tolist() for ids, m in zip(firsts, masks, strict=True)]
    texts = state.tokenizer.batch_decode(tokens)
    correct = positive_mask(r.correct).view(-1, g).sum(-1).tolist()
    return merge_prompt_records(
        [PromptRecord(prompt_key(text), g, int(c)) for text, c in zip(texts, correct, strict=True)]
    )


def merge_prompt_records(records: list[PromptRecord]) -> list[PromptRecord]:
    """One record per key, rollouts and correct counts added (a prompt drawn twice in a step)."""
    by_key: dict[str, PromptRecord] = {}
    for rec in records:
        total = by_key.setdefault(rec.key, PromptRecord(rec.key, 0, 0))
        total.n += rec.n
        total.correct += rec.correct
    return list(by_key.values())
