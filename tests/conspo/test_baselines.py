"""The baseline objectives (conspo/objectives/: rloo, gspo, cispo, gmpo, sapo, disco,
reinforce_pp, mcpo, ispo) on small hand-made batches.

Each expectation is computed independently of the implementation: by hand (advantages, on-policy
gradients), or by a literal per-rollout, per-token loop of the method's formula in the test, whose
autograd gradient the implementation's must match. Then every baseline trains two steps through
``train()`` with two mini-batches, so that its ratios differ from 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.objectives.base import PolicyBatch, WholeBatch
from conspo.objectives.cispo import CISPOParams, cispo_objective
from conspo.objectives.disco import DisCOParams, disco_objective
from conspo.objectives.gmpo import GMPOParams, gmpo_objective
from conspo.objectives.grpo import GRPOParams
from conspo.objectives.gspo import GSPOParams, gspo_objective
from conspo.objectives.ispo import ISPOParams, ispo_objective
from conspo.objectives.mcpo import MCPOParams, mcpo_objective
from conspo.objectives.ppo import PPOParams
from conspo.objectives.reinforce_pp import (
    ReinforcePPParams,
    reinforce_pp_advantages,
    reinforce_pp_objective,
)
from conspo.objectives.rloo import RLOOParams, leave_one_out_advantages, rloo_objective
from conspo.objectives.rrpo import RRPOParams
from conspo.objectives.sapo import SAPOParams, sapo_objective
from conspo.registry import get_objective, objective_names
from conspo.sink import MemorySink
from conspo.training.trainer import train

DT = torch.float64

# Five rollouts in two groups (ids 5 and 9), ragged lengths 3, 2, 3, 2, 1.
LOGPROBS = [
    [-0.5, -1.2, -0.8],
    [-1.5, -0.4, 0.0],
    [-0.9, -0.6, -1.1],
    [-2.0, -0.3, 0.0],
    [-0.7, 0.0, 0.0],
]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
# log ρ = log π_θ − log π_old per token: some past ±0.2 (clipped by ε = 0.2), some inside.
LOG_RATIO = [
    [0.3, -0.25, 0.05],
    [-0.4, 0.1, 0.0],
    [0.2, 0.01, -0.3],
    [0.15, -0.05, 0.0],
    [-0.35, 0.0, 0.0],
]
# Per-token entropy (ISPO's decision tokens); padded positions hold values that must be ignored.
ENTROPY = [
    [0.1, 0.9, 0.5],
    [0.2, 0.8, 5.0],
    [0.7, 0.3, 0.6],
    [0.4, 0.2, 9.0],
    [0.4, 9.0, 9.0],
]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0]
GROUPS = [[0, 1, 2], [3, 4]]
# GRPO's group-normalised advantages, by hand: group 5 = [1, 0, 0] has mean 1/3 and population
# std √2/3, group 9 = [1, 0] has mean 1/2 and std 1/2.
GRPO_ADV = [math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 1.0, -1.0]


def small_batch(off_policy: bool = True) -> PolicyBatch:
    logprobs = torch.tensor(LOGPROBS, dtype=DT, requires_grad=True)
    mask = torch.tensor(MASK, dtype=DT)
    old = logprobs.detach() - torch.tensor(LOG_RATIO, dtype=DT) * mask if off_policy else None
    return PolicyBatch(
        logprobs=logprobs,
        mask=mask,
        rewards=torch.tensor(REWARDS, dtype=DT),
        group_ids=torch.tensor([5, 5, 5, 9, 9]),
        old_logprobs=old,
        max_response_len=3,
        entropy=torch.tensor(ENTROPY, dtype=DT),
    )


def tokens(batch: PolicyBatch):
    """(i, t) of every response token, row by row."""
    mask = batch.mask.tolist()
    return [(i, t) for i, row in enumerate(mask) for t, m in enumerate(row) if m]


def ratio_of(batch: PolicyBatch, i: int, t: int) -> torch.Tensor:
    if batch.old_logprobs is None:
        return torch.exp(batch.logprobs[i, t] - batch.logprobs[i, t].detach())
    return torch.exp(batch.logprobs[i, t] - batch.old_logprobs[i, t])


def lengths(batch: PolicyBatch) -> list[int]:
    return [int(n) for n in batch.mask.sum(1).tolist()]


def grad_of(loss: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    return torch.autograd.grad(loss, batch.logprobs, retain_graph=True)[0]


def assert_same_loss_and_grad(out_loss: torch.Tensor, reference: torch.Tensor, batch) -> None:
    assert out_loss.item() == pytest.approx(reference.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(
        grad_of(out_loss, batch), grad_of(reference, batch), rtol=1e-10, atol=1e-14
    )


def ppo_token_term(rho: torch.Tensor, adv: float, eps_low: float, eps_high: float):
    """min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) for one token, written out."""
    return torch.minimum(rho * adv, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv)


# ------------------------------------------------------------------------------------------
# RLOO
# ------------------------------------------------------------------------------------------


def test_leave_one_out_advantages_by_hand() -> None:
    # group 5 = [1, 0, 0]: 1 − 0, 0 − ½, 0 − ½; group 9 = [1, 0]: 1 − 0, 0 − 1; a lone rollout: 0.
    rewards = torch.tensor(REWARDS + [1.0], dtype=DT)
    adv = leave_one_out_advantages(rewards, torch.tensor([5, 5, 5, 9, 9, -4]))
    assert adv.tolist() == [1.0, -0.5, -0.5, 1.0, -1.0, 0.0]
    # RLOO's advantage is G/(G−1) times the centred reward.
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5], dtype=DT)
    torch.testing.assert_close(adv[:5], centred * torch.tensor([1.5, 1.5, 1.5, 2, 2], dtype=DT))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_rloo_loss_and_gradient(agg: str) -> None:
    batch = small_batch()
    out = rloo_objective(batch, RLOOParams(loss_agg=agg))
    adv = [1.0, -0.5, -0.5, 1.0, -1.0]
    terms = {
        (i, t): -ppo_token_term(ratio_of(batch, i, t), adv[i], 0.2, 0.2) for i, t in tokens(batch)
    }
    if agg == "token-mean":
        reference = sum(terms.values()) / len(terms)
    else:
        n = lengths(batch)
        reference = sum(v / n[i] for (i, _), v in terms.items()) / len(n)
    assert_same_loss_and_grad(out.loss, reference, batch)
    # clipped (clip term active): (0,0) ρ=e^.3, A>0; (1,0) ρ=e^-.4, A<0; (2,2) ρ=e^-.3, A<0;
    # (4,0) ρ=e^-.35, A<0. (2,0) ρ=e^.2 = 1.2214 > 1.2 with A<0 is not (min keeps ρA).
    assert out.stats[M.CLIP_FRAC].item() == pytest.approx(4 / 11)


# ------------------------------------------------------------------------------------------
# GSPO
# ------------------------------------------------------------------------------------------


def test_gspo_on_policy_gradient_by_hand() -> None:
    """At ρ = 1: ∂loss/∂log π_{i,t} = −Â_i / (B |o_i|), GRPO's advantages, whatever the clip."""
    batch = small_batch(off_policy=False)
    out = gspo_objective(batch, GSPOParams())
    assert out.loss.item() == pytest.approx(-sum(GRPO_ADV) / 5, abs=1e-15)
    expected = torch.zeros(5, 3, dtype=DT)
    for i, t in tokens(batch):
        expected[i, t] = -GRPO_ADV[i] / (5 * lengths(batch)[i])
    torch.testing.assert_close(grad_of(out.loss, batch), expected, rtol=1e-12, atol=1e-15)
    assert out.stats[M.CLIP_FRAC].item() == 0.0


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.05, 0.1)])
def test_gspo_loss_and_gradient_off_policy(eps: tuple[float, float]) -> None:
    batch = small_batch()
    out = gspo_objective(batch, GSPOParams(clip_low=eps[0], clip_high=eps[1]))
    n = lengths(batch)
    reference = torch.zeros((), dtype=DT)
    clipped_tokens = 0
    for i in range(5):
        log_s = sum(torch.log(ratio_of(batch, i, t)) for t in range(n[i])) / n[i]
        s = torch.exp(log_s)
        term = ppo_token_term(s, GRPO_ADV[i], *eps)
        clipped_tokens += n[i] * bool(term.item() < (s * GRPO_ADV[i]).item())
        reference = reference - term / 5
    assert_same_loss_and_grad(out.loss, reference, batch)
    assert out.stats[M.CLIP_FRAC].item() == pytest.approx(clipped_tokens / 11)
    if eps[0] < 1e-3:  # every sequence ratio is off by more than 4e-4: all clipped, no gradient
        assert clipped_tokens == 11 and grad_of(out.loss, batch).abs().max() == 0


# ------------------------------------------------------------------------------------------
# CISPO
# ------------------------------------------------------------------------------------------


def test_cispo_loss_and_gradient_by_hand() -> None:
    """−(1/Σ|o|) Σ_{i,t} sg(clip(ρ)) Â_i log π: the gradient is −clip(ρ_{i,t}) Â_i / 11."""
    batch = small_batch()
    out = cispo_objective(batch, CISPOParams(clip_low=0.1, clip_high=0.2))
    expected_grad = torch.zeros(5, 3, dtype=DT)
    value = 0.0
    n_clipped = 0
    for i, t in tokens(batch):
        rho = math.exp(LOG_RATIO[i][t])
        weight = min(max(rho, 0.9), 1.2)
        n_clipped += weight != rho
        expected_grad[i, t] = -weight * GRPO_ADV[i] / 11
        value += -weight * GRPO_ADV[i] * LOGPROBS[i][t] / 11
    assert out.loss.item() == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(grad_of(out.loss, batch), expected_grad, rtol=1e-12, atol=1e-15)
    # clipped: e^.3, e^.2 (above 1.2), e^-.25, e^-.4, e^-.3 and e^-.35 (below 0.9)
    assert n_clipped == 6 and out.stats[M.CLIP_FRAC].item() == pytest.approx(6 / 11)


def test_cispo_default_has_no_lower_bound() -> None:
    """ε_low = 1: a tiny ratio keeps its tiny weight (MiniMax-M1 sets no lower bound)."""
    batch = small_batch()
    batch.old_logprobs = batch.logprobs.detach() + 5.0  # ρ = e^-5 everywhere
    out = cispo_objective(batch, CISPOParams())
    grad = grad_of(out.loss, batch)
    assert grad[0, 0].item() == pytest.approx(-math.exp(-5) * GRPO_ADV[0] / 11, rel=1e-12)
    assert out.stats[M.CLIP_FRAC].item() == 0.0


# ------------------------------------------------------------------------------------------
# GMPO
# ------------------------------------------------------------------------------------------


def on_policy_pg_grad(batch: PolicyBatch) -> torch.Tensor:
    """−Â_i / (B |o_i|) per token: the on-policy gradient of the sequence-averaged objectives."""
    expected = torch.zeros(5, 3, dtype=DT)
    for i, t in tokens(batch):
        expected[i, t] = -GRPO_ADV[i] / (5 * lengths(batch)[i])
    return expected


def test_gmpo_on_policy_gradient_by_hand() -> None:
    batch = small_batch(off_policy=False)
    out = gmpo_objective(batch, GMPOParams())
    assert out.loss.item() == pytest.approx(-sum(GRPO_ADV) / 5, abs=1e-15)
    torch.testing.assert_close(grad_of(out.loss, batch), on_policy_pg_grad(batch))


@pytest.mark.parametrize("eps", [0.2, 0.4])
def test_gmpo_loss_and_gradient_off_policy(eps: float) -> None:
    batch = small_batch()
    out = gmpo_objective(batch, GMPOParams(clip_low=eps, clip_high=eps))
    n = lengths(batch)
    reference = torch.zeros((), dtype=DT)
    clipped = 0
    for i in range(5):
        kept = []
        for t in range(n[i]):
            log_rho = torch.log(ratio_of(batch, i, t))
            bounded = torch.clamp(log_rho, -eps, eps)
            # pessimistic: the smaller ratio for a positive advantage, the larger for a negative
            pick = torch.minimum if GRPO_ADV[i] > 0 else torch.maximum
            kept.append(pick(log_rho, bounded))
            clipped += kept[-1].item() != log_rho.item()
        reference = reference - GRPO_ADV[i] * torch.exp(sum(kept) / n[i]) / 5
    assert_same_loss_and_grad(out.loss, reference, batch)
    assert out.stats[M.CLIP_FRAC].item() == pytest.approx(clipped / 11)
    # by hand at ε = 0.2: 0.3 (A>0), −0.4, −0.3 and −0.35 (A<0) are clipped; at 0.4 none is
    assert clipped == {0.2: 4, 0.4: 0}[eps]


# ------------------------------------------------------------------------------------------
# SAPO
# ------------------------------------------------------------------------------------------


def test_sapo_on_policy_is_the_policy_gradient() -> None:
    """At ρ = 1 the gate is 2/τ in value and its slope in log π is exactly 1."""
    batch = small_batch(off_policy=False)
    out = sapo_objective(batch, SAPOParams())
    taus = [1.0 if a > 0 else 1.05 for a in GRPO_ADV]
    expected = -sum(2 / tau * a for tau, a in zip(taus, GRPO_ADV, strict=True)) / 5
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(grad_of(out.loss, batch), on_policy_pg_grad(batch))
    assert out.stats[M.SAPO_GATE_WEIGHT].item() == pytest.approx(1.0)


@pytest.mark.parametrize("tau_pos,tau_neg", [(1.0, 1.05), (4.0, 8.0)])
def test_sapo_loss_and_gradient_off_policy(tau_pos: float, tau_neg: float) -> None:
    batch = small_batch()
    out = sapo_objective(batch, SAPOParams(tau_pos=tau_pos, tau_neg=tau_neg))
    n = lengths(batch)
    reference = torch.zeros((), dtype=DT)
    weights = []
    for i, t in tokens(batch):
        tau = tau_pos if GRPO_ADV[i] > 0 else tau_neg
        rho = ratio_of(batch, i, t)
        gate = torch.sigmoid(tau * (rho - 1))
        reference = reference - 4 / tau * gate * GRPO_ADV[i] / (n[i] * 5)
        weights.append((4 * gate * (1 - gate) * rho).item())
    assert_same_loss_and_grad(out.loss, reference, batch)
    assert out.stats[M.SAPO_GATE_WEIGHT].item() == pytest.approx(sum(weights) / 11)


# ------------------------------------------------------------------------------------------
# DisCO
# ------------------------------------------------------------------------------------------


def disco_reference(batch: PolicyBatch, tau: float, delta: float, beta: float, k: int):
    """−(1/k) Σ_groups [mean s⁺ − τ log mean_j e^{s_j⁻/τ}] + (β/2) max(0, KL − δ)², literally."""
    n = lengths(batch)
    s = [sum(batch.logprobs[i, t] for t in range(n[i])) / n[i] for i in range(5)]
    j = torch.zeros((), dtype=DT)
    for group in GROUPS:
        pos = [i for i in group if REWARDS[i] == 1.0]
        neg = [i for i in group if REWARDS[i] == 0.0]
        mean_exp = sum(torch.exp(s[i] / tau) for i in neg) / len(neg)
        j = j + sum(s[i] for i in pos) / len(pos) - tau * torch.log(mean_exp)
    kl = torch.zeros((), dtype=DT)
    for i, t in tokens(batch):
        x = torch.log(ratio_of(batch, i, t))
        kl = kl + (torch.exp(x) - x - 1) / 11
    return -j / k + beta / 2 * torch.clamp(kl - delta, min=0) ** 2, kl


@pytest.mark.parametrize("tau", [10.0, 0.5])
@pytest.mark.parametrize("delta", [1e-4, 1.0])
def test_disco_loss_and_gradient(tau: float, delta: float) -> None:
    batch = small_batch()
    out = disco_objective(batch, DisCOParams(tau=tau, delta=delta))
    reference, kl = disco_reference(batch, tau, delta, 1e3, k=2)
    assert_same_loss_and_grad(out.loss, reference, batch)
    assert out.stats[M.DISCO_KL].item() == pytest.approx(kl.item(), rel=1e-12)
    assert out.stats[M.DISCO_CONSTRAINT_ACTIVE].item() == float(kl.item() > delta)


def test_disco_on_policy_gradient_by_hand() -> None:
    """KL = 0 at ρ = 1; ∂(−J)/∂s⁺ = −1/K, ∂(−J)/∂s_j⁻ = softmax_j(s⁻/τ)/K, ∂s/∂log π = 1/|o|."""
    batch = small_batch(off_policy=False)
    out = disco_objective(batch, DisCOParams(tau=0.5))
    n = lengths(batch)
    s = [sum(LOGPROBS[i][: n[i]]) / n[i] for i in range(5)]
    d_score = [-0.5, 0.0, 0.0, -0.5, 0.5]  # K = 2 groups; group 9 has one negative
    z = math.exp(s[1] / 0.5) + math.exp(s[2] / 0.5)
    d_score[1] = math.exp(s[1] / 0.5) / z / 2
    d_score[2] = math.exp(s[2] / 0.5) / z / 2
    expected = torch.zeros(5, 3, dtype=DT)
    for i, t in tokens(batch):
        expected[i, t] = d_score[i] / n[i]
    torch.testing.assert_close(grad_of(out.loss, batch), expected)
    assert out.stats[M.DISCO_KL].item() == 0.0


def test_disco_basic_variant_and_group_average() -> None:
    """DisCO-b (mean of s⁻) on the two groups plus an all-positive group, which counts in K for
    group_average=all_groups and not for valid_groups."""
    batch = small_batch(off_policy=False)
    batch.logprobs = torch.tensor(LOGPROBS + [[-0.2, -0.1, 0.0]], dtype=DT, requires_grad=True)
    batch.mask = torch.tensor(MASK + [[1, 1, 0]], dtype=DT)
    batch.rewards = torch.tensor(REWARDS + [1.0], dtype=DT)
    batch.group_ids = torch.tensor([5, 5, 5, 9, 9, 2])
    n = [int(v) for v in batch.mask.sum(1).tolist()]
    s = [sum(batch.logprobs[i, t] for t in range(n[i])) / n[i] for i in range(6)]
    j = (s[0] - (s[1] + s[2]) / 2) + (s[3] - s[4])
    for average, k in (("all_groups", 3), ("valid_groups", 2)):
        params = DisCOParams(negatives="mean", group_average=average)
        assert_same_loss_and_grad(disco_objective(batch, params).loss, -j / k, batch)


def test_disco_k1_estimator_is_the_authors_token_mean_of_log_ratios() -> None:
    """kl_estimator k1: KL̂ = token-mean of log π_old − log π_θ (the authors' ppo_kl_type kl),
    which can be negative where k3 never is; k3 stays the default."""
    batch = small_batch()
    k1 = disco_objective(batch, DisCOParams(kl_estimator="k1")).stats[M.DISCO_KL].item()
    by_hand = -sum(LOG_RATIO[i][t] for i, t in tokens(batch)) / 11
    assert k1 == pytest.approx(by_hand, rel=1e-12)
    k3 = disco_objective(batch, DisCOParams()).stats[M.DISCO_KL].item()
    assert k3 == pytest.approx(disco_reference(batch, 10.0, 1e-4, 1e3, k=2)[1].item(), rel=1e-12)
    assert DisCOParams().kl_estimator == "k3" and k3 > 0 and k1 != pytest.approx(k3)
    # the loss with k1, literally: −J + (β/2)·max(0, KL̂₁ − δ)², KL̂₁ = 0.54/11 > δ here
    kl1 = torch.zeros((), dtype=DT)
    for i, t in tokens(batch):
        kl1 = kl1 - torch.log(ratio_of(batch, i, t)) / 11
    minus_j = disco_reference(batch, 10.0, 1e-4, 0.0, k=2)[0]  # β = 0: −J alone
    out = disco_objective(batch, DisCOParams(kl_estimator="k1"))
    assert_same_loss_and_grad(out.loss, minus_j + 500.0 * (kl1 - 1e-4) ** 2, batch)


# ------------------------------------------------------------------------------------------
# REINFORCE++
# ------------------------------------------------------------------------------------------


def test_reinforce_pp_advantages_by_hand() -> None:
    """Without a baseline: 5 of the 11 tokens belong to correct rollouts, so the token-weighted
    mean is p = 5/11 and the std √(p(1−p)) = √30/11: Â⁺ = 6/√30, Â⁻ = −5/√30."""
    batch = small_batch()
    adv = reinforce_pp_advantages(batch.rewards, batch.group_ids, batch.mask, "none", True)
    pos, neg = 6 / math.sqrt(30), -5 / math.sqrt(30)
    torch.testing.assert_close(adv, torch.tensor([pos, neg, neg, pos, neg], dtype=DT))
    # -baseline: centre in the group first, then whiten over the tokens (a literal loop)
    centred = [2 / 3, -1 / 3, -1 / 3, 0.5, -0.5]
    weights = lengths(batch)
    mean = sum(w * a for w, a in zip(weights, centred, strict=True)) / 11
    std = math.sqrt(sum(w * (a - mean) ** 2 for w, a in zip(weights, centred, strict=True)) / 11)
    got = reinforce_pp_advantages(batch.rewards, batch.group_ids, batch.mask, "group_mean", True)
    torch.testing.assert_close(got, torch.tensor([(a - mean) / std for a in centred], dtype=DT))
    raw = reinforce_pp_advantages(batch.rewards, batch.group_ids, batch.mask, "none", False)
    assert raw.tolist() == REWARDS


def test_reinforce_pp_whitens_over_the_whole_rollout_batch() -> None:
    """Split into one mini-batch per group, each mini-batch's advantages are the whole batch's:
    μ and σ come from every token of the rollout batch (OpenRLHF computes them once before the
    batch is split). An all-correct group alone in its mini-batch gets (1 − μ)/σ, not 0."""
    batch = small_batch()
    whole = WholeBatch(batch.rewards, batch.group_ids, batch.mask.sum(-1))
    for baseline in ("none", "group_mean"):
        everything = reinforce_pp_advantages(
            batch.rewards, batch.group_ids, batch.mask, baseline, True
        )
        for group in GROUPS:
            rows = torch.tensor(group)
            part = reinforce_pp_advantages(
                batch.rewards[rows], batch.group_ids[rows], batch.mask[rows], baseline, True, whole
            )
            torch.testing.assert_close(part, everything[rows])
    solved = torch.tensor([1.0, 1.0], dtype=DT)  # a group every rollout of which is right
    mixed = WholeBatch(
        torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=DT),
        torch.tensor([0, 0, 1, 1]),
        torch.tensor([2.0, 2.0, 2.0, 2.0], dtype=DT),
    )
    alone = reinforce_pp_advantages(
        solved, torch.tensor([0, 0]), torch.ones(2, 2, dtype=DT), "none", True, mixed
    )
    # μ = 3/4, σ = √(3/16): (1 − 3/4)/σ = 1/√3 for both rollouts
    torch.testing.assert_close(alone, torch.full((2,), 1 / math.sqrt(3), dtype=DT))


def test_the_trainer_hands_reinforce_pp_the_whole_batch(monkeypatch, model_store, tmp_path):
    """With 2 mini-batches every call sees the whole rollout batch's N rollouts; with one it
    sees none (the mini-batch is the whole batch)."""
    import conspo.objectives.reinforce_pp as module

    seen: list[int | None] = []
    real = module.reinforce_pp_advantages

    def spy(*args, **kwargs):
        whole = args[5] if len(args) > 5 else kwargs.get("whole")
        seen.append(None if whole is None else len(whole.rewards))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "reinforce_pp_advantages", spy)
    for mini_batches, expected in ((2, 8), (1, None)):
        seen.clear()
        cfg = RunConfig.model_validate(
            {
                "algorithm": "reinforce_pp",
                "model": {"name": "tiny"},
                "task": {"name": "arith", "eval_size": 2},
                "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
                "optim": {"mini_batches": mini_batches},
                "eval": {"every": 0, "pass_k": 1, "at_start": False},
                "steps": 1,
            }
        )
        train(cfg, MemorySink(), workdir=tmp_path / str(mini_batches), model_store=model_store)
        assert seen and set(seen) == {expected}


@pytest.mark.parametrize("baseline", ["none", "group_mean"])
def test_reinforce_pp_loss_and_gradient(baseline: str) -> None:
    batch = small_batch()
    out = reinforce_pp_objective(batch, ReinforcePPParams(baseline=baseline))
    adv = reinforce_pp_advantages(batch.rewards, batch.group_ids, batch.mask, baseline, True)
    terms = [
        -ppo_token_term(ratio_of(batch, i, t), adv[i].item(), 0.2, 0.2) for i, t in tokens(batch)
    ]
    assert_same_loss_and_grad(out.loss, sum(terms) / 11, batch)


# ------------------------------------------------------------------------------------------
# MCPO (designed from the abstract)
# ------------------------------------------------------------------------------------------


def mcpo_batch() -> PolicyBatch:
    """Group 5 = [1, 1, 0] (majority-correct, p̂ = 2/3), group 9 = [1, 0], group 2 = [1, 1]
    (mastered), off-policy."""
    batch = small_batch()
    batch.logprobs = torch.tensor(LOGPROBS + [[-0.2, -0.1, 0.0], [-0.4, -0.6, -0.3]], dtype=DT,
                                  requires_grad=True)  # fmt: skip
    batch.mask = torch.tensor(MASK + [[1, 1, 0], [1, 1, 1]], dtype=DT)
    log_ratio = torch.tensor(LOG_RATIO + [[0.3, -0.2, 0.0], [0.05, 0.02, -0.01]], dtype=DT)
    batch.old_logprobs = batch.logprobs.detach() - log_ratio * batch.mask
    batch.rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0], dtype=DT)
    batch.group_ids = torch.tensor([5, 5, 5, 9, 9, 2, 2])
    return batch


@pytest.mark.parametrize("gamma,delta", [(1.0, 0.01), (0.5, 0.0), (0.0, 1.0)])
def test_mcpo_loss_and_gradient(gamma: float, delta: float) -> None:
    batch = mcpo_batch()
    out = mcpo_objective(batch, MCPOParams(majority_gamma=gamma, mastery_delta=delta))
    # GRPO advantages by hand; group 5 gets the majority boost 1 + γ(2·2/3 − 1)
    boost = 1 + gamma / 3
    adv = [boost / math.sqrt(2), boost / math.sqrt(2), -boost * math.sqrt(2), 1.0, -1.0, 0, 0]
    n = [int(v) for v in batch.mask.sum(1).tolist()]
    grpo = torch.zeros((), dtype=DT)
    for i, t in tokens(batch):
        grpo = grpo - ppo_token_term(ratio_of(batch, i, t), adv[i], 0.2, 0.2) / (n[i] * 7)
    kl = []
    for i in (5, 6):  # the mastered group's rollouts
        x = [torch.log(ratio_of(batch, i, t)) for t in range(n[i])]
        kl.append(sum(torch.exp(v) - v - 1 for v in x) / n[i])
    hinge = sum(torch.clamp(k - delta, min=0) for k in kl) / 2  # mean over the one group
    assert_same_loss_and_grad(out.loss, grpo + hinge, batch)
    assert out.stats[M.MCPO_KL_MASTERED].item() == pytest.approx(sum(kl).item() / 2, rel=1e-12)
    active = sum(k.item() > delta for k in kl) / 2
    assert out.stats[M.MCPO_HINGE_ACTIVE].item() == pytest.approx(active)
    assert active == {0.01: 0.5, 0.0: 1.0, 1.0: 0.0}[delta]  # KL̂ ≈ 0.034 and 0.0005


def test_mcpo_hinge_has_no_gradient_on_policy() -> None:
    batch = mcpo_batch()
    batch.old_logprobs = None
    grad = grad_of(mcpo_objective(batch, MCPOParams(mastery_delta=0.0)).loss, batch)
    assert grad[5:].abs().max() == 0  # mastered rollouts: zero advantage and zero KL slope


# ------------------------------------------------------------------------------------------
# Every baseline: padding, separation view, labels
# ------------------------------------------------------------------------------------------

# Every objective but ConSPO itself and the GRPO presets (tested in test_objectives.py).
OWN_TESTS = {"conspo", "grpo", "dapo", "dr_grpo"}
BASELINES = [n for n in objective_names() if n not in OWN_TESTS]


# ------------------------------------------------------------------------------------------
# ISPO (designed from the abstract, §5.2): GRPO + the confidence hinge on decision tokens
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("off_policy", [False, True])
def test_ispo_hinge_by_hand(off_policy: bool) -> None:
    """k = 1/2, c = 1/2. Wrong rollouts 1, 2, 4 (lengths 2, 3, 1) keep ⌈k·|o|⌉ = 1, 2, 1 tokens
    of highest entropy: (1, 1) at 0.8, (2, 0) at 0.7 and (2, 2) at 0.6, (4, 0) (its only one).
    Their log-probs −0.4, −0.9, −1.1, −0.7 against log ½ = −0.693: only (1, 1) is above."""
    batch = small_batch(off_policy)
    params = ISPOParams(hinge_top_frac=0.5, hinge_confidence=0.5, hinge_weight=0.3)
    out = ispo_objective(batch, params)
    grpo = get_objective("grpo").fn(batch, GRPOParams())
    hinge = (-0.4 - math.log(0.5)) / 4  # one active token over the four chosen
    assert out.loss.item() == pytest.approx(grpo.loss.item() + 0.3 * hinge, rel=1e-12)
    assert out.stats[M.ISPO_HINGE_ACTIVE].item() == pytest.approx(1 / 4)
    extra = grad_of(out.loss, batch) - grad_of(grpo.loss, batch)
    expected = torch.zeros_like(extra)
    expected[1, 1] = 0.3 / 4
    torch.testing.assert_close(extra, expected, rtol=1e-10, atol=1e-14)


def test_ispo_needs_the_entropy() -> None:
    batch = small_batch()
    batch.entropy = None
    with pytest.raises(ValueError, match="entropy"):
        ispo_objective(batch, ISPOParams())


def test_the_baselines_are_registered() -> None:
    expected = {"rloo", "gspo", "cispo", "gmpo", "sapo", "disco", "reinforce_pp", "mcpo"}
    assert expected <= set(BASELINES)
    assert "designed from the abstract" in get_objective("mcpo").description
    assert "designed from the abstract" in get_objective("ispo").description


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("off_policy", [False, True])
def test_padding_changes_neither_loss_nor_gradient(name: str, off_policy: bool) -> None:
    """Garbage (±large, −inf) at padded positions must not reach the value or the gradient."""
    batch = small_batch(off_policy)
    batch.ref_logprobs = batch.logprobs.detach() - 0.2
    fn, params = get_objective(name).fn, get_objective(name).params(beta=0.1)
    out = fn(batch, params)
    grad = grad_of(out.loss, batch)
    pad = batch.mask == 0
    garbage = batch.logprobs.detach().clone()
    garbage[pad] = torch.tensor([50.0, -1e4, -math.inf, 7.0], dtype=DT)
    batch.logprobs = garbage.requires_grad_()
    if batch.old_logprobs is not None:
        batch.old_logprobs = batch.old_logprobs.clone()
        batch.old_logprobs[pad] = -math.inf
    out2 = fn(batch, params)
    grad2 = grad_of(out2.loss, batch)
    assert out2.loss.item() == pytest.approx(out.loss.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad2, grad, rtol=1e-10, atol=1e-14)
    assert torch.all(grad2[pad] == 0)


def test_separation_views() -> None:
    """τ and ε of the §4 statistics: each baseline's own where it has one, else the paper's."""
    views = {
        "rloo": (RLOOParams(clip_high=0.3), 10.0, 0.3),
        "reinforce_pp": (ReinforcePPParams(clip_high=0.25), 10.0, 0.25),
        "cispo": (CISPOParams(clip_high=0.5), 10.0, 0.5),
        "gmpo": (GMPOParams(clip_high=0.4), 10.0, math.exp(0.4) - 1),
        "gspo": (GSPOParams(clip_high=0.01), 10.0, 0.2),
        "sapo": (SAPOParams(tau_pos=3.0), 10.0, 0.2),
        "disco": (DisCOParams(tau=2.0), 2.0, 0.2),
        "mcpo": (MCPOParams(clip_high=0.28), 10.0, 0.28),
        "ispo": (ISPOParams(clip_high=0.3), 10.0, 0.3),
        "ppo": (PPOParams(clip_high=0.35), 10.0, 0.35),
        "rrpo": (RRPOParams(clip_high=0.3), 10.0, 0.3),
    }
    assert set(views) == set(BASELINES)
    for name, (params, tau, eps) in views.items():
        view = params.separation_view(1.0)
        assert (view.tau, view.margin) == (tau, 0.01), name  # the paper's m_t at the end
        assert view.clip_eps == pytest.approx(eps, rel=1e-12), name


# ------------------------------------------------------------------------------------------
# Every baseline trains through train() with ratios ≠ 1
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BASELINES)
def test_trains_two_steps_with_two_mini_batches(name: str, model_store, arith_base, tmp_path):
    """On the SFT-warmed tiny model, so that groups hold both outcomes and updates happen."""
    # RRPO's head freezes after step 1 (both anchor sets hold one rollout), so step 2 logs its
    # agreement with the verifier; step 1, still collecting, does not.
    params = {"anchor_steps": 1, "min_anchors": 1} if name == "rrpo" else {}
    later = {M.RRPO_ANCHOR_AUC, M.RRPO_ANCHOR_GAP}
    cfg = RunConfig.model_validate({
        "algorithm": name,
        "params": params,
        "steps": 2,
        "model": {"name": "tiny-arith"},
        "task": {"name": "arith", "eval_size": 4},
        "sampling": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 6},
        "optim": {"mini_batches": 2, "lr": 1e-3},
        "eval": {"every": 0, "pass_k": 1},
        "checkpoint": {"every": 0},
    })  # fmt: skip
    sink = MemorySink()
    train(cfg, sink, workdir=tmp_path, model_store=model_store)
    for step in (1, 2):
        logged = sink.steps[step].metrics
        assert math.isfinite(logged[M.LOSS]) and math.isfinite(logged[M.GRAD_NORM]), step
        for key in get_objective(name).metrics:
            if step == 1 and key in later:
                assert key not in logged, key
                continue
            assert math.isfinite(logged[key]), (step, key)
    # The second mini-batch of a step sees π_θ ≠ π_old: the off-policy measures move.
    if name == "disco":
        assert sink.steps[1].metrics[M.DISCO_KL] > 0
    if name == "sapo":
        assert sink.steps[1].metrics[M.SAPO_GATE_WEIGHT] != pytest.approx(1.0, abs=1e-9)
