"""The sampler/trainer mismatch (conspo.training.mismatch): the importance weights of each mode
against numbers worked by hand, the gradient of an update whose sampler was deliberately stale
against TRL's per-token formula computed independently, and the mismatch/* statistics of real
runs of the native engine."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from pydantic import ValidationError

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.sink import MemorySink
from conspo.training.logprobs import token_logprobs
from conspo.training.loop import setup
from conspo.training.mismatch import correction_weights, mismatch_stats, reweighted
from conspo.training.trainer import train
from tests.conspo.test_micro_batches import spied_update

# Two rollouts: three tokens and two (the third position is padding).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]])
# log μ: the first rollout's tokens sampled likelier than π_old says, the second's less likely
SAMPLED = torch.tensor([[-1.5, -2.0, -1.5], [0.0, -1.0, 0.0]])


def test_each_mode_weights_tokens_as_worked_by_hand():
    # log(π_old/μ) per token: [0.5, 0, 1.0] and [-0.3, -0.2, (pad)]
    ratios = [[math.exp(0.5), 1.0, math.exp(1.0)], [math.exp(-0.3), math.exp(-0.2)]]
    seq = [math.exp(1.5), math.exp(-0.5)]  # exp of each rollout's summed log ratio
    cap = 2.0
    want = {
        "token_truncate": [[ratios[0][0], 1.0, cap], [ratios[1][0], ratios[1][1]]],
        "token_mask": [[ratios[0][0], 1.0, 0.0], [ratios[1][0], ratios[1][1]]],
        "sequence_truncate": [[cap] * 3, [seq[1]] * 2],
        "sequence_mask": [[0.0] * 3, [seq[1]] * 2],
        "off": [[1.0] * 3, [1.0] * 2],
    }
    for mode, rows in want.items():
        got = correction_weights(OLD, SAMPLED, MASK, mode, cap)
        assert got[0].tolist() == pytest.approx(rows[0], rel=1e-6), mode
        assert got[1, :2].tolist() == pytest.approx(rows[1], rel=1e-6), mode
    stats = mismatch_stats(OLD, SAMPLED, MASK, "token_truncate", cap)
    diffs = [0.5, 0.0, 1.0, -0.3, -0.2]
    assert float(stats[M.MISMATCH_LOGP_DIFF_MEAN]) == pytest.approx(sum(map(abs, diffs)) / 5)
    assert float(stats[M.MISMATCH_LOGP_DIFF_MAX]) == pytest.approx(1.0)
    k3 = sum(math.exp(x) - x - 1 for x in diffs) / 5
    assert float(stats[M.MISMATCH_KL]) == pytest.approx(k3, rel=1e-6)
    assert float(stats[M.MISMATCH_CORRECTED_FRAC]) == pytest.approx(1 / 5)  # the e^1 token
    truncated = [min(math.exp(x), cap) for x in diffs]
    assert float(stats[M.MISMATCH_WEIGHT_MEAN]) == pytest.approx(sum(truncated) / 5, rel=1e-6)
    by_rollout = mismatch_stats(OLD, SAMPLED, MASK, "sequence_mask", cap)
    assert float(by_rollout[M.MISMATCH_CORRECTED_FRAC]) == pytest.approx(1 / 2)
    assert float(by_rollout[M.MISMATCH_WEIGHT_MEAN]) == pytest.approx(seq[1] / 2, rel=1e-6)


def test_the_kl_of_a_sampler_agreeing_to_float32_noise_is_small_and_never_negative():
    # The native engine and the trainer agree to float32 noise (|Δ log p| ~ 1e-6, SmolLM2's
    # GRPO in issue 49's walk): e^x − x − 1 in float32 cancelled to about ±1e-7 a token and the
    # logged KL came out negative (−1.9e-9). The exact value is x²/2 on average, ~1e-10 here.
    g = torch.Generator().manual_seed(0)
    sampled = -torch.rand(8, 48, generator=g) * 3
    old = sampled + (torch.rand(8, 48, generator=g) - 0.5) * 4e-5
    mask = torch.ones(8, 48)
    mask[:, 40:] = 0  # padding carries no KL
    x = (old.double() - sampled.double())[:, :40]
    exact = float((x.exp() - x - 1).mean())
    kl = float(mismatch_stats(old, sampled, mask, "off", 3.0)[M.MISMATCH_KL])
    assert kl >= 0
    assert kl == pytest.approx(exact, rel=1e-3)


def test_reweighting_keeps_the_values_and_scales_each_gradient():
    x = torch.randn(2, 3, requires_grad=True)
    w = torch.tensor([[0.5, 2.0, 0.0], [1.0, 3.0, 1.0]])
    y = reweighted(x, w)
    assert torch.equal(y.detach(), x.detach())  # bit for bit
    y.sum().backward()
    assert torch.equal(x.grad, w)


def config(**sampling) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 4,
        "seed": 3,
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 4},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, **sampling},
    })  # fmt: skip


def update_gradient(cfg: RunConfig, store, rollouts=None):
    """The flattened gradient of the one optimiser step of an update, the rollouts and stats."""
    (grad,), rollouts, stats = spied_update(cfg, store, rollouts)
    return grad, rollouts, stats


def trl_gradient(cfg: RunConfig, store, rollouts, mode: str, cap: float) -> torch.Tensor:
    """TRL's vLLM correction written out, independently of the trainer: GRPO's on-policy loss
    −Â·ρ_t per token (ρ = 1 in value), each token's loss × its truncated ratio π_old/μ (per
    token, or the rollout's product), mean over each rollout's tokens then over rollouts."""
    state = setup(cfg, store)
    batch = rollouts.batch
    logprobs, _ = token_logprobs(state.model, batch, cfg.sampling.temperature)
    mask = batch.model_mask
    rewards = rollouts.rewards.float().view(-1, 4)
    mean, std = rewards.mean(-1, keepdim=True), rewards.std(-1, correction=0, keepdim=True)
    adv = torch.where(std > 1e-6, (rewards - mean) / std.clamp_min(1e-6), 0.0).view(-1, 1)
    diff = (logprobs.detach() - batch.sampled_logprobs) * mask
    if mode == "sequence_truncate":
        diff = diff.sum(-1, keepdim=True)
    weight = diff.exp().clamp(max=cap)
    per_token = -adv * (logprobs - logprobs.detach()).exp() * weight
    loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in state.trainable])


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_a_stale_sampler_changes_the_gradient_as_the_formula_says(mode, model_store, arith_base):
    plain, rollouts, _ = update_gradient(config(mismatch_correction="off"), model_store)
    assert rollouts.batch.sampled_logprobs is not None  # the native engine said what it drew
    # A stale sampler: μ off π_old by up to ±0.4 nats a token, as if drawn a few updates back.
    noise = torch.empty_like(rollouts.batch.sampled_logprobs).uniform_(
        -0.4, 0.4, generator=torch.Generator().manual_seed(0)
    )
    stale_batch = dataclasses.replace(
        rollouts.batch,
        sampled_logprobs=(rollouts.batch.sampled_logprobs + noise) * rollouts.batch.model_mask,
    )
    stale = dataclasses.replace(rollouts, batch=stale_batch)
    cfg = config(mismatch_correction=mode, mismatch_cap=1.2)
    corrected, _, stats = update_gradient(cfg, model_store, stale)
    want = trl_gradient(cfg, model_store, stale, mode, 1.2)
    assert (corrected - want).norm() <= 1e-4 * want.norm(), ((corrected - want).norm()).item()
    assert (corrected - plain).norm() > 0.05 * plain.norm()  # the correction did something
    assert float(stats[M.MISMATCH_CORRECTED_FRAC]) > 0  # some ratios passed the cap of 1.2
    assert float(stats[M.MISMATCH_LOGP_DIFF_MAX]) <= 0.4 + 1e-3


def test_the_native_engine_reports_what_it_sampled_with_and_runs_are_drawn_it(
    model_store, arith_base, tmp_path
):
    sink = MemorySink()
    cfg = config(mismatch_correction="token_mask")
    train(cfg, sink, workdir=tmp_path, model_store=model_store)
    steps = [r.metrics for r in sink.steps.values() if M.MISMATCH_KL in r.metrics]
    assert len(steps) == cfg.steps
    for metrics in steps:
        # the native decode and the training forward are the same float32 model: no gap to
        # speak of, so nothing is masked and every weight is ~1
        assert 0 <= metrics[M.MISMATCH_LOGP_DIFF_MEAN] < 1e-3
        assert metrics[M.MISMATCH_CORRECTED_FRAC] == 0
        assert metrics[M.MISMATCH_WEIGHT_MEAN] == pytest.approx(1, abs=1e-3)


def test_a_correction_without_sampler_logprobs_is_refused():
    with pytest.raises(ValidationError, match="mismatch_correction"):
        config(engine="hf", mismatch_correction="token_truncate")
    assert config(engine="vllm").sampling.correction == "sequence_mask"
    assert config().sampling.correction == "off"
