"""InstructGPT's KL penalty in the reward (params.kl_in_reward, issue 51 item 3): each rollout's
reward loses β · Σ_t (log π_old − log π_ref) over its own tokens before the advantages, while the
verified outcome and the logged rewards stay the task's. Real tiny models, a real step."""

from __future__ import annotations

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.training.logprobs import token_logprobs
from conspo.training.loop import setup
from conspo.training.rollouts import collect_rollouts
from conspo.training.trainer import train_step
from conspo.training.update import kl_in_reward, update

BETA_R = 0.5


def config(lora_rank: int, kl: float = BETA_R) -> RunConfig:
    lora = {"rank": lora_rank, "alpha": max(2 * lora_rank, 1)}
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 4,
        "seed": 3,
        "params": {"kl_in_reward": kl},
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 4},
        "model": {"name": "tiny-arith", "lora": lora},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "optim": {"lr": 5e-2, "mini_batches": 2},
        "eval": {"every": 0},
        "checkpoint": {"every": 0, "keep": 1},
    })  # fmt: skip


def reference_logprobs(state, batch) -> torch.Tensor:
    temperature = state.cfg.sampling.temperature
    with torch.no_grad():
        if state.ref_model is not None:
            return token_logprobs(state.ref_model, batch, temperature)[0]
        with state.model.disable_adapter():
            return token_logprobs(state.model, batch, temperature)[0]


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_each_reward_loses_beta_times_its_kl_before_the_advantages(model_store, lora_rank):
    state = setup(config(lora_rank), model_store)
    # Full fine-tuning keeps a frozen copy; LoRA's reference is the base, adapters off.
    assert (state.ref_model is not None) == (lora_rank == 0)
    first = train_step(state, 1, lambda: False)
    assert first is not None
    # Step 1 samples from the starting policy, which is the reference: no penalty yet.
    assert abs(first.metrics[M.KL_IN_REWARD]) < 1e-4

    with state.precision.autocast():
        r = collect_rollouts(state, 2, lambda: False)
    assert r is not None
    state.model.eval()
    with torch.no_grad():
        old = token_logprobs(state.model, r.batch, state.cfg.sampling.temperature)[0]
    ref = reference_logprobs(state, r.batch)
    mask = r.batch.model_mask
    sequence_kl = ((old - ref) * mask).sum(-1)
    assert sequence_kl.abs().max() > 1e-3  # the policy moved at step 1: there is a penalty
    expected = r.rewards - BETA_R * sequence_kl

    penalised, stats = kl_in_reward(state, r, old)
    torch.testing.assert_close(penalised.rewards, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats[M.KL_IN_REWARD], sequence_kl.mean(), atol=1e-5, rtol=1e-5)
    assert torch.equal(penalised.correct, r.correct)  # who is positive: the verifier alone

    # What the objective itself is handed, mini-batch by mini-batch (whole groups, in order).
    seen: list[torch.Tensor] = []
    objective = state.objective

    def recording(batch, params):
        seen.append(batch.rewards.detach().clone())
        return objective(batch, params)

    state.objective = recording
    stats, _, _ = update(state, r, 2, 1e-3)
    torch.testing.assert_close(torch.cat(seen), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(stats[M.KL_IN_REWARD], sequence_kl.mean(), atol=1e-4, rtol=1e-4)
    # The rollouts themselves (what is logged and stored) keep the task's rewards.
    assert not torch.equal(r.rewards, expected)


def test_without_it_no_reference_is_loaded_and_nothing_is_logged(model_store):
    state = setup(config(0, kl=0.0), model_store)
    assert state.ref_model is None
    record = train_step(state, 1, lambda: False)
    assert record is not None and M.KL_IN_REWARD not in record.metrics
