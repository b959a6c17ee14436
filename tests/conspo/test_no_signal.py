"""A step without signal (every group's rewards equal) of an objective linear on policy runs no
backward: its zero gradient is known before any forward. Its record is the one the full route
gives, and nothing moves."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.training import update as update_module
from conspo.training.loop import setup
from conspo.training.rollouts import collect_rollouts
from conspo.training.update import update


def config(algorithm: str, **sampling) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": algorithm,
        "steps": 4,
        "seed": 5,
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 4},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, **sampling},
    })  # fmt: skip


def run_update(cfg, store, rollouts, monkeypatch, full_route: bool):
    """(stats, scores, optimiser steps, backward calls, weights before, weights after)."""
    state = setup(cfg, store)
    if rollouts is None:
        rollouts = collect_rollouts(state, 1, lambda: False)
    calls = []
    real = state.precision.backward
    state.precision.backward = lambda loss: (calls.append(1), real(loss))  # type: ignore[method-assign]
    if full_route:
        monkeypatch.setattr(update_module, "signal_known_before_forward", lambda state: False)
    before = [p.detach().clone() for p in state.trainable]
    stats, scores, taken = update(state, rollouts, 1, state.cfg.optim.lr)
    monkeypatch.undo()
    after = [p.detach() for p in state.trainable]
    return rollouts, stats, scores, taken, len(calls), before, after


def silenced(rollouts):
    """The rollouts with every reward 0: no group has signal."""
    zeros = torch.zeros_like(rollouts.rewards)
    return dataclasses.replace(rollouts, rewards=zeros, correct=torch.zeros_like(rollouts.correct))


@pytest.mark.parametrize("sampling", [{}, {"mismatch_correction": "token_truncate"}])
def test_a_step_without_signal_skips_the_backward_and_logs_the_same(
    sampling, model_store, arith_base, monkeypatch
):
    cfg = config("grpo", **sampling)
    rollouts, *_ = run_update(cfg, model_store, None, monkeypatch, False)
    quiet = silenced(rollouts)
    _, stats, scores, taken, backwards, before, after = run_update(
        cfg, model_store, quiet, monkeypatch, False
    )
    assert backwards == 0 and taken == 0
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert float(stats[M.OPTIM_BACKWARD_SKIPPED]) == 1.0
    _, full, full_scores, full_taken, full_backwards, *_ = run_update(
        cfg, model_store, quiet, monkeypatch, True
    )
    assert full_backwards == 1 and full_taken == 0  # the old route: a backward for nothing
    assert float(full[M.OPTIM_BACKWARD_SKIPPED]) == 0.0
    assert torch.allclose(scores, full_scores, atol=1e-6)
    for key, value in full.items():
        if key == M.OPTIM_BACKWARD_SKIPPED:
            continue
        got, want = float(stats[key]), float(value)
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-6), key


def test_a_step_with_signal_or_a_contrastive_objective_runs_its_backward(
    model_store, arith_base, monkeypatch
):
    cfg = config("grpo")
    rollouts, *_ = run_update(cfg, model_store, None, monkeypatch, False)
    rewards = torch.zeros_like(rollouts.rewards)
    rewards[0] = 1.0  # one group with signal
    one = dataclasses.replace(rollouts, rewards=rewards, correct=rewards.clone())
    _, stats, _, taken, backwards, *_ = run_update(cfg, model_store, one, monkeypatch, False)
    assert backwards == 1 and taken == 1 and float(stats[M.OPTIM_BACKWARD_SKIPPED]) == 0.0
    # ConSPO's in-group softmax is not linear on policy: its zero is not known before a forward
    conspo = config("conspo")
    _, stats, _, taken, backwards, *_ = run_update(
        conspo, model_store, silenced(rollouts), monkeypatch, False
    )
    assert backwards == 1 and taken == 0 and float(stats[M.OPTIM_BACKWARD_SKIPPED]) == 0.0
