"""separation_stats on a small batch whose every value is worked out by hand below."""

from __future__ import annotations

import math

import pytest
import torch

from conspo import metrics as M
from conspo.training.stats import offpolicy_stats, separation_stats

DT = torch.float64
TAU = 1.0
MARGIN = 0.25

# Group 5 (valid): positives -0.1, -0.5; negatives -0.3, -0.9.
# Group 2 (valid): positive -0.2; negatives -0.4, -0.6, -0.8.
# Group 9: all positive. Group 1: all negative.
ROWS = [  # (group id, reward, score, clipped score, length)
    (5, 1.0, -0.1, 1.10, 3),
    (5, 1.0, -0.5, 1.00, 5),
    (5, 0.0, -0.3, 0.90, 7),
    (5, 0.0, -0.9, 0.80, 9),
    (2, 1.0, -0.2, 1.05, 2),
    (2, 0.0, -0.4, 0.95, 4),
    (2, 0.0, -0.6, 0.85, 6),
    (2, 0.0, -0.8, 0.75, 8),
    (9, 1.0, -0.05, 1.0, 10),
    (9, 1.0, -0.07, 1.0, 12),
    (1, 0.0, -1.0, 1.0, 14),
    (1, 0.0, -2.0, 1.0, 16),
]


def batch(order: list[int] | None = None, dtype: torch.dtype = DT):
    rows = [ROWS[i] for i in (order or range(len(ROWS)))]
    ids, rewards, scores, clipped, lengths = zip(*rows, strict=True)
    return (
        torch.tensor(scores, dtype=dtype),
        torch.tensor(rewards, dtype=dtype),
        torch.tensor(ids),
        torch.tensor(lengths),
        torch.tensor(clipped, dtype=dtype),
    )


def p_pos(s_pos: float, negs: list[float]) -> float:
    num = math.exp((s_pos - MARGIN) / TAU)
    return num / (num + sum(math.exp(s / TAU) for s in negs))


def hard_share(s_pos: float, negs: list[float]) -> float:
    z = math.exp((s_pos - MARGIN) / TAU) + sum(math.exp(s / TAU) for s in negs)
    p_neg = [math.exp(s / TAU) / z for s in negs]
    return max(p_neg) / sum(p_neg)


EXPECTED = {
    # per group then mean over the two valid groups
    M.SEP_POS_SCORE: (-0.3 + -0.2) / 2,
    M.SEP_NEG_SCORE: (-0.6 + -0.6) / 2,
    M.SEP_GAP: ((-0.3 + 0.6) + (-0.2 + 0.6)) / 2,
    # group 5: -0.5 − (-0.3) = -0.2; group 2: -0.2 − (-0.4) = 0.2
    M.SEP_GAP_MIN: 0.0,
    # group 5: 3 of 4 pairs ordered; group 2: 3 of 3
    M.SEP_ORDER_ACC: (3 / 4 + 1.0) / 2,
    # with m = 0.25: group 5: -0.35 beats -0.9 only, -0.75 beats -0.9 only → 2/4;
    # group 2: -0.45 beats -0.6 and -0.8 → 2/3
    M.SEP_MARGIN_ACC: (2 / 4 + 2 / 3) / 2,
    M.CONSPO_MARGIN: MARGIN,
    M.CONSPO_P_POS: (
        (p_pos(-0.1, [-0.3, -0.9]) + p_pos(-0.5, [-0.3, -0.9])) / 2
        + p_pos(-0.2, [-0.4, -0.6, -0.8])
    )
    / 2,
    M.CONSPO_P_POS_UNIFORM: (1 / 3 + 1 / 4) / 2,
    M.CONSPO_HARD_NEG_SHARE: (
        (hard_share(-0.1, [-0.3, -0.9]) + hard_share(-0.5, [-0.3, -0.9])) / 2
        + hard_share(-0.2, [-0.4, -0.6, -0.8])
    )
    / 2,
    M.GRPO_WEIGHT: (math.sqrt(0.5 * 0.5) + math.sqrt(0.25 * 0.75)) / 2,
    # group 5: (1.10+1.00)/2 − (0.90+0.80)/2 = 0.2; group 2: 1.05 − 0.85 = 0.2
    M.GRPO_CLIP_GAP: 0.2,
    M.BATCH_PASS_RATE: 5 / 12,
    M.BATCH_VALID_GROUPS: 2.0,
    M.BATCH_ALL_POS_GROUPS: 1.0,
    M.BATCH_ALL_NEG_GROUPS: 1.0,
    # over all rollouts of the batch
    M.LEN_POS: (3 + 5 + 2 + 10 + 12) / 5,
    M.LEN_NEG: (7 + 9 + 4 + 6 + 8 + 14 + 16) / 7,
}


def test_hand_computed_batch_every_key() -> None:
    scores, rewards, ids, lengths, clipped = batch()
    got = separation_stats(
        scores, rewards, ids, lengths, margin=MARGIN, tau=TAU, clipped_scores=clipped
    )
    assert list(got) == list(M.SEPARATION_KEYS)
    assert set(got) == set(EXPECTED)
    for key, value in EXPECTED.items():
        assert got[key].dim() == 0, key
        assert got[key].item() == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_hard_negative_share_is_independent_of_the_positive() -> None:
    # The documented simplification: Z_i cancels in max_j P_ij⁻ / Σ_j P_ij⁻.
    assert hard_share(-0.1, [-0.3, -0.9]) == pytest.approx(hard_share(-0.5, [-0.3, -0.9]))
    assert hard_share(-0.1, [-0.3, -0.9]) > 0.5  # the hardest of two negatives gets most


def test_row_order_and_dtype_do_not_matter() -> None:
    order = list(torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(0)).tolist())
    scores, rewards, ids, lengths, clipped = batch(order, dtype=torch.float32)
    got = separation_stats(
        scores, rewards, ids, lengths, margin=MARGIN, tau=TAU, clipped_scores=clipped
    )
    for key, value in EXPECTED.items():
        assert got[key].item() == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_clip_gap_is_zero_without_clipped_scores() -> None:
    scores, rewards, ids, lengths, _ = batch()
    got = separation_stats(scores, rewards, ids, lengths, margin=MARGIN, tau=TAU)
    assert got[M.GRPO_CLIP_GAP].item() == 0.0
    assert got[M.SEP_GAP].item() == pytest.approx(EXPECTED[M.SEP_GAP])


def test_no_valid_group_gives_nan_but_counts() -> None:
    scores, rewards, ids, lengths, clipped = batch(list(range(8, 12)))  # groups 9 and 1 only
    got = separation_stats(
        scores, rewards, ids, lengths, margin=MARGIN, tau=TAU, clipped_scores=clipped
    )
    for key in M.SEPARATION_KEYS:
        if key.startswith(("sep/", "conspo/p_pos", "conspo/hard", "grpo/")):
            assert math.isnan(got[key].item()), key
    assert got[M.CONSPO_MARGIN].item() == MARGIN
    assert got[M.BATCH_VALID_GROUPS].item() == 0
    assert got[M.BATCH_ALL_POS_GROUPS].item() == 1
    assert got[M.BATCH_ALL_NEG_GROUPS].item() == 1
    assert got[M.BATCH_PASS_RATE].item() == pytest.approx(0.5)
    assert got[M.LEN_POS].item() == pytest.approx(11.0)
    assert got[M.LEN_NEG].item() == pytest.approx(15.0)


def test_stats_do_not_track_gradients() -> None:
    scores, rewards, ids, lengths, _ = batch()
    scores.requires_grad_()
    got = separation_stats(scores, rewards, ids, lengths, margin=MARGIN, tau=TAU)
    assert not any(v.requires_grad for v in got.values())


def test_ties_are_not_ordered() -> None:
    # Exact binary fractions: s⁺ = -0.5 ties a negative, and s⁺ − m = -0.75 ties another.
    scores = torch.tensor([-0.5, -0.5, -0.75, -1.0], dtype=DT)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=DT)
    got = separation_stats(scores, rewards, torch.zeros(4, dtype=torch.long), torch.ones(4),
                           margin=0.25, tau=TAU)  # fmt: skip
    assert got[M.SEP_ORDER_ACC].item() == pytest.approx(2 / 3)  # beats -0.75 and -1.0 only
    assert got[M.SEP_MARGIN_ACC].item() == pytest.approx(1 / 3)  # -0.75 beats -1.0 only
    assert got[M.SEP_GAP_MIN].item() == 0.0


def test_offpolicy_stats_by_hand() -> None:
    """Ratios e^{lp − old} of the response tokens; padding (ratio e^5 here) is never counted."""
    old = torch.zeros(2, 3, dtype=DT)
    ratios = [[1.0, 1.5, 0.7], [0.9, 1.25, 99.0]]
    logprobs = torch.tensor(ratios, dtype=DT).log()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=DT)
    out = offpolicy_stats(logprobs, old, mask, clip_low=0.2, clip_high=0.28)
    assert out[M.OFFPOLICY_RATIO_MEAN].item() == pytest.approx((1 + 1.5 + 0.7 + 0.9 + 1.25) / 5)
    assert out[M.OFFPOLICY_RATIO_MAX].item() == pytest.approx(1.5)
    assert out[M.OFFPOLICY_RATIO_MIN].item() == pytest.approx(0.7)
    assert out[M.OFFPOLICY_CLIP_LOW].item() == pytest.approx(1 / 5)  # 0.7 < 0.8
    assert out[M.OFFPOLICY_CLIP_HIGH].item() == pytest.approx(1 / 5)  # 1.5 > 1.28; 1.25 is not
    # One update per rollout batch (no π_old): every ratio is 1, nothing outside the region.
    on_policy = offpolicy_stats(logprobs, None, mask, clip_low=0.2, clip_high=0.28)
    assert [on_policy[k].item() for k in on_policy] == [1.0, 1.0, 1.0, 0.0, 0.0]
