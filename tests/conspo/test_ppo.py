"""PPO with a value model (conspo.objectives.ppo, conspo.training.critic): GAE against numbers
worked by hand, per token and per environment turn; the clipped surrogate's loss and gradient
against a reference written out independently; the clipped value loss; and a run of the tiny
model whose critic learns, survives a resume exactly, and holds the policy still while it warms
up."""

from __future__ import annotations

import math

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.objectives.base import PolicyBatch
from conspo.objectives.ppo import PPOParams, gae, ppo_objective, ppo_targets, whitened
from conspo.sink import MemorySink
from conspo.training.critic import CRITIC_DIR, CRITIC_STATE, value_loss
from conspo.training.trainer import train

DT = torch.float64


def test_gae_of_one_row_by_hand() -> None:
    """Rewards (0, 0, 1), values (0.5, 0.2, 0.6), γ = 0.9, λ = 0.8:
    δ₂ = 1 − 0.6 = 0.4; δ₁ = 0 + 0.9·0.6 − 0.2 = 0.34; δ₀ = 0 + 0.9·0.2 − 0.5 = −0.32;
    A₂ = 0.4; A₁ = 0.34 + 0.72·0.4 = 0.628; A₀ = −0.32 + 0.72·0.628 = 0.13216."""
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.6]])
    got = gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=0.9, lam=0.8)
    torch.testing.assert_close(got, torch.tensor([[0.13216, 0.628, 0.4]]))


def test_gae_with_gamma_and_lambda_one_is_return_less_value() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.rand(4, 6, generator=gen), torch.rand(4, 6, generator=gen)
    got = gae(rewards, values, torch.ones(4, 6, dtype=torch.bool), gamma=1.0, lam=1.0)
    returns = rewards.flip(1).cumsum(1).flip(1)  # Σ_{j ≥ t} r_j
    torch.testing.assert_close(got, returns - values)


def test_gae_skips_invalid_steps() -> None:
    """An observation token between two of the model's is no step: the recursion joins them."""
    rewards = torch.tensor([[0.0, 0.0, 9.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 7.0, 0.6]])
    valid = torch.tensor([[True, True, False, True]])
    got = gae(rewards, values, valid, gamma=0.9, lam=0.8)
    torch.testing.assert_close(got, torch.tensor([[0.13216, 0.628, 0.0, 0.4]]))


def test_three_turn_episode_by_hand() -> None:
    """One rollout of three model turns (tokens 0-1, 3-4, 6-7) with observation tokens 2 and 5
    between them and padding at 8. The environment paid 0.5 for turn 0, nothing for turn 1 and
    the outcome R = 1 at the end (turn 2). The critic read V = 0.4, 0.3, 0.8 at each turn's
    first token (0, 3, 6); its values elsewhere must not count. γ = 0.5, λ = 0.5:
    δ₂ = 1 − 0.8 = 0.2; δ₁ = 0 + 0.5·0.8 − 0.3 = 0.1; δ₀ = 0.5 + 0.5·0.3 − 0.4 = 0.25;
    A₂ = 0.2; A₁ = 0.1 + 0.25·0.2 = 0.15; A₀ = 0.25 + 0.25·0.15 = 0.2875;
    returns A + V: 0.6875, 0.45, 1.0."""
    mask = torch.tensor([[1, 1, 0, 1, 1, 0, 1, 1, 0]], dtype=DT)
    turn = torch.tensor([[0, 0, -1, 1, 1, -1, 2, 2, -1]])
    values = torch.tensor([[0.4, 9.0, 5.0, 0.3, 9.0, 5.0, 0.8, 9.0, 5.0]])
    token_rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    batch = PolicyBatch(
        logprobs=torch.zeros(1, 9, dtype=DT, requires_grad=True),
        mask=mask,
        rewards=torch.tensor([1.0]),
        group_ids=torch.tensor([0]),
        values=values,
        token_rewards=token_rewards,
        turn_index=turn,
    )
    found = ppo_targets(batch, PPOParams(gamma=0.5, lam=0.5))
    a0, a1, a2 = 0.2875, 0.15, 0.2
    expected = torch.tensor([[a0, a0, 0, a1, a1, 0, a2, a2, 0]], dtype=DT)
    torch.testing.assert_close(found.advantages, expected)
    assert found.targets.tolist() == [[i in (0, 3, 6) for i in range(9)]]
    returns = torch.tensor([0.6875, 0.45, 1.0], dtype=DT)
    torch.testing.assert_close(found.returns[found.targets], returns)


def reference_ppo_loss(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """PPO's clipped surrogate, token mean, advantages whitened over the masked tokens, written
    out with loops over rows and tokens."""
    tokens = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    adv = torch.stack([advantages[i, t] for i, t in tokens])
    adv = (adv - adv.mean()) / adv.std(correction=0)
    total = logprobs.new_zeros(())
    for (i, t), a in zip(tokens, adv, strict=True):
        ratio = torch.exp(logprobs[i, t] - old[i, t])
        total = total - torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    return total / len(tokens)


def test_ppo_loss_and_gradient_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    b, t = 4, 5
    mask = torch.ones(b, t, dtype=DT)
    mask[0, 3:] = 0
    mask[2, 1:] = 0
    logprobs = (-2 * torch.rand(b, t, generator=gen, dtype=DT)).requires_grad_()
    old = logprobs.detach() + 0.4 * (torch.rand(b, t, generator=gen, dtype=DT) - 0.5)
    values = torch.rand(b, t, generator=gen, dtype=DT)
    batch = PolicyBatch(
        logprobs=logprobs,
        mask=mask,
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=DT),
        group_ids=torch.tensor([0, 0, 1, 1]),
        old_logprobs=old,
        values=values,
    )
    params = PPOParams(gamma=0.95, lam=0.9)
    out = ppo_objective(batch, params)
    raw = ppo_targets(batch, params).advantages
    # The same advantages by the recursion written out per row.
    for i in range(b):
        n = int(mask[i].sum())
        rewards = [0.0] * (n - 1) + [float(batch.rewards[i])]
        later, expected = 0.0, [0.0] * n
        for s in range(n - 1, -1, -1):
            next_v = float(values[i, s + 1]) if s + 1 < n else 0.0
            delta = rewards[s] + 0.95 * next_v - float(values[i, s])
            later = delta + 0.95 * 0.9 * later
            expected[s] = later
        assert raw[i, :n].tolist() == pytest.approx(expected, abs=1e-6)  # GAE runs in float32
    want = reference_ppo_loss(logprobs, old, mask, raw.to(DT), eps=0.2)
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
    (got_grad,) = torch.autograd.grad(out.loss, logprobs)
    (want_grad,) = torch.autograd.grad(want, logprobs)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-6)
    assert out.stats[M.CLIP_FRAC].item() > 0  # the ratios left [0.8, 1.2] somewhere


def test_whitened_advantages_have_mean_zero_and_unit_std_on_the_mask() -> None:
    adv = torch.tensor([[1.0, 2.0, 50.0], [3.0, 4.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    got = whitened(adv, mask)
    on = got[mask > 0]
    assert on.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert on.std(correction=0).item() == pytest.approx(1.0, rel=1e-5)
    assert got[mask == 0].tolist() == [0.0, 0.0]


def test_value_loss_by_hand() -> None:
    """V = 1.5, V_old = 1.0, R = 2.0, ε_v = 0.2: plain (1.5−2)² = 0.25, clipped V_old + 0.2 = 1.2,
    (1.2−2)² = 0.64 is the larger: ½·0.64 = 0.32, clipped. V = 0.9 (inside the range): both
    (0.9−2)² = 1.21: ½·1.21 = 0.605, not clipped. The third position is no target."""
    values = torch.tensor([[1.5, 0.9, 4.0]])
    old = torch.tensor([[1.0, 1.0, 1.0]])
    returns = torch.tensor([[2.0, 2.0, 2.0]])
    targets = torch.tensor([[True, True, False]])
    loss, clipped = value_loss(values, old, returns, targets, clip=0.2)
    assert loss.item() == pytest.approx(0.32 + 0.605)
    assert clipped.item() == 1
    plain, none = value_loss(values, old, returns, targets, clip=0.0)
    assert plain.item() == pytest.approx(0.5 * (0.25 + 1.21))
    assert none.item() == 0


def ppo_config(steps: int, **params: object) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "ppo",
        "params": {"critic_lr": 1e-2, **params},
        "steps": steps,
        "seed": 3,
        "model": {"name": "tiny-arith", "lora": {"rank": 4}},
        "task": {"name": "arith", "eval_size": 4},
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "optim": {"lr": 1e-3, "mini_batches": 2},
        "eval": {"every": 0, "at_start": False},
        "checkpoint": {"every": 1, "keep": 5},
    })  # fmt: skip


def test_a_ppo_run_trains_its_critic_and_resumes_exactly(model_store, tmp_path) -> None:
    """Four steps straight against two, a resume, and two more: the same metrics at every step
    (the critic's weights and optimiser come back with the checkpoint), and a critic whose
    predictions moved from zero."""
    straight = MemorySink()
    train(ppo_config(4), straight, workdir=tmp_path / "straight", model_store=model_store)
    first = MemorySink()
    train(ppo_config(2), first, workdir=tmp_path / "resumed", model_store=model_store)
    assert (tmp_path / "resumed/checkpoints/step_000002" / CRITIC_DIR / CRITIC_STATE).exists()
    second = MemorySink()
    train(ppo_config(4), second, workdir=tmp_path / "resumed", model_store=model_store)
    assert sorted(second.steps) == [3, 4]
    for step in (3, 4):
        for key in (M.PPO_VALUE_LOSS, M.PPO_VALUE_MEAN, M.LOSS, M.PPO_RETURN_MEAN):
            a, b = straight.steps[step].metrics[key], second.steps[step].metrics[key]
            assert a == pytest.approx(b, rel=1e-5, abs=1e-7), (step, key)
    steps = straight.steps
    assert steps[1].metrics[M.PPO_VALUE_MEAN] == 0  # the head starts at zero
    assert steps[4].metrics[M.PPO_VALUE_MEAN] != 0
    assert all(math.isfinite(s.metrics[M.PPO_VALUE_LOSS]) for s in steps.values())


def test_critic_warmup_holds_the_policy(model_store, tmp_path) -> None:
    """Two warm-up steps: no optimiser step of the policy (its backward skipped), while the
    critic's loss is logged; the third step updates the policy."""
    sink = MemorySink()
    train(ppo_config(3, critic_warmup=2), sink, workdir=tmp_path, model_store=model_store)
    for step in (1, 2):
        metrics = sink.steps[step].metrics
        assert metrics[M.OPTIM_UPDATES] == 0 and metrics[M.OPTIM_BACKWARD_SKIPPED] == 1
        assert metrics[M.OPTIM_UPDATE_SIZE] == 0
        assert math.isfinite(metrics[M.PPO_VALUE_LOSS])
    assert sink.steps[2].metrics[M.PPO_VALUE_MEAN] != 0  # the critic moved while warming up


def test_ppo_plays_an_environment_turn_by_turn(model_store, tmp_path, monkeypatch) -> None:
    """A TRL environment class (two turns at most) under PPO: the objective receives each
    token's turn, reward and recorded value, the recursion's steps are the turns (the critic's
    targets one per turn played, at its first token) and the run's critic metrics are finite."""
    from conspo.environments import targets
    from conspo.objectives import ppo
    from tests.conspo.test_environment_training import _with_fn, game_run

    monkeypatch.setattr(targets, "allowed_roots", lambda: {"tests"})
    seen: list[PolicyBatch] = []

    def watched(batch: PolicyBatch, params: PPOParams):
        seen.append(batch)
        return ppo.ppo_objective(batch, params)

    monkeypatch.setattr("conspo.registry.OBJECTIVES.get", _with_fn("ppo", watched))
    cfg = game_run(
        "trl",
        {"entry_point": "tests.conspo.test_environments:GuessEnv"},
        algorithm="ppo",
        environment={"max_turns": 2},
    )
    sink = MemorySink()
    assert train(cfg, sink, workdir=tmp_path, model_store=model_store).status == "succeeded"
    batches = [b for b in seen if b.values is not None and b.turn_index is not None]
    assert batches, "no batch reached the objective with turns and values"
    for b in batches:
        assert b.token_rewards is not None
        found = ppo_targets(b, PPOParams())
        turns = b.turn_index.masked_fill(b.mask == 0, -1)
        played = sum(len(set(row[row >= 0].tolist())) for row in turns)
        assert int(found.targets.sum()) == played
        # every target is a turn's first token: the token before it is of another turn
        rows, cols = found.targets.nonzero(as_tuple=True)
        for i, t in zip(rows.tolist(), cols.tolist(), strict=True):
            assert t == 0 or int(turns[i, t - 1]) != int(turns[i, t])
    metrics = sink.steps[1].metrics
    assert math.isfinite(metrics[M.PPO_VALUE_LOSS]) and metrics[M.ENV_TURNS] > 0


def test_the_kl_in_the_reward_is_paid_token_by_token(model_store, tmp_path, monkeypatch) -> None:
    """With a critic, params.kl_in_reward = β puts −β·(log π_old − log π_ref) on every model
    token instead of summing it onto the last: the tokens' rewards of a rollout add up to its
    reward less β times its KL, whose mean over rollouts is the logged policy/kl_in_reward;
    after an update moved the policy off its base it is not 0, and it is spread over tokens."""
    from conspo.objectives import ppo
    from tests.conspo.test_environment_training import _with_fn

    seen: dict[int, list[PolicyBatch]] = {}

    def watched(batch: PolicyBatch, params: PPOParams):
        seen.setdefault(round(batch.progress * 2), []).append(batch)
        return ppo.ppo_objective(batch, params)

    monkeypatch.setattr("conspo.registry.OBJECTIVES.get", _with_fn("ppo", watched))
    beta = 0.5
    sink = MemorySink()
    cfg = ppo_config(2, kl_in_reward=beta)
    train(cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"every": 0})}),
          sink, workdir=tmp_path, model_store=model_store)  # fmt: skip
    for step in (1, 2):
        kl_of: dict[tuple[int, int], float] = {}  # (group, k-th row of it) → its KL
        for b in seen[step]:  # probes and updates see the same rows: keyed, not counted twice
            assert b.token_rewards is not None
            kls = ((b.rewards.float() - b.token_rewards.sum(-1)) / beta).tolist()
            counts: dict[int, int] = {}
            for group, kl in zip(b.group_ids.tolist(), kls, strict=True):
                counts[group] = counts.get(group, 0) + 1
                kl_of[(group, counts[group])] = kl
        logged = sink.steps[step].metrics[M.KL_IN_REWARD]
        assert len(kl_of) == 8  # two groups of four
        assert sum(kl_of.values()) / len(kl_of) == pytest.approx(logged, rel=1e-4, abs=1e-6)
    assert sink.steps[2].metrics[M.KL_IN_REWARD] != 0
    last = seen[2][-1]
    assert last.token_rewards is not None
    # the penalty sits on many tokens, not only on each rollout's last
    assert int(((last.token_rewards != 0) & (last.mask > 0)).sum()) > 2 * len(last.mask)
