"""The step's rollouts: prompts drawn, G samples each, verified and rewarded, kept as whole groups.

    rollouts = collect_rollouts(state, step, should_stop)   # None: stopped, nothing to train

``collect_rollouts`` runs the sampling rounds (dynamic sampling's refill keeps only groups with
both outcomes and tops up); ``sample_round`` splits a round's prompts over the ranks of a process
group and gathers the whole round on every rank; ``sample_groups`` samples, decodes and scores one
share (``conspo.rewards``: the verifier's outcome and the shaped reward). Batched rewards read the
policy through ``continuation_logprobs``. ``prompt_records`` keeps the per-prompt history (every
group drawn, kept or not). Round r of step s draws its prompts and sampling noise from (seed, s,
r) alone.

Shapes: N = groups × G rollouts, rows of a group contiguous.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial

import torch
import torch.nn.functional as F

from conspo.credit import turn_advantages
from conspo.distributed import collectives as distributed
from conspo.generation.batch import CallRecord, GenerationStopped, RolloutBatch, SampleRequest
from conspo.generation.rollout import encode_prompts, end_token_ids
from conspo.generation.tool_rollout import verified_texts
from conspo.objectives.base import WholeBatch, positive_mask, sequence_scores
from conspo.rewards import RewardContext, score_rollouts
from conspo.sink import PromptRecord, prompt_key
from conspo.tasks import Example
from conspo.tasks.base import distinct_prompts
from conspo.tasks.environment import with_episode
from conspo.training.logprobs import token_logprobs
from conspo.training.loop import TrainState, step_seed


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
    # (N, T') the turn-level advantage of each token, on the CPU (``conspo.credit``); None:
    # outcome credit.
    turn_advantages: torch.Tensor | None = None
    # (N,) bool on the CPU: a reward failed on the rollout (it lost that reward, scored 0)
    reward_lost: torch.Tensor | None = None
    # (N,) the critique a reward gave with each rollout's value (a judge's first judgement,
    # ``RewardScores.critiques``), None where none did; None: no reward gives critiques
    critiques: list[str | None] | None = None
    # An objective with a critic (``conspo.training.critic.scored``): (N, T') V(s_t) of each
    # token when the batch was scored, and (N, T') the reward each token earned; None without.
    values: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    # An objective with anchors (``conspo.training.anchors``): (N,) each rollout's score
    # against them, on the CPU, once their head is frozen; None before or without.
    anchor_scores: torch.Tensor | None = None

    @cached_property
    def reward_std(self) -> float:
        """Population std of the shaped rewards over the whole rollout batch: what
        ``scale_rewards: batch`` divides by in every mini-batch (rewards live on the CPU)."""
        return float(self.rewards.float().std(correction=0))

    @cached_property
    def whole(self) -> WholeBatch:
        """The whole rollout batch, for normalisers that span it (on the CPU, like rewards)."""
        lengths = self.batch.model_lengths.cpu()
        return WholeBatch(self.rewards, self.group_ids, lengths)


def collect_rollouts(
    state: TrainState, step: int, should_stop: Callable[[], bool]
) -> Rollouts | None:
    """Sample groups; with refill_groups keep only groups with both outcomes and top up, for at
    most params.max_refill_rounds extra rounds; what is still missing then is the shortfall.
    None when ``should_stop`` fired between rounds or during generation (one process).

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
        rng = random.Random(step_seed(cfg.seed, step, f"p{r}"))
        prompts = distinct_prompts(state.task, rng, want)
        try:
            last = sample_round(state, prompts, step, r, should_stop)
        except GenerationStopped:
            return None
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


def sample_round(
    state: TrainState,
    prompts: list[Example],
    step: int,
    r: int,
    should_stop: Callable[[], bool] | None = None,
) -> Rollouts:
    """Round ``r`` of step ``step``: G rollouts per prompt, verified, rows in prompt order.

    In a process group each rank samples its share of the prompts (``distributed.my_share``)
    with sampling noise of its own, and every rank gets the whole round: refill decisions,
    mini-batch plans and logged statistics are then the same everywhere, computed as one
    process would. The rollouts themselves differ from one process's (the noise is per rank).
    ``should_stop`` is asked during generation in one process only (``GenerationStopped``).
    """
    seed = step_seed(state.cfg.seed, step, f"s{r}")
    if not distributed.active():
        return sample_groups(state, prompts, seed, should_stop)
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
        turn_advantages=_rows_of(whole.turn_advantages, rows),
        reward_lost=_rows_of(whole.reward_lost, rows),
        critiques=_items_of(whole.critiques, rows),
    )


def rollouts_to(r: Rollouts, device: torch.device) -> Rollouts:
    """``r`` with its rollout batch on ``device`` (rewards and ids stay on the CPU)."""
    return Rollouts(
        r.batch.to(device),
        r.rewards,
        r.correct,
        r.group_ids,
        r.generated,
        reward_parts=r.reward_parts,
        turn_advantages=r.turn_advantages,
        reward_lost=r.reward_lost,
        critiques=r.critiques,
    )


def draw_rollouts(
    state: TrainState,
    prompts: list[Example],
    seed: int,
    *,
    share_prefill: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
    """(batch, prompt ids, prompt mask) of ``sampling.group_size`` G samples of each prompt
    from the policy at the run's sampling settings, drawn from ``seed``; rows [i*G, (i+1)*G)
    belong to prompts[i]. ``share_prefill``: each group's prompt is prefilled once.
    ``should_stop``: asked during generation (``SampleRequest.should_stop``)."""
    cfg = state.cfg
    g = cfg.sampling.group_size
    texts = [ex.prompt for ex in prompts for _ in range(g)]
    ids, mask = encode_prompts(state.tokenizer, texts, state.device)
    generator = torch.Generator(device=state.device).manual_seed(seed)
    state.model.eval()
    request = SampleRequest(
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_id=end_token_ids(state.tokenizer, state.model),
        pad_id=state.tokenizer.pad_token_id,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        generator=generator,
        group_size=g if share_prefill else 1,
        should_stop=should_stop,
        examples=[ex for ex in prompts for _ in range(g)],
    )
    batch = state.engine.sample(state.model, ids, mask, request)
    return batch, ids, mask


def sample_groups(
    state: TrainState,
    prompts: list[Example],
    seed: int,
    should_stop: Callable[[], bool] | None = None,
) -> Rollouts:
    """G rollouts per prompt, verified; rows [i*G, (i+1)*G) belong to prompts[i]."""
    cfg = state.cfg
    g = cfg.sampling.group_size
    expanded = [ex for ex in prompts for _ in range(g)]
    batch, ids, mask = draw_rollouts(state, prompts, seed, should_stop=should_stop)
    if batch.episodes is not None:  # what each rollout played: verify and rewards read it
        expanded = [with_episode(ex, ep) for ex, ep in zip(expanded, batch.episodes, strict=True)]
    texts = verified_texts(state.tokenizer, batch)
    scorer = partial(continuation_logprobs, state, ids, mask)
    context = RewardContext(
        state.task, cfg.sampling.max_new_tokens, 0, g, scorer, models=state.reward_models
    )
    # The model's own tokens, as len/* counts them: a tool's output is not the model's length.
    lengths = batch.model_lengths.tolist()
    scored = score_rollouts(state.rewards, texts, expanded, lengths, context)
    parts = {name: torch.tensor(values) for name, values in scored.parts.items()}
    group_ids = torch.arange(len(prompts)).repeat_interleave(g)
    rewards = torch.tensor(scored.shaped)
    credit = None
    if batch.turn_index is not None and batch.episodes is not None:
        env = cfg.environment
        credit = turn_advantages(
            batch.turn_index, batch.episodes, rewards, group_ids, env.credit,
            gamma=env.gamma, weight=env.step_weight,
        )  # fmt: skip
    return Rollouts(
        batch,
        rewards,
        torch.tensor(scored.outcome),
        group_ids,
        generated=len(expanded),
        reward_parts=parts,
        turn_advantages=credit,
        reward_lost=torch.tensor(scored.lost, dtype=torch.bool),
        critiques=scored.critiques if any(c is not None for c in scored.critiques) else None,
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
        batch,
        r.rewards[rows],
        r.correct[rows],
        group_ids,
        r.generated,
        reward_parts=parts,
        turn_advantages=_rows_of(r.turn_advantages, rows),
        reward_lost=_rows_of(r.reward_lost, rows),
        critiques=_items_of(r.critiques, rows),
    )


def _rows_of(values: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if values is None else values[rows.cpu()]


def _items_of(values: list[str | None] | None, rows: torch.Tensor) -> list[str | None] | None:
    """``values`` at ``rows`` (a bool mask or indices, as ``_rows_of`` takes them)."""
    if values is None:
        return None
    picked = rows.cpu()
    picked = picked.nonzero().squeeze(1) if picked.dtype == torch.bool else picked
    return [values[i] for i in picked.tolist()]


def _concat_sampled(batches: list[RolloutBatch], t: int) -> torch.Tensor | None:
    """The rounds' sampler log-probs, right-padded to ``t``; None unless every round has them
    (a step's rounds come from one engine, so all or none do)."""
    parts = [b.sampled_logprobs for b in batches]
    if any(x is None for x in parts):
        return None
    return torch.cat([F.pad(x, (0, t - x.shape[1])) for x in parts if x is not None])


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
        *_concat_tool_fields([x.batch for x in parts], t),
        _concat_sampled([x.batch for x in parts], t),
        *_concat_turn_fields([x.batch for x in parts], t),
    )
    credits = [x.turn_advantages for x in parts if x.turn_advantages is not None]
    credit = torch.cat([pad(c, t, False, 0.0) for c in credits]) if credits else None
    rewards = torch.cat([x.rewards for x in parts])
    correct = torch.cat([x.correct for x in parts])
    group_ids = torch.arange(len(rewards) // g).repeat_interleave(g)
    reward_parts = {k: torch.cat([x.reward_parts[k] for x in parts]) for k in parts[0].reward_parts}
    losses = [x.reward_lost for x in parts if x.reward_lost is not None]
    critiqued = any(x.critiques is not None for x in parts)
    critiques = [c for x in parts for c in (x.critiques or [None] * len(x.rewards))]
    return Rollouts(
        batch,
        rewards,
        correct,
        group_ids,
        sum(x.generated for x in parts),
        reward_parts=reward_parts,
        turn_advantages=credit,
        reward_lost=torch.cat(losses) if len(losses) == len(parts) else None,
        critiques=critiques if critiqued else None,
    )


def _concat_tool_fields(
    batches: list[RolloutBatch], width: int
) -> tuple[torch.Tensor | None, list[list[CallRecord]] | None, float]:
    """(observation mask, calls, tool seconds) of stacked rounds (None: rollouts without tools)."""
    if all(b.observation_mask is None for b in batches):
        return None, None, sum(b.tool_seconds for b in batches)
    masks = [
        F.pad(b.model_mask * 0 if b.observation_mask is None else b.observation_mask,
              (0, width - b.response_ids.shape[1]))
        for b in batches
    ]  # fmt: skip
    calls = [row for b in batches for row in (b.tool_calls or [[]] * len(b.lengths))]
    return torch.cat(masks), calls, sum(b.tool_seconds for b in batches)


def _concat_turn_fields(
    batches: list[RolloutBatch], width: int
) -> tuple[torch.Tensor | None, list[object] | None]:
    """(turn index, episodes) of stacked rounds (None: rollouts without an environment)."""
    if any(b.turn_index is None or b.episodes is None for b in batches):
        return None, None
    index = [b.turn_index for b in batches if b.turn_index is not None]
    padded = [F.pad(x, (0, width - x.shape[1]), value=-1) for x in index]
    return torch.cat(padded), [e for b in batches for e in b.episodes or []]


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
