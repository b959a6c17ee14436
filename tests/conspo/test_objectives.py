"""Objectives against the identities of docs/objectives.md, checked with autograd.

Expectations are computed independently (naive Python loops over groups, hand arithmetic), never
copied from the implementation's output.
"""

from __future__ import annotations

import math

import pytest
import torch

from conspo import metrics
from conspo.objectives.base import (
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    aggregate_tokens,
    clipped_ratio_scores,
    dense_group_index,
    group_advantages,
    k3_kl,
    margin_at,
    sequence_scores,
)
from conspo.objectives.conspo import ConSPOParams, conspo_objective, conspo_score_loss
from conspo.objectives.dapo import DAPOParams
from conspo.objectives.dr_grpo import DrGRPOParams
from conspo.objectives.grpo import GRPOParams, grpo_objective
from conspo.registry import get_objective, objective_names

DT = torch.float64


# ------------------------------------------------------------------------------------------
# Random data with random group structure
# ------------------------------------------------------------------------------------------


def random_groups(
    gen: torch.Generator, n_groups: int = 6, extra_degenerate: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and shuffled, non-contiguous group ids: valid groups of random sizes plus
    (optionally) one all-positive and one all-negative group."""
    rewards: list[float] = []
    ids: list[int] = []
    id_pool = torch.randperm(1000, generator=gen)[: n_groups + 2] - 500  # negative ids too
    for g in range(n_groups):
        size = int(torch.randint(2, 7, (1,), generator=gen))
        n_pos = int(torch.randint(1, size, (1,), generator=gen))  # 1 <= N⁺ <= size-1
        rewards += [1.0] * n_pos + [0.0] * (size - n_pos)
        ids += [int(id_pool[g])] * size
    if extra_degenerate:
        rewards += [1.0] * 3 + [0.0] * 4
        ids += [int(id_pool[n_groups])] * 3 + [int(id_pool[n_groups + 1])] * 4
    perm = torch.randperm(len(rewards), generator=gen)
    return torch.tensor(rewards, dtype=DT)[perm], torch.tensor(ids)[perm]


def groups_of(rewards: torch.Tensor, ids: torch.Tensor) -> dict[int, tuple[list[int], list[int]]]:
    """{group id: (positive rollout indices, negative rollout indices)} by a plain loop."""
    out: dict[int, tuple[list[int], list[int]]] = {}
    for i, (r, g) in enumerate(zip(rewards.tolist(), ids.tolist(), strict=True)):
        pos, neg = out.setdefault(g, ([], []))
        (pos if r == 1.0 else neg).append(i)
    return out


def naive_conspo_j(s: list[float], pos: list[int], neg: list[int], tau: float, m: float) -> float:
    """J(q) of §2 written literally: (1/N⁺) Σ_i τ log [e^{ŝ_i/τ} / (e^{ŝ_i/τ} + Σ_j e^{s_j/τ})]."""
    total = 0.0
    for i in pos:
        num = math.exp((s[i] - m) / tau)
        den = num + sum(math.exp(s[j] / tau) for j in neg)
        total += tau * math.log(num / den)
    return total / len(pos)


def random_batch(gen: torch.Generator, t: int = 7) -> PolicyBatch:
    rewards, ids = random_groups(gen)
    b = rewards.shape[0]
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(DT)
    logprobs = (-3 * torch.rand(b, t, generator=gen, dtype=DT)).requires_grad_()
    return PolicyBatch(
        logprobs=logprobs,
        mask=mask,
        rewards=rewards,
        group_ids=ids,
        progress=0.4,
        max_response_len=t,
        entropy=-logprobs.detach(),  # ISPO's token hinge reads it; no draw from ``gen``
    )


# ------------------------------------------------------------------------------------------
# ConSPO: the five identities of §2
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tau,m", [(10.0, 0.01), (0.5, 0.3), (1.0, 0.0)])
def test_conspo_gradient_identities(seed: int, tau: float, m: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards, ids = random_groups(gen)
    # Spread scores so that softmax weights are far from uniform even at τ = 10.
    s = (-8 * torch.rand(rewards.shape[0], generator=gen, dtype=DT)).requires_grad_()
    loss = conspo_score_loss(s, rewards, ids, tau=tau, margin=m)
    (grad,) = torch.autograd.grad(loss, s)

    groups = groups_of(rewards, ids)
    valid = {g: pn for g, pn in groups.items() if pn[0] and pn[1]}
    # loss = −(1/K) Σ_g J_g, so ∂J_g/∂s = −K ∂loss/∂s for the members of group g.
    dj = -len(valid) * grad
    sv = s.tolist()
    for pos, neg in valid.values():
        n_pos = len(pos)
        z = {i: math.exp((sv[i] - m) / tau) + sum(math.exp(sv[k] / tau) for k in neg) for i in pos}
        p_pos = {i: math.exp((sv[i] - m) / tau) / z[i] for i in pos}
        for i in pos:  # 1. ∂J/∂s_i⁺ = (1 − P_i⁺)/N⁺
            assert dj[i].item() == pytest.approx((1 - p_pos[i]) / n_pos, rel=1e-9, abs=1e-12)
        for j in neg:  # 2. ∂J/∂s_j⁻ = −(1/N⁺) Σ_i P_ij⁻
            expected = -sum(math.exp(sv[j] / tau) / z[i] for i in pos) / n_pos
            assert dj[j].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
        # 3. group-level balance
        assert dj[pos + neg].sum().item() == pytest.approx(0.0, abs=1e-12)
        # 4. ratio of push-downs on two negatives
        for j, k in zip(neg, neg[1:], strict=False):
            ratio = abs(dj[j].item()) / abs(dj[k].item())
            assert ratio == pytest.approx(math.exp((sv[j] - sv[k]) / tau), rel=1e-9)
    # All-positive / all-negative groups get no gradient.
    for pos, neg in groups.values():
        if not (pos and neg):
            assert torch.all(grad[pos + neg] == 0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("m", [0.0, 0.05])
def test_conspo_loss_equals_naive_infonce(seed: int, m: float) -> None:
    """5. With m = 0 the loss is the plain InfoNCE of Eq. 8 (and with m > 0, Eq. 13)."""
    gen = torch.Generator().manual_seed(seed)
    rewards, ids = random_groups(gen)
    s = -5 * torch.rand(rewards.shape[0], generator=gen, dtype=DT)
    tau = 2.0
    valid = [(p, n) for p, n in groups_of(rewards, ids).values() if p and n]
    expected = -sum(naive_conspo_j(s.tolist(), p, n, tau, m) for p, n in valid) / len(valid)
    got = conspo_score_loss(s, rewards, ids, tau=tau, margin=m)
    assert got.dim() == 0
    assert got.item() == pytest.approx(expected, rel=1e-10)


def test_conspo_loss_is_stable_for_extreme_scores() -> None:
    # Naive exp would overflow/underflow at τ = 0.01 with scores of order 10.
    s = torch.tensor([-1.0, -30.0, -2.0, -40.0], dtype=DT, requires_grad=True)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=DT)
    ids = torch.tensor([3, 3, 3, 3])
    loss = conspo_score_loss(s, r, ids, tau=0.01, margin=0.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(s.grad).all()
    # positive -40 loses to negative -2 by 38: −τ log P⁺ ≈ 38, positive -1 wins: ≈ 0; mean ≈ 19.
    assert loss.item() == pytest.approx(19.0, abs=1e-6)


def test_conspo_no_valid_group_gives_zero_with_grad() -> None:
    s = torch.tensor([-1.0, -2.0, -3.0], dtype=DT, requires_grad=True)
    loss = conspo_score_loss(
        s, torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 1]), tau=1, margin=0
    )
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(s.grad, torch.zeros(3, dtype=DT))


def test_degenerate_groups_contribute_nothing_to_conspo() -> None:
    gen = torch.Generator().manual_seed(5)
    rewards, ids = random_groups(gen, extra_degenerate=False)
    s = -4 * torch.rand(rewards.shape[0], generator=gen, dtype=DT)
    base = conspo_score_loss(s, rewards, ids, tau=1.0, margin=0.1)
    more_s = torch.cat([s, torch.tensor([-0.1, -0.2, -9.0, -8.0], dtype=DT)])
    more_r = torch.cat([rewards, torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=DT)])
    more_ids = torch.cat([ids, torch.tensor([10_001, 10_001, 10_002, 10_002])])
    more = conspo_score_loss(more_s, more_r, more_ids, tau=1.0, margin=0.1)
    assert more.item() == pytest.approx(base.item(), rel=1e-12)


def test_dense_group_index_maps_equal_ids_together() -> None:
    ids = torch.tensor([40, -7, 40, 3, -7, 1_000_000])
    dense = dense_group_index(ids).tolist()
    assert dense[0] == dense[2] and dense[1] == dense[4]
    assert len({dense[0], dense[1], dense[3], dense[5]}) == 4
    assert all(0 <= d < len(dense) for d in dense)


# ------------------------------------------------------------------------------------------
# GRPO: Proposition 1
# ------------------------------------------------------------------------------------------


def proposition1_batch(seed: int, group_size: int = 5) -> PolicyBatch:
    """K groups of G (equal size, as in GRPO), incl. one all-positive and one all-negative group."""
    gen = torch.Generator().manual_seed(seed)
    n_groups, t = 5, 6
    rewards = []
    for g in range(n_groups):
        if g == 0:
            rewards += [1.0] * group_size
        elif g == 1:
            rewards += [0.0] * group_size
        else:
            n_pos = int(torch.randint(1, group_size, (1,), generator=gen))
            rewards += [1.0] * n_pos + [0.0] * (group_size - n_pos)
    ids = torch.arange(n_groups).repeat_interleave(group_size) * 7 + 3
    perm = torch.randperm(len(rewards), generator=gen)
    b = len(rewards)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(DT)
    logprobs = (-2 * torch.rand(b, t, generator=gen, dtype=DT)).requires_grad_()
    return PolicyBatch(
        logprobs=logprobs,
        mask=mask,
        rewards=torch.tensor(rewards, dtype=DT)[perm],
        group_ids=ids[perm],
        max_response_len=t,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_gradient_is_proposition_1(seed: int) -> None:
    """At ρ = 1 with seq-mean-token-mean, ∂loss/∂logprob_{i,t} = −(1/K)·w_g/N⁺/|o_i| for a
    positive and +(1/K)·w_g/N⁻/|o_i| for a negative, w_g = sqrt(p̂(1−p̂)), K = number of groups
    (the seq-mean runs over all K·G rollouts, so each group's J_GRPO is divided by K)."""
    batch = proposition1_batch(seed)
    out = grpo_objective(batch, GRPOParams())
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)

    groups = groups_of(batch.rewards, batch.group_ids)
    k = len(groups)
    lengths = batch.mask.sum(1).tolist()
    expected = torch.zeros_like(grad)
    for pos, neg in groups.values():
        if not (pos and neg):
            continue
        p = len(pos) / (len(pos) + len(neg))
        w = math.sqrt(p * (1 - p))
        for i in pos:
            expected[i] = -w / len(pos) / lengths[i] / k
        for j in neg:
            expected[j] = w / len(neg) / lengths[j] / k
    expected = expected * batch.mask  # no gradient on padding
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_loss_equals_discriminative_form_off_policy(seed: int) -> None:
    """Lemma 1 also holds in value for any ρ: GRPO's loss is −(1/K) Σ_g w_g (mean s⁺ − mean s⁻)
    with the clipped-ratio scores (ε_low = ε_high), so values and gradients both agree."""
    batch = proposition1_batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    # Ratios spread over [e^-0.4, e^0.4] so that both clip boundaries (±0.2) are crossed.
    batch.old_logprobs = batch.logprobs.detach() + 0.8 * (
        torch.rand(batch.logprobs.shape, generator=gen, dtype=DT) - 0.5
    )
    eps = 0.2
    out = grpo_objective(batch, GRPOParams(clip_low=eps, clip_high=eps))
    assert out.stats[metrics.CLIP_FRAC].item() > 0  # the clip is really exercised

    scores = clipped_ratio_scores(
        batch.logprobs, batch.old_logprobs, batch.mask, batch.rewards, eps
    )
    groups = groups_of(batch.rewards, batch.group_ids)
    j_total = torch.zeros((), dtype=DT)
    for pos, neg in groups.values():
        if pos and neg:
            p = len(pos) / (len(pos) + len(neg))
            gap = scores[pos].mean() - scores[neg].mean()
            j_total = j_total + math.sqrt(p * (1 - p)) * gap
    reference = -j_total / len(groups)
    torch.testing.assert_close(out.loss, reference, rtol=1e-9, atol=1e-12)
    g1 = torch.autograd.grad(out.loss, batch.logprobs, retain_graph=True)[0]
    g2 = torch.autograd.grad(reference, batch.logprobs)[0]
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)


def test_grpo_clip_frac_and_clipping_by_hand() -> None:
    # One group, rewards [1, 0] → advantages [+1, −1]. Token log-ratios chosen by hand.
    lr = torch.tensor([[0.5, 0.0], [-0.5, 0.1]], dtype=DT)
    logprobs = torch.zeros(2, 2, dtype=DT, requires_grad=True)
    batch = PolicyBatch(
        logprobs=logprobs,
        mask=torch.ones(2, 2, dtype=DT),
        rewards=torch.tensor([1.0, 0.0], dtype=DT),
        group_ids=torch.tensor([0, 0]),
        old_logprobs=-lr,
    )
    out = grpo_objective(batch, GRPOParams(clip_low=0.2, clip_high=0.2))
    rho = [[math.exp(0.5), 1.0], [math.exp(-0.5), math.exp(0.1)]]
    # positive: min(ρ, 1.2); negative: −max(ρ, 0.8)
    pos_tokens = [min(rho[0][0], 1.2), min(rho[0][1], 1.2)]
    neg_tokens = [-max(rho[1][0], 0.8), -max(rho[1][1], 0.8)]
    expected = -(sum(pos_tokens) / 2 + sum(neg_tokens) / 2) / 2
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    # clipped: token (0,0) (ρ=1.65 > 1.2, A>0) and (1,0) (ρ=0.61 < 0.8, A<0): 2 of 4.
    assert out.stats[metrics.CLIP_FRAC].item() == pytest.approx(0.5)
    out.loss.backward()
    # clipped tokens get no gradient; others −A·ρ/2/2
    expected_grad = torch.tensor([[0.0, -rho[0][1] / 4], [0.0, rho[1][1] / 4]], dtype=DT)
    torch.testing.assert_close(logprobs.grad, expected_grad)


# ------------------------------------------------------------------------------------------
# Building blocks by hand
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "progress,expected_fraction",
    [(0.0, 0.0), (0.15, 0.5), (0.3, 1.0), (1.0, 1.0), (2.0, 1.0), (0.075, None)],
)
def test_margin_at(progress: float, expected_fraction: float | None) -> None:
    m = margin_at(progress, margin_max=0.01, warmup=0.3)
    if expected_fraction is None:  # a quarter of the way: (1 − cos(π/4))/2
        expected_fraction = (1 - math.sqrt(0.5)) / 2
    assert m == pytest.approx(0.01 * expected_fraction, abs=1e-15)


def test_aggregate_tokens_modes_by_hand() -> None:
    a, b_, c, d = 1.0, 2.0, 4.0, 8.0
    loss_mat = torch.tensor([[a, b_, 100.0], [d, 100.0, 100.0], [c, 0.0, 0.0]], dtype=DT)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=DT)
    row3 = c + 0.0 + 0.0
    assert aggregate_tokens(loss_mat, mask, "token-mean", 5).item() == pytest.approx(
        (a + b_ + d + row3) / 6
    )
    assert aggregate_tokens(loss_mat, mask, "seq-mean-token-mean", 5).item() == pytest.approx(
        ((a + b_) / 2 + d / 1 + row3 / 3) / 3
    )
    assert aggregate_tokens(loss_mat, mask, "seq-mean-token-sum-norm", 5).item() == pytest.approx(
        ((a + b_) / 5 + d / 5 + row3 / 5) / 3
    )
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_tokens(loss_mat, mask, "bogus", 5)  # type: ignore[arg-type]


def test_sequence_scores_by_hand() -> None:
    lp = torch.tensor([[-1.0, -3.0, -50.0], [-2.0, -float("inf"), 7.0]], dtype=DT)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=DT)
    assert sequence_scores(lp, mask).tolist() == [-2.0, -2.0]


def test_clipped_ratio_scores_by_hand() -> None:
    lp = torch.zeros(2, 2, dtype=DT)
    old = -torch.tensor([[0.5, -0.5], [0.5, -0.5]], dtype=DT)  # ρ = e^{±0.5}
    mask = torch.ones(2, 2, dtype=DT)
    s = clipped_ratio_scores(lp, old, mask, torch.tensor([1.0, 0.0]), 0.2)
    e = math.exp(-0.5)
    assert s[0].item() == pytest.approx((1.2 + e) / 2)  # mean min(ρ, 1+ε)
    assert s[1].item() == pytest.approx((math.exp(0.5) + 0.8) / 2)  # mean max(ρ, 1−ε)
    # old None ⇒ ρ = 1 in value, gradient 1/|o| per token
    lp2 = torch.full((1, 4), -1.3, dtype=DT, requires_grad=True)
    s2 = clipped_ratio_scores(lp2, None, torch.ones(1, 4, dtype=DT), torch.tensor([1.0]), 0.2)
    s2.sum().backward()
    assert s2.item() == pytest.approx(1.0)
    torch.testing.assert_close(lp2.grad, torch.full((1, 4), 0.25, dtype=DT))


def test_group_advantages_by_hand() -> None:
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=DT)
    ids = torch.tensor([4, 4, 9, 4, 9, 4, 9, 9, -1, -1])
    # group 4: [1,0,0,0] mean .25, std sqrt(.1875); group 9: [1,0,0,1] mean .5 std .5; -1: const
    s4 = math.sqrt(0.1875)
    expected = [0.75 / s4, -0.25 / s4, 1.0, -0.25 / s4, -1.0, -0.25 / s4, -1.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(group_advantages(r, ids, "group"), torch.tensor(expected, dtype=DT))
    centered = [0.75, -0.25, 0.5, -0.25, -0.5, -0.25, -0.5, 0.5, 0.0, 0.0]
    torch.testing.assert_close(group_advantages(r, ids, "none"), torch.tensor(centered, dtype=DT))
    p = 0.5  # 5 of 10 positive; population std of the batch = 0.5
    torch.testing.assert_close(
        group_advantages(r, ids, "batch"), torch.tensor(centered, dtype=DT) / math.sqrt(p * p)
    )
    torch.testing.assert_close(
        group_advantages(r, ids, "batch", batch_std=0.25), torch.tensor(centered, dtype=DT) * 4
    )
    # A constant group of fractional rewards must not blow up on float noise.
    shaped = torch.tensor([0.7, 0.7, 0.7], dtype=torch.float32)
    assert torch.equal(group_advantages(shaped, torch.tensor([1, 1, 1]), "group"), torch.zeros(3))


def test_k3_kl_known_value() -> None:
    lp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=DT)
    ref = lp + math.log(2.0)  # x = log 2 everywhere: k3 = 2 − log 2 − 1
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=DT)
    kl = k3_kl(lp, ref, mask)
    torch.testing.assert_close(kl, torch.tensor([[1 - math.log(2.0)] * 2 + [0.0]], dtype=DT))
    assert k3_kl(lp, lp, mask).abs().max().item() == 0.0


@pytest.mark.parametrize("name", ["grpo", "conspo"])
def test_kl_term_enters_loss_only_with_beta_and_ref(name: str) -> None:
    batch = random_batch(torch.Generator().manual_seed(3))
    reg = get_objective(name)
    base = reg.fn(batch, reg.params())
    assert metrics.KL not in base.stats
    batch.ref_logprobs = batch.logprobs.detach() + math.log(2.0)
    with_ref = reg.fn(batch, reg.params())
    # A constant per-token value aggregates to itself under token-mean (ConSPO) and
    # seq-mean-token-mean (GRPO's default).
    expected_kl = 1 - math.log(2.0)
    assert with_ref.stats[metrics.KL].item() == pytest.approx(expected_kl, rel=1e-9)
    assert with_ref.loss.item() == pytest.approx(base.loss.item(), rel=1e-12)  # β = 0
    beta = 0.5
    with_beta = reg.fn(batch, reg.params(beta=beta))
    assert with_beta.loss.item() == pytest.approx(base.loss.item() + beta * expected_kl, rel=1e-9)


# ------------------------------------------------------------------------------------------
# Padding, ablation switches, registry
# ------------------------------------------------------------------------------------------

ALL_CONFIGS = [
    ("grpo", GRPOParams()),
    ("grpo", GRPOParams(scale_rewards="batch", beta=0.1)),
    ("dapo", DAPOParams()),
    ("dr_grpo", DrGRPOParams()),
    ("conspo", ConSPOParams()),
    ("conspo", ConSPOParams(contrast="linear", beta=0.1)),
    ("conspo", ConSPOParams(score="clipped_ratio")),
    ("conspo", ConSPOParams(margin="fixed", tau=0.5)),
]


@pytest.mark.parametrize("name,params", ALL_CONFIGS)
@pytest.mark.parametrize("off_policy", [False, True])
def test_padding_does_not_change_loss_or_grad(name: str, params, off_policy: bool) -> None:
    gen = torch.Generator().manual_seed(11)
    batch = random_batch(gen)
    pad = batch.mask == 0
    assert pad.any()
    batch.ref_logprobs = batch.logprobs.detach() - 0.3 * torch.rand(
        batch.logprobs.shape, generator=gen, dtype=DT
    )
    if off_policy:
        batch.old_logprobs = batch.logprobs.detach() + 0.1
    fn = get_objective(name).fn
    out = fn(batch, params)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)

    garbage = batch.logprobs.detach().clone()
    n_pad = int(pad.sum())
    garbage[pad] = torch.tensor([50.0, -1e4, -math.inf], dtype=DT).repeat(n_pad)[:n_pad]
    batch.logprobs = garbage.requires_grad_()
    out2 = fn(batch, params)
    (grad2,) = torch.autograd.grad(out2.loss, batch.logprobs)
    assert out2.loss.item() == pytest.approx(out.loss.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad2, grad, rtol=1e-10, atol=1e-14)
    assert torch.all(grad2[pad] == 0)


def test_margin_switch_none_fixed_cosine() -> None:
    batch = random_batch(torch.Generator().manual_seed(21))
    batch.progress = 0.0
    loss = {
        m: conspo_objective(batch, ConSPOParams(margin=m, margin_max=0.5)).loss.item()
        for m in ("none", "fixed", "cosine")
    }
    assert loss["cosine"] == pytest.approx(loss["none"], rel=1e-12)  # m_0 = 0
    assert loss["fixed"] > loss["none"]  # the margin handicaps every positive
    scores = sequence_scores(batch.logprobs, batch.mask)
    fixed = conspo_score_loss(scores, batch.rewards, batch.group_ids, tau=10.0, margin=0.5)
    assert loss["fixed"] == pytest.approx(fixed.item(), rel=1e-12)
    batch.progress = 0.7  # past α = 0.3: cosine is at M
    late = conspo_objective(batch, ConSPOParams(margin="cosine", margin_max=0.5)).loss.item()
    assert late == pytest.approx(loss["fixed"], rel=1e-12)
    batch.progress = 0.15  # half-way through α: m = M/2
    mid = conspo_objective(batch, ConSPOParams(margin="cosine", margin_max=0.5)).loss.item()
    half = conspo_score_loss(scores, batch.rewards, batch.group_ids, tau=10.0, margin=0.25)
    assert mid == pytest.approx(half.item(), rel=1e-12)


def test_linear_contrast_is_minus_mean_gap() -> None:
    batch = random_batch(torch.Generator().manual_seed(22))
    out = conspo_objective(batch, ConSPOParams(contrast="linear"))
    s = (batch.logprobs * batch.mask).sum(1) / batch.mask.sum(1)
    gaps = [
        s[p].mean().item() - s[n].mean().item()
        for p, n in groups_of(batch.rewards, batch.group_ids).values()
        if p and n
    ]
    assert out.loss.item() == pytest.approx(-sum(gaps) / len(gaps), rel=1e-12)


def test_clipped_ratio_score_switch_on_policy() -> None:
    """At ρ = 1 every clipped-ratio score is 1, so J_g = τ log(1/(1 + N⁻)) with m = 0."""
    batch = random_batch(torch.Generator().manual_seed(23))
    batch.progress = 0.0
    tau = 3.0
    out = conspo_objective(batch, ConSPOParams(score="clipped_ratio", tau=tau))
    valid = [(p, n) for p, n in groups_of(batch.rewards, batch.group_ids).values() if p and n]
    expected = sum(tau * math.log(1 + len(n)) for _, n in valid) / len(valid)
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    logprob = conspo_objective(batch, ConSPOParams(score="logprob", tau=tau))
    assert abs(out.loss.item() - logprob.loss.item()) > 1e-3


def test_every_registered_objective_runs_and_backprops() -> None:
    names = objective_names()
    assert set(names) >= {"grpo", "dapo", "dr_grpo", "conspo"}
    for name in names:
        reg = get_objective(name)
        batch = random_batch(torch.Generator().manual_seed(31))
        out = reg.fn(batch, reg.params())
        assert out.loss.dim() == 0 and torch.isfinite(out.loss)
        out.loss.backward()
        grad = batch.logprobs.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
        assert out.stats[metrics.LOSS].item() == pytest.approx(out.loss.item())
        for value in out.stats.values():
            assert value.dim() == 0 and not value.requires_grad


# ------------------------------------------------------------------------------------------
# The separation view: τ, m_t and ε of the §4 statistics, per objective
# ------------------------------------------------------------------------------------------

PROGRESS = [0.0, 0.075, 0.15, 0.3, 0.7, 1.0]


def paper_margin(progress: float) -> float:
    """m_t of ConSPO's paper defaults written out: M = 0.01, α = 0.3, half-cosine (§2)."""
    return 0.5 * 0.01 * (1.0 - math.cos(math.pi * min(progress / 0.3, 1.0)))


# ε of every built-in objective at its defaults: the GRPO family's clip_high, ConSPO's clip.
DEFAULT_CLIP_EPS = {"grpo": 0.2, "dapo": 0.28, "dr_grpo": 0.2, "conspo": 0.2}


def test_base_separation_view_is_the_paper_defaults() -> None:
    for p in PROGRESS:
        assert ObjectiveParams().separation_view(p) == SeparationView(10.0, paper_margin(p), 0.2)


@pytest.mark.parametrize("name", objective_names())
def test_every_registered_objective_shares_the_paper_axis_by_default(name: str) -> None:
    """At its defaults every objective reads separation with τ = 10 and the paper's m_t."""
    view = get_objective(name).params().separation_view
    for p in PROGRESS:
        assert (view(p).tau, view(p).margin) == (10.0, paper_margin(p))
    if name in DEFAULT_CLIP_EPS:
        assert view(0.5).clip_eps == DEFAULT_CLIP_EPS[name]
    else:  # an objective added later: ε of a §1 clipped ratio, in (0, 1)
        assert 0 < view(0.5).clip_eps < 1


@pytest.mark.parametrize("params_type", [GRPOParams, DAPOParams, DrGRPOParams])
def test_grpo_family_separation_view_uses_its_clip_range(params_type: type[GRPOParams]) -> None:
    params = params_type(clip_low=0.1, clip_high=0.35)
    for p in PROGRESS:
        assert params.separation_view(p) == SeparationView(10.0, paper_margin(p), 0.35, 0.1)


@pytest.mark.parametrize("margin", ["cosine", "fixed", "none"])
def test_conspo_separation_view_uses_its_own_tau_margin_and_clip(margin: str) -> None:
    params = ConSPOParams(tau=3.0, margin=margin, margin_max=0.5, margin_warmup=0.5, clip=0.1)
    expected = {
        "cosine": lambda p: 0.5 * 0.5 * (1.0 - math.cos(math.pi * min(p / 0.5, 1.0))),
        "fixed": lambda p: 0.5,
        "none": lambda p: 0.0,
    }[margin]
    for p in PROGRESS:
        assert params.separation_view(p) == SeparationView(3.0, expected(p), 0.1, 0.1)


# ------------------------------------------------------------------------------------------
# One definition of "positive": the verified outcome, whatever the shaped reward
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params", [ConSPOParams(), ConSPOParams(contrast="linear"), ConSPOParams(score="clipped_ratio")]
)
def test_a_correct_answer_with_a_shaped_reward_below_half_stays_positive(params) -> None:
    """Overlong shaping took a correct answer to 0.4: the contrast still pulls it up."""
    logprobs = torch.tensor([[-0.5, -1.0], [-0.7, -0.2]], dtype=DT, requires_grad=True)
    common = {"mask": torch.ones(2, 2, dtype=DT), "group_ids": torch.tensor([0, 0])}
    shaped = PolicyBatch(
        logprobs=logprobs,
        rewards=torch.tensor([0.4, 0.0], dtype=DT),
        correct=torch.tensor([1.0, 0.0], dtype=DT),
        **common,
    )
    binary = PolicyBatch(logprobs=logprobs, rewards=torch.tensor([1.0, 0.0], dtype=DT), **common)
    assert shaped.outcome.tolist() == [1.0, 0.0]
    got, want = conspo_objective(shaped, params).loss, conspo_objective(binary, params).loss
    assert got.item() == pytest.approx(want.item())
    if params.score == "logprob":  # the group has a positive and a negative: it trains
        (grad,) = torch.autograd.grad(got, logprobs)
        assert grad[0].sum() < 0 < grad[1].sum()  # minimising pulls the correct one up


# ------------------------------------------------------------------------------------------
# Tool-use rollouts: the interpreter's tokens count nowhere
# ------------------------------------------------------------------------------------------


def with_observations(batch: PolicyBatch, gen: torch.Generator, k: int = 3) -> PolicyBatch:
    """``batch`` with ``k`` observation columns inserted inside every row's response (after a
    random number of its own tokens), masked out, holding arbitrary values in every per-token
    tensor: what a rollout that called a tool looks like to an objective."""
    b, t = batch.mask.shape
    lengths = batch.mask.sum(-1).long()
    at = [int(torch.randint(0, int(n) + 1, (1,), generator=gen)) for n in lengths]

    def spread(values: torch.Tensor | None, filler: torch.Tensor) -> torch.Tensor | None:
        if values is None:
            return None
        rows = [torch.cat([v[:a], f, v[a:]]) for v, a, f in zip(values, at, filler, strict=True)]
        return torch.stack(rows)

    noise = -5 * torch.rand(b, k, generator=gen, dtype=DT)
    return PolicyBatch(
        logprobs=spread(batch.logprobs.detach(), noise).requires_grad_(),  # type: ignore[union-attr]
        mask=spread(batch.mask, torch.zeros(b, k, dtype=DT)),  # type: ignore[arg-type]
        rewards=batch.rewards,
        group_ids=batch.group_ids,
        progress=batch.progress,
        max_response_len=batch.max_response_len,
        old_logprobs=spread(batch.old_logprobs, noise * 3),
        ref_logprobs=spread(batch.ref_logprobs, noise * 7),
        entropy=spread(batch.entropy, -noise * 11),
    )


@pytest.mark.parametrize("name", objective_names())
def test_interpreter_tokens_change_no_objective(name: str) -> None:
    """Every objective's loss, statistics and gradient on the model's tokens are the same with
    masked observation columns inside the responses (their values arbitrary) as without them,
    and the gradient on those columns is exactly zero: length normalisation, aggregation,
    ratios, KL and the scores count the model's tokens only (off-policy, with a reference)."""
    gen = torch.Generator().manual_seed(11)
    plain = random_batch(gen)
    plain.old_logprobs = plain.logprobs.detach() + 0.3 * torch.randn(
        plain.logprobs.shape, generator=gen, dtype=DT
    )
    plain.ref_logprobs = plain.logprobs.detach() - 0.2
    tools = with_observations(plain, gen)
    reg = get_objective(name)
    params = reg.params(beta=0.1)
    a, b = reg.fn(plain, params), reg.fn(tools, params)
    assert b.loss.item() == pytest.approx(a.loss.item(), rel=1e-9, abs=1e-12)
    assert a.stats.keys() == b.stats.keys()
    for key in a.stats:
        assert b.stats[key].item() == pytest.approx(a.stats[key].item(), rel=1e-9, abs=1e-12), key
    (grad_a,) = torch.autograd.grad(a.loss, plain.logprobs)
    (grad_b,) = torch.autograd.grad(b.loss, tools.logprobs)
    assert int((tools.mask == 0).sum()) == int((plain.mask == 0).sum()) + 3 * len(plain.mask)
    assert torch.equal(grad_b[tools.mask == 0], torch.zeros_like(grad_b[tools.mask == 0]))
    torch.testing.assert_close(
        grad_b[tools.mask > 0], grad_a[plain.mask > 0], rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize("name", objective_names())
def test_linear_on_policy_is_declared_exactly_where_the_gradient_ignores_the_values(
    name: str,
) -> None:
    """``linear_on_policy`` lets a split gradient pass take ∂loss/∂log-probs before any forward
    (conspo.training.update.on_policy_backward): it must hold for the loss as written, on
    policy (no π_old) and without a reference, and an objective that has it declares it."""
    registered = get_objective(name)
    params = registered.params()
    same = []
    for seed in range(3):
        grads = []
        for draw in range(2):  # the same rollouts, other log-prob and entropy values
            batch = random_batch(torch.Generator().manual_seed(seed))
            values = torch.Generator().manual_seed(100 + 10 * seed + draw)
            batch.logprobs = (-3 * torch.rand(batch.mask.shape, generator=values,
                                              dtype=DT)).requires_grad_()  # fmt: skip
            batch.entropy = torch.rand(batch.mask.shape, generator=values, dtype=DT)
            (grad,) = torch.autograd.grad(
                registered.fn(batch, params).loss, batch.logprobs, allow_unused=True
            )
            grads.append(torch.zeros_like(batch.mask) if grad is None else grad * batch.mask)
        same.append(torch.allclose(grads[0], grads[1], rtol=1e-9, atol=1e-12))
    assert all(same) == registered.linear_on_policy, (name, same)
    if registered.linear_on_policy and hasattr(params, "beta"):
        # A reference term (β > 0) is not linear: the trainer checks β as well.
        with_kl = registered.params(beta=0.1)
        batch = random_batch(torch.Generator().manual_seed(0))
        batch.ref_logprobs = batch.logprobs.detach() - 0.5
        (at_first,) = torch.autograd.grad(registered.fn(batch, with_kl).loss, batch.logprobs)
        batch.logprobs = (batch.logprobs.detach() - 1.0).requires_grad_()
        (at_second,) = torch.autograd.grad(registered.fn(batch, with_kl).loss, batch.logprobs)
        assert not torch.allclose(at_first * batch.mask, at_second * batch.mask)
