"""The verdict's statistics against hand-computed values, with scipy as the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from backend.studies import stats

BASE = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0, 4: 50.0}
ARM = {0: 11.0, 1: 22.0, 2: 33.0, 3: 44.0, 4: 55.0}  # d = 1, 2, 3, 4, 5


def test_arm_mean_and_t_interval_by_hand() -> None:
    arm = stats.summarise_arm("a", {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0})
    # mean 3, sd sqrt(2.5), t_{0.975, 4} = 2.776445 → half-width 2.776445 · sqrt(2.5)/sqrt(5)
    assert (arm.n, arm.mean, arm.sd) == (5, 3.0, pytest.approx(math.sqrt(2.5)))
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert arm.ci_t == pytest.approx((3 - half, 3 + half), abs=1e-5)
    lo, hi = arm.ci_boot  # the bootstrap is narrower than t at n = 5, and inside the data range
    assert 1.0 <= lo < 3.0 < hi <= 5.0 and hi - lo < 2 * half


def test_bootstrap_is_seeded_and_matches_a_direct_resample() -> None:
    values = np.array([0.3, 0.1, 0.4, 0.15, 0.9, 0.26])
    first = stats.bootstrap_interval(values)
    assert first == stats.bootstrap_interval(values)  # same page, same interval
    rng = np.random.default_rng(stats.BOOT_SEED)
    means = values[rng.integers(0, 6, size=(stats.N_BOOT, 6))].mean(axis=1)
    assert first == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))


def test_paired_difference_by_hand_and_against_scipy() -> None:
    pair = stats.paired("conspo", "grpo", ARM, BASE)
    assert pair.d == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert (pair.mean_d, pair.n, pair.dropped) == (3.0, 5, [])
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert pair.ci_t == pytest.approx((3 - half, 3 + half), abs=1e-5)
    # t = 3 / (sqrt(2.5)/sqrt(5)) = 4.2426 on 4 df
    assert pair.p_t == pytest.approx(2 * sps.t.sf(3 / math.sqrt(0.5), 4))
    assert pair.p_t == pytest.approx(sps.ttest_rel(list(ARM.values()), list(BASE.values())).pvalue)
    assert pair.p_wilcoxon == pytest.approx(2 / 32)  # exact: all 5 ranks positive, two-sided
    assert (pair.wins, pair.ties, pair.losses) == (5, 0, 0)
    assert pair.p_improvement == 1.0 and pair.distinguishable


def test_pairing_is_by_seed_not_by_position() -> None:
    # the same values listed in another order pair the same way
    shuffled = {s: ARM[s] for s in (3, 0, 4, 1, 2)}
    assert stats.paired("a", "b", shuffled, BASE).d == [1.0, 2.0, 3.0, 4.0, 5.0]
    # unpaired means would call these equal; by seed the arm wins every seed by 1
    base = {0: 1.0, 1: 5.0, 2: 9.0}
    arm = {0: 2.0, 1: 6.0, 2: 10.0}
    assert stats.paired("a", "b", arm, base).p_t == 0.0  # identical differences


def test_a_seed_missing_from_one_arm_is_dropped_and_named() -> None:
    arm = {s: v for s, v in ARM.items() if s != 2} | {7: 99.0}  # seed 2 unfinished, 7 extra
    pair = stats.paired("conspo", "grpo", arm, BASE)
    assert pair.seeds == [0, 1, 3, 4] and pair.dropped == [2, 7]
    assert pair.d == [1.0, 2.0, 4.0, 5.0]
    line = stats.verdict_line(pair)
    assert "seeds 2, 7 dropped: not finished by both arms" in line
    summary = stats.summarise({"grpo": BASE, "conspo": arm}, "grpo")
    assert summary.arms["conspo"].n == 5 and summary.pairs["conspo"].n == 4


def test_minimising_objective_counts_lower_as_a_win() -> None:
    pair = stats.paired("a", "b", {0: 1.0, 1: 2.0, 2: 2.0}, {0: 2.0, 1: 3.0, 2: 2.0}, "min")
    assert (pair.wins, pair.ties, pair.losses) == (2, 1, 0)
    assert pair.p_improvement == pytest.approx((1 + 1 + 0.5) / 3)


def test_seeds_needed_is_the_paired_t_tests_own_sample_size() -> None:
    """80% power at a two-sided 5% level, as G*Power's paired t test gives it: 34 pairs for an
    effect of 0.5 sd, 15 for 0.8 sd, 199 for 0.2 sd (the normal approximation says 32, 13 and
    197: it leaves out the t distribution's heavier tails)."""
    assert stats.seeds_needed(2.0, 1.0) == 34
    assert stats.seeds_needed(1.25, 1.0) == 15
    assert stats.seeds_needed(5.0, 1.0) == 199
    n = stats.seeds_needed(math.sqrt(2.5), 1.0)
    assert n is not None
    assert stats.t_power(n - 1, 1 / math.sqrt(2.5)) < 0.8 <= stats.t_power(n, 1 / math.sqrt(2.5))
    assert stats.seeds_needed(0.01, 1.0) == 2 and stats.seeds_needed(None, 1.0) is None
    assert stats.seeds_needed(0.0, 1.0) == 2


def test_t_power_against_a_simulation() -> None:
    """The noncentral t power against the share of simulated studies the t test calls."""
    rng = np.random.default_rng(0)
    n, effect = 5, 1.5  # in sd of the differences
    d = rng.normal(effect, 1.0, size=(20_000, n))
    p = sps.ttest_1samp(d, 0.0, axis=1).pvalue
    assert stats.t_power(n, effect) == pytest.approx(float((p < 0.05).mean()), abs=0.01)


def test_a_verdict_never_asks_for_fewer_seeds_than_it_has() -> None:
    """Issue 49: at n = 3 a verdict read "not distinguishable … about 3 seeds would be needed
    to detect an effect of 1 point": the normal approximation's 3 for differences of sd 0.55
    points, where the t test on 3 pairs has 35% power; it needs 5."""
    base = {0: 0.5, 1: 0.5, 2: 0.5}
    pair = stats.paired("a", "b", {0: 0.4975, 1: 0.503, 2: 0.5085}, base)  # d: 0.3 ± 0.55 pts
    line = stats.verdict_line(pair, scale=100, unit="points")
    assert "not distinguishable from seed noise at n = 3" in line
    assert line.endswith("about 5 seeds would be needed to detect an effect of 1 point"), line
    # Differences so steady that 3 seeds would show 1 point: the line says so instead.
    steady = stats.paired("a", "b", {0: 0.1005, 1: 0.101, 2: 0.1015}, {0: 0.1, 1: 0.1, 2: 0.1})
    line = stats.verdict_line(steady, scale=100, unit="points")
    assert "not distinguishable" in line and "would be needed" not in line, line
    assert line.endswith(
        "; 3 seeds are enough to detect an effect of 1 point (80% power), so a difference,"
        " if any, is likely smaller"
    ), line
    # And over many small studies: a seeds-needed figure is always more than the seeds it has.
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(2, 8))
        d = rng.normal(rng.uniform(-0.01, 0.01), rng.uniform(0.0005, 0.03), size=n)
        noisy = stats.paired(
            "a", "b", {s: 0.5 + v for s, v in enumerate(d)}, dict.fromkeys(range(n), 0.5)
        )
        text = stats.verdict_line(noisy, scale=100, unit="points")
        if "seeds would be needed" in text:
            need = int(text.split("; about ")[1].split(" ")[0])
            assert need > n, text


def test_wilcoxon_reads_an_exact_tie_through_float32_storage() -> None:
    """Issue 49: the README study's ConSPO linear − GRPO differences are −1.00, −2.50, +4.75,
    +3.00, +1.00 points; the accuracies were logged as float32 (0.305 arrives as
    0.3050000071), which made |−1.00| and |+1.00| unequal, so the Wilcoxon p was 0.625 (no
    tie) where the tie gives 0.500. Differences are compared at 6 significant digits."""

    def logged(*accuracies: float) -> float:  # mean of the last evals, as float32 arrives
        return float(np.mean([float(np.float32(a)) for a in accuracies]))

    grpo = {0: (0.375, 0.43), 1: (0.41, 0.335), 2: (0.36, 0.31), 3: (0.27, 0.245), 4: (0.35, 0.28)}
    linear = {
        0: (0.305, 0.48),
        1: (0.355, 0.34),
        2: (0.405, 0.36),
        3: (0.29, 0.285),
        4: (0.355, 0.295),
    }
    base = {s: logged(*v) for s, v in grpo.items()}
    arm = {s: logged(*v) for s, v in linear.items()}
    assert abs(arm[0] - base[0]) != abs(arm[4] - base[4])  # the noise the test is about
    pair = stats.paired("conspo-linear", "grpo", arm, base)
    assert pair.d == pytest.approx([-0.01, -0.025, 0.0475, 0.03, 0.01], abs=0)
    exact = [-0.01, -0.025, 0.0475, 0.03, 0.01]
    assert pair.p_wilcoxon == sps.wilcoxon(exact).pvalue == 0.5
    # a difference that is float32 noise alone is a tie, not a win
    tie = stats.paired("a", "b", {0: logged(0.3, 0.6)}, {0: logged(0.45, 0.45)})
    assert (tie.d, tie.wins, tie.ties) == ([0.0], 0, 1)


def test_verdict_lines() -> None:
    pair = stats.paired("conspo", "grpo", ARM, BASE)
    assert stats.verdict_line(pair, unit="points") == (
        "conspo − grpo = +3.0 points [+1.0, +5.0], 5 of 5 seeds, paired t p = 0.013 (decides);"
        " Wilcoxon p = 0.062 (robustness check: the smallest p 5 pairs can give it)"
    )
    noisy = stats.paired("conspo", "grpo", {0: 0.012, 1: -0.01, 2: 0.03}, {0: 0, 1: 0, 2: 0})
    line = stats.verdict_line(noisy, scale=100, unit="points", effect=1.0)
    need = stats.seeds_needed(noisy.sd_d * 100, 1.0)
    assert line == (
        f"conspo − grpo = +1.1 points [−3.9, +6.0]: not distinguishable from seed noise at n = 3, "
        f"paired t p = {noisy.p_t:.3f} (decides); Wilcoxon p = {noisy.p_wilcoxon:.3f} (robustness"
        f" check); about {need} seeds would be needed to detect an effect of 1 point"
    )
    one = stats.paired("a", "b", {0: 1.0}, {0: 0.0, 1: 0.0})
    assert "too few seeds" in stats.verdict_line(one) and "seed 1 dropped" in stats.verdict_line(
        one
    )
    same = stats.paired("a", "b", {0: 0.5, 1: 0.2}, {0: 0.5, 1: 0.2})
    assert stats.verdict_line(same) == "a − b = +0.0: identical on all 2 seeds"
    assert "no seed finished" in stats.verdict_line(stats.paired("a", "b", {}, {0: 1.0}))


# ---- several tasks: stratified bootstrap and IQM (rliable's aggregates) -------------------------


def test_iqm_by_hand_and_against_scipy() -> None:
    values = np.array([1.0, 2.0, 3.0, 4.0, 10.0, 20.0])  # ⌊6/4⌋ = 1 cut from each end
    assert stats.iqm(values) == pytest.approx((2 + 3 + 4 + 10) / 4)
    assert stats.iqm(values) == pytest.approx(sps.trim_mean(values, 0.25))
    eight = np.arange(8.0)  # 2 cut from each end: mean of 2, 3, 4, 5
    assert stats.iqm(eight) == pytest.approx(3.5)


def test_stratified_bootstrap_resamples_seeds_within_each_task() -> None:
    # Task a's seeds are 0 and 1, task b's one seed is 5. Within-task resamples of a have sums
    # 0, 1, 1, 2 (probability 1/4, 1/2, 1/4), so the pooled mean is (sum + 5) / 3 ∈ {5/3, 2, 7/3}:
    # the 95% interval is exactly [5/3, 7/3]. An unstratified resample could draw b's 5 three
    # times (mean 5) or never (mean 0).
    by_task = {"a": {0: 0.0, 1: 1.0}, "b": {0: 5.0}}
    agg = stats.across_tasks(by_task)
    assert (agg.n, agg.tasks, agg.mean) == (3, {"a": 2, "b": 1}, pytest.approx(2.0))
    assert agg.ci_mean == pytest.approx((5 / 3, 7 / 3))
    # every task's count kept: task a all 0, task b all 1 → every resample's mean is 2/6
    fixed = stats.across_tasks({"a": {s: 0.0 for s in range(4)}, "b": {0: 1.0, 1: 1.0}})
    assert fixed.ci_mean == pytest.approx((1 / 3, 1 / 3))
    assert fixed.iqm == pytest.approx(sps.trim_mean([0, 0, 0, 0, 1, 1], 0.25))  # (0+0+0+1)/4
    assert fixed.ci_iqm == pytest.approx((0.25, 0.25))
    assert stats.across_tasks({"a": {0: 1.0}, "b": {0: 2.0}}).ci_mean is None  # one seed each


def test_paired_across_tasks_pairs_by_task_and_seed() -> None:
    arm = {"a": {0: 1.0, 1: 3.0, 2: 9.0}, "b": {0: 10.0, 1: 10.0}}
    base = {"a": {0: 0.0, 1: 1.0}, "b": {0: 7.0, 1: 9.0}}  # seed 2 of task a unpaired: dropped
    agg = stats.paired_across_tasks(arm, base)
    assert agg.tasks == {"a": 2, "b": 2}
    assert agg.mean == pytest.approx((1 + 2 + 3 + 1) / 4)
    assert agg.iqm == pytest.approx((1 + 2) / 2)  # sorted d 1, 1, 2, 3: the middle two
    lo, hi = agg.ci_mean
    assert 1.0 <= lo <= agg.mean <= hi <= 2.5


def test_statistics_are_given_only_where_defined() -> None:
    """Issue 26 item 3: no bootstrap interval from two seeds (its three possible means make it
    narrower than the t interval beside it), no P(improvement) from fewer than three pairs."""
    two = stats.summarise_arm("a", {0: 0.69, 1: 0.706})
    assert two.ci_t is not None and two.ci_boot is None
    assert stats.summarise_arm("a", {0: 0.69, 1: 0.706, 2: 0.7}).ci_boot is not None
    one_pair = stats.paired("b", "a", {0: 0.8}, {0: 0.7})
    assert one_pair.p_improvement is None and one_pair.p_improvement_ci is None
    three = stats.paired("b", "a", {0: 0.8, 1: 0.7, 2: 0.75}, {0: 0.7, 1: 0.72, 2: 0.7})
    assert three.p_improvement == pytest.approx(2 / 3)


def test_intervals_of_a_fraction_stay_in_its_range_and_say_so() -> None:
    arm = stats.summarise_arm("a", {0: 0.98, 1: 0.9, 2: 1.0}, bounds=(0.0, 1.0))
    assert arm.ci_t is not None and arm.ci_t[1] == 1.0 and arm.ci_clipped
    assert not stats.summarise_arm("a", {0: 0.5, 1: 0.52, 2: 0.51}, bounds=(0.0, 1.0)).ci_clipped
    pair = stats.paired("b", "a", {0: 1.0, 1: 0.0}, {0: 0.0, 1: 0.0}, bounds=(0.0, 1.0))
    assert pair.ci_t is not None and pair.ci_t[0] >= -1.0 and pair.ci_t[1] <= 1.0
    assert pair.ci_clipped


def test_the_verdict_shows_a_small_difference_in_enough_digits() -> None:
    """Issue 26 item 4: a difference of 0.020 in a fraction read "+0.0"."""
    pair = stats.paired("conspo", "grpo", {0: 0.72, 1: 0.71, 2: 0.73}, {0: 0.7, 1: 0.69, 2: 0.71})
    line = stats.verdict_line(pair)
    assert line.startswith("conspo − grpo = +0.020 ["), line
    points = stats.paired("b", "a", {0: 72.0, 1: 71.0, 2: 73.5}, {0: 70.0, 1: 69.0, 2: 71.0})
    assert stats.verdict_line(points).startswith("b − a = +2.2 ["), stats.verdict_line(points)


# ---- the verdict's wording (issue: units, rounding, which test decides) -------------------------

# Four seeds whose differences (in accuracy) have mean 0.016 and a 95% t interval whose lower
# bound is 0.0010: +1.6 points [+0.1, +3.1] at one decimal, as the issue's +0.0 was at one.
NEAR_ZERO = {0: 0.0065, 1: 0.0095, 2: 0.0225, 3: 0.0255}


def test_a_bound_that_is_not_zero_never_prints_as_zero() -> None:
    base = {s: 0.5 for s in NEAR_ZERO}
    lower_near_zero = {s: 0.5 + d - 0.00094 for s, d in NEAR_ZERO.items()}  # lower bound 0.0001
    pair = stats.paired("conspo", "grpo", lower_near_zero, base)
    assert pair.ci_t is not None and 0 < pair.ci_t[0] * 100 < 0.05
    line = stats.verdict_line(pair, scale=100, unit="points")
    lower = line.split("[")[1].split(",")[0]
    assert lower not in ("+0.0", "−0.0") and float(lower.replace("−", "-")) > 0, line
    assert line.startswith("conspo − grpo = +1.5 points [+0.01, +3.0]"), line
    # the same to a negative bound: −0.004 is not −0.0
    assert stats._signed(-0.004, 1) == "−0.004" and stats._signed(0.0, 1) == "+0.0"


def test_the_verdict_names_the_test_that_decides_and_the_robustness_check() -> None:
    base = {s: 0.5 for s in NEAR_ZERO}
    pair = stats.paired("conspo", "grpo", {s: 0.5 + d for s, d in NEAR_ZERO.items()}, base)
    assert pair.p_t is not None and pair.p_t < 0.05 and pair.p_wilcoxon == pytest.approx(0.125)
    line = stats.verdict_line(pair, scale=100, unit="points")
    assert f"paired t p = {pair.p_t:.3f} (decides)" in line, line
    assert "Wilcoxon p = 0.125 (robustness check: the smallest p 4 pairs can give it)" in line
    assert stats.wilcoxon_floor(pair.d) == pytest.approx(0.125)


def test_the_seeds_needed_sentence_names_the_effect_with_its_unit() -> None:
    noisy = stats.paired("a", "b", {0: 0.012, 1: -0.01, 2: 0.03}, {0: 0, 1: 0, 2: 0})
    points = stats.verdict_line(noisy, scale=100, unit="points", effect=2.0)
    assert points.endswith("seeds would be needed to detect an effect of 2 points"), points
    # unscaled, these differences (sd 0.02) are far below the effect: enough seeds for it
    logprob = stats.verdict_line(noisy, unit="log-prob / token", effect=0.5)
    assert "to detect an effect of 0.5 log-prob / token (80% power)" in logprob, logprob
    bare = stats.verdict_line(noisy, effect=1.0)
    assert "a 1 effect" not in bare and "an effect of 1 (in the metric's own units)" in bare


def test_an_objective_carries_its_metrics_unit() -> None:
    """A verdict on sep/gap reads in log-prob / token, one on a pass rate in points (× 100), as
    an accuracy does: no objective of a catalogued metric is left without a unit."""
    from backend.studies.spec import Objective
    from conspo import metrics as M

    gap = Objective(metric="sep/gap")
    assert (gap.scale, gap.unit) == (1.0, M.metric("sep/gap").unit) and gap.unit
    assert (
        Objective(metric="batch/pass_rate").scale,
        Objective(metric="batch/pass_rate").unit,
    ) == (
        100.0,
        "points",
    )
    assert Objective(metric="eval/accuracy").unit == "points"
    assert Objective(metric="sep/gap", unit="nats").unit == "nats"  # a unit given is kept
    assert Objective(metric="not/in_catalogue").unit == ""
