"""Exact gradient accumulation (optim.micro_batch_tokens) and gradient checkpointing: the
gradient of every optimiser step equals the one of a single pass over the mini-batch."""

from __future__ import annotations

import pytest
import torch

from conspo.access import ModelSources
from conspo.config import RunConfig
from conspo.generation.batch import RolloutBatch
from conspo.models.resources import estimate_memory, source_dims
from conspo.tasks import make_task
from conspo.training import microbatch
from conspo.training import update as update_module
from conspo.training.loop import setup
from conspo.training.microbatch import length_buckets, micro_batches, trimmed
from conspo.training.rollouts import collect_rollouts
from conspo.training.update import update


def config(algorithm: str, mini_batches: int, **model) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": algorithm,
        # DAPO's default overlong buffer (8) would cover these 6-token responses whole.
        "params": {"overlong_buffer": 2} if algorithm == "dapo" else {},
        "steps": 4,
        "seed": 1,
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 4},
        "model": {"name": "tiny-arith", **model},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "optim": {"mini_batches": mini_batches},
    })  # fmt: skip


def step_gradients(cfg: RunConfig, store, rollouts=None, budget: int = 0):
    """The flattened gradient of each optimiser step of one update, and the rollouts it used."""
    optim = cfg.optim.model_copy(update={"micro_batch_tokens": budget})
    grads, rollouts, _ = spied_update(cfg.model_copy(update={"optim": optim}), store, rollouts)
    return grads, rollouts


def spied_update(cfg: RunConfig, store, rollouts=None):
    """One update of ``cfg`` (on ``rollouts``, else on a step it samples): the flattened
    gradient of each of its optimiser steps, the rollouts and the update's stats."""
    state = setup(cfg, store)
    # SGD moves the weights by the gradient alone (AdamW would blow float noise up in coordinates
    # with a near-zero gradient), so later mini-batches start from the same weights.
    state.optimizer = torch.optim.SGD(state.trainable, lr=1e-2)
    if rollouts is None:
        rollouts = collect_rollouts(state, 1, lambda: False)
    grads = []
    step = state.precision.step

    def spy(optimizer, params, max_norm):
        grads.append(torch.cat([p.grad.flatten() for p in params]))
        return step(optimizer, params, max_norm)

    state.precision.step = spy  # type: ignore[method-assign]
    stats, _, _ = update(state, rollouts, 1, state.cfg.optim.lr)
    return grads, rollouts, stats


def assert_same_gradients(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g - w).norm() <= 1e-5 * w.norm(), ((g - w).norm() / w.norm()).item()


@pytest.mark.parametrize("algorithm", ["conspo", "grpo", "dapo"])
@pytest.mark.parametrize("mini_batches", [1, 2])
def test_micro_batches_add_up_to_the_mini_batch_gradient(algorithm, mini_batches, model_store,
                                                         arith_base):  # fmt: skip
    cfg = config(algorithm, mini_batches)
    whole, rollouts = step_gradients(cfg, model_store)
    row = int(rollouts.batch.prompt_mask.sum(-1).max() + rollouts.batch.response_mask.sum(-1).max())
    pieces = micro_batches(rollouts.batch, 4, 2 * row)
    assert len(pieces) > len(rollouts.group_ids) // 4  # groups were split by rows
    for budget in (2 * row, 5 * row):  # rows of a group apart; whole groups (a group is 4 rows)
        split, _ = step_gradients(cfg, model_store, rollouts, budget)
        assert_same_gradients(split, whole)


def test_a_memory_budget_splits_the_pass_as_planned_and_keeps_the_gradient(model_store,
                                                                          arith_base):  # fmt: skip
    cfg = config("conspo", 1)
    whole, rollouts = step_gradients(cfg, model_store)
    dims = source_dims(ModelSources().locate("tiny-arith"))
    assert dims is not None
    # as the trainer plans it: sampling's columns include the built task's prompts
    unsplit = estimate_memory(cfg, dims, 4, task=make_task(cfg.task))
    assert unsplit.micro_batch_tokens == 0  # this small step needs no split by itself
    transients = max(unsplit.sampling, unsplit.evaluation)
    assert unsplit.update > transients
    # A budget that leaves the update only what sampling takes: the pass must be split.
    held = unsplit.process + unsplit.state
    optim = cfg.optim.model_copy(update={"memory_budget": (held + transients) / 2**30})
    budgeted = cfg.model_copy(update={"optim": optim})
    planned = setup(budgeted, model_store).cfg.optim.micro_batch_tokens
    assert planned > 0 and len(micro_batches(rollouts.batch, 4, planned)) > 1
    split, _ = step_gradients(budgeted, model_store, rollouts)
    assert_same_gradients(split, whole)


@pytest.mark.parametrize("algorithm", ["grpo", "conspo"])
def test_a_split_pass_runs_a_no_grad_forward_only_where_the_objective_needs_one(
    algorithm, model_store, arith_base, monkeypatch
):
    """GRPO is linear on policy: its split pass takes ∂loss/∂log-probs before any forward and
    runs one forward per micro-batch; ConSPO's in-group softmax needs the log-probs first (a
    no-grad pass). Either way the step's stats are those of one unsplit pass."""
    cfg = config(algorithm, 1)
    _, rollouts = step_gradients(cfg, model_store)

    def run(budget: int) -> tuple[dict, list[bool]]:
        calls: list[bool] = []
        real = update_module.token_logprobs

        def spy(*args, **kwargs):
            calls.append(torch.is_grad_enabled())
            return real(*args, **kwargs)

        monkeypatch.setattr(update_module, "token_logprobs", spy)
        optim = cfg.optim.model_copy(update={"micro_batch_tokens": budget})
        state = setup(cfg.model_copy(update={"optim": optim}), model_store)
        stats, _, _ = update(state, rollouts, 1, state.cfg.optim.lr)
        monkeypatch.setattr(update_module, "token_logprobs", real)
        return stats, calls

    whole, whole_calls = run(0)
    row = int(rollouts.batch.prompt_mask.sum(-1).max() + rollouts.batch.response_mask.sum(-1).max())
    pieces = micro_batches(rollouts.batch, 4, 5 * row)
    assert len(pieces) > 1
    split, split_calls = run(5 * row)
    with_grad = [c for c in split_calls if c]
    assert len(with_grad) == len(pieces)  # one forward with grad per micro-batch
    no_grad = len(split_calls) - len(with_grad)
    assert no_grad == (0 if algorithm == "grpo" else len(pieces)), split_calls
    assert set(split) == set(whole)
    for key, value in whole.items():
        torch.testing.assert_close(split[key], value, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   msg=key)  # fmt: skip


@pytest.mark.parametrize("lora", [0, 4])
def test_gradient_checkpointing_gives_the_same_gradient(lora, model_store, arith_base):
    cfg = config("conspo", 1, lora={"rank": lora})
    plain, rollouts = step_gradients(cfg, model_store)
    cfg = config("conspo", 1, lora={"rank": lora}, gradient_checkpointing=True)
    checkpointed, _ = step_gradients(cfg, model_store, rollouts)
    assert_same_gradients(checkpointed, plain)
    row = int(rollouts.batch.prompt_mask.sum(-1).max() + rollouts.batch.response_mask.sum(-1).max())
    both, _ = step_gradients(cfg, model_store, rollouts, budget=3 * row)
    assert_same_gradients(both, plain)


def batch(prompt_lens: list[int], response_lens: list[int]) -> RolloutBatch:
    n, p, t = len(prompt_lens), max(prompt_lens) + 1, max(response_lens) + 2
    prompt_mask = torch.tensor([[0] * (p - k) + [1] * k for k in prompt_lens])
    response_mask = torch.tensor([[1.0] * k + [0.0] * (t - k) for k in response_lens])
    ids = torch.ones(n, p, dtype=torch.long)
    return RolloutBatch(ids, prompt_mask, torch.ones(n, t, dtype=torch.long), response_mask,
                        torch.tensor(response_lens), torch.zeros(n, dtype=torch.bool))  # fmt: skip


def test_micro_batches_keep_groups_whole_within_the_budget():
    b = batch([3, 3, 2, 2, 4, 4], [5, 1, 2, 2, 6, 6])  # three groups of two
    # Padded cost: rows × (longest prompt + longest response) after trimming.
    assert [p.tolist() for p in micro_batches(b, 2, 0)] == [[0, 1, 2, 3, 4, 5]]
    assert [p.tolist() for p in micro_batches(b, 2, 32)] == [[0, 1, 2, 3], [4, 5]]
    assert [p.tolist() for p in micro_batches(b, 2, 20)] == [[0, 1], [2, 3], [4, 5]]
    assert [p.tolist() for p in micro_batches(b, 2, 10)] == [[0], [1], [2, 3], [4], [5]]
    assert [p.tolist() for p in micro_batches(b, 2, 1)] == [[i] for i in range(6)]
    t = trimmed(b.select(torch.tensor([2, 3])))
    assert t.prompt_ids.shape == (2, 2) and t.response_ids.shape == (2, 2)


def test_the_first_mini_batch_reuses_the_frozen_old_logprobs(model_store, arith_base,
                                                             monkeypatch):  # fmt: skip
    """With mini-batches and micro-batches, π_old's pass is also the first mini-batch's."""
    calls = []
    real = update_module.token_logprobs

    def spy(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(update_module, "token_logprobs", spy)
    cfg = config("grpo", 2)
    grads, rollouts = step_gradients(cfg, model_store, budget=10_000_000)
    assert calls.count(False) == 1  # the budget holds everything: one no-grad pass, π_old
    assert len(grads) == 2


def test_length_buckets_cut_where_padding_costs_more_than_a_forward():
    # Groups of two: (5, 1), (2, 2), (100, 90): one forward would run all six rows 100 long.
    b = batch([3, 3, 3, 3, 3, 3], [5, 1, 2, 2, 100, 90])
    assert [p.tolist() for p in length_buckets(b, 2)] == [[0, 1, 2, 3], [4, 5]]
    # Answers of like length: splitting saves less than a forward costs.
    b = batch([3, 3, 3, 3, 3, 3], [5, 1, 2, 2, 6, 6])
    assert [p.tolist() for p in length_buckets(b, 2)] == [[0, 1, 2, 3, 4, 5]]
    # The longest group first in the batch: pieces are whole groups, each in batch order.
    b = batch([3, 3, 4, 4, 3, 3], [100, 90, 2, 2, 5, 1])
    assert [p.tolist() for p in length_buckets(b, 2)] == [[2, 3, 4, 5], [0, 1]]


def test_length_buckets_split_a_group_whose_one_answer_runs_to_the_limit():
    """A group of four whose third answer ran to 128 tokens among answers of 4-6: its three
    short rows and its long one become two pieces (the prompt runs twice), not four rows 128
    long; the group of like lengths stays whole, and every row is in one piece."""
    b = batch([3] * 8, [5, 6, 128, 4, 5, 5, 6, 7])
    pieces = [p.tolist() for p in length_buckets(b, 4)]
    assert pieces == [[4, 5, 6, 7], [0, 1, 3], [2]]
    # Two long answers of four: cut after the short ones; one of 9 among 4-6: not worth a forward.
    b = batch([3] * 8, [128, 6, 120, 4, 5, 9, 6, 4])
    assert [p.tolist() for p in length_buckets(b, 4)] == [[4, 5, 6, 7], [1, 3], [0, 2]]


@pytest.mark.parametrize("algorithm", ["conspo", "grpo"])
def test_length_buckets_give_the_single_forward_gradient(algorithm, model_store, arith_base,
                                                          monkeypatch):  # fmt: skip
    """One gradient pass over length buckets (each its own forward, one backward through all)
    gives the gradient of one forward over the whole padded mini-batch."""
    cfg = config(algorithm, 1)
    monkeypatch.setattr(
        update_module, "length_buckets", lambda batch, g: [torch.arange(len(batch.lengths))]
    )
    whole, rollouts = step_gradients(cfg, model_store)
    monkeypatch.undo()
    monkeypatch.setattr(microbatch, "BUCKET_OVERHEAD_TOKENS", 0)  # split wherever it saves a token
    buckets = length_buckets(rollouts.batch, 4)
    assert len(buckets) > 1
    calls = []
    real = update_module.token_logprobs

    def spy(model, batch, *args, **kwargs):
        calls.append(batch.response_ids.shape)
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(update_module, "token_logprobs", spy)
    bucketed, _ = step_gradients(cfg, model_store, rollouts)
    assert len(calls) == len(buckets)  # one forward per bucket, no extra no-grad pass
    assert sum(rows for rows, _ in calls) == len(rollouts.group_ids)
    assert_same_gradients(bucketed, whole)
    # A group cut in two pieces (each sharing its prompt across its rows), the rest whole.
    n = len(rollouts.group_ids)
    cut = [torch.tensor([0, 2]), torch.tensor([1, 3]), torch.arange(4, n)]
    monkeypatch.setattr(update_module, "length_buckets", lambda batch, g: cut)
    calls.clear()
    split, _ = step_gradients(cfg, model_store, rollouts)
    assert len(calls) == 3
    assert_same_gradients(split, whole)
