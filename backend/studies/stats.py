"""The statistics of a study verdict (docs/studies.md): pure functions on per-seed objectives.

Use::

    arms = {"grpo": {0: 0.41, 1: 0.38, 2: 0.44}, "conspo": {0: 0.45, 1: 0.40, 2: 0.47}}
    summary = summarise(arms, baseline="grpo", direction="max", scale=100, unit="points")
    summary.arms["conspo"].ci_t          # (lo, hi): Student t 95% CI of the arm's mean
    summary.pairs["conspo"].p_wilcoxon   # paired by seed against the baseline
    summary.verdict                      # one line per arm, e.g.
    # "conspo − grpo = +2.8 points [+1.0, +4.6], 9 of 10 seeds, paired t p = 0.007 (decides);
    #  Wilcoxon p = 0.020 (robustness check)"

    # Several tasks in one study: values by task, then seed (rliable's robust aggregates).
    by_task = {"arith": {0: 0.41, 1: 0.38}, "countdown": {0: 0.12, 1: 0.20, 2: 0.15}}
    aggregate = across_tasks(by_task)    # IQM over all task × seed runs, stratified bootstrap CIs

Every arm maps seed → objective (one number per finished run). Differences are paired by
seed: d_s = objective(arm, s) − objective(baseline, s) over the seeds both arms finished; the
seeds only one of them finished are named in ``PairedComparison.dropped`` and in the verdict.
``scale`` multiplies values for display only (accuracy 0.028 → 2.8 points); the statistics
(p-values, wins) do not depend on it. Bootstraps are percentile bootstraps of 10,000 resamples
with a fixed seed, so a page shows the same interval on every load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from types import ModuleType

Direction = Literal["max", "min"]
# What runs pair on: a seed, or (task, seed) when a study crosses tasks.
Key = Any
LEVEL = 0.95
N_BOOT = 10_000
BOOT_SEED = 0


def _sps() -> ModuleType:
    """scipy.stats, imported when a statistic is first computed: it is ~0.6 s of imports that
    every server and CLI start paid for before a study page was ever asked for."""
    from scipy import stats

    return stats


POWER = 0.8  # the seeds-needed estimate: 80% power at a two-sided 5% level
Interval = tuple[float, float] | None
Bounds = tuple[float, float] | None  # the range a metric cannot leave (a fraction: (0, 1))
# A statistic is given only where it is defined: a bootstrap of two values has three possible
# means (an interval narrower than the t one beside it), and a share of wins from one or two
# pairs is 0, ½ or 1 — neither says anything yet.
MIN_BOOTSTRAP = 3
MIN_PAIRS_FOR_P_IMPROVEMENT = 3
MAX_DIGITS = 6  # decimals a verdict's number is ever given
# Differences are compared to this many significant digits of the values they are taken
# between (``without_storage_noise``): float32, which metrics are logged in, keeps about 7.
SIGNIFICANT_DIGITS = 6


def t_interval(values: np.ndarray, level: float = LEVEL) -> Interval:
    """Student t CI of the mean; None under two values (no spread to speak of)."""
    n = len(values)
    if n < 2:
        return None
    mean = float(np.mean(values))
    half = float(_sps().t.ppf(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))
    return (mean - half, mean + half)


def bootstrap_means(values: np.ndarray, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> np.ndarray:
    """Means of ``n_boot`` resamples (with replacement, same size) of ``values``."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(n_boot, len(values)))
    return values[picks].mean(axis=1)


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> Interval:
    if len(samples) == 0:
        return None
    lo, hi = np.quantile(samples, [0.5 - level / 2, 0.5 + level / 2])
    return (float(lo), float(hi))


def bootstrap_interval(values: np.ndarray, level: float = LEVEL) -> Interval:
    """Percentile bootstrap CI of the mean; None under ``MIN_BOOTSTRAP`` values."""
    if len(values) < MIN_BOOTSTRAP:
        return None
    return percentile_interval(bootstrap_means(values), level)


def clipped(ci: Interval, bounds: Bounds) -> tuple[Interval, bool]:
    """``ci`` cut to ``bounds`` (a mean of fractions cannot leave [0, 1]), and whether it was."""
    if ci is None or bounds is None:
        return ci, False
    lo, hi = max(ci[0], bounds[0]), min(ci[1], bounds[1])
    return (lo, hi), (lo, hi) != ci


def difference_bounds(bounds: Bounds) -> Bounds:
    """The range of a difference of two values in ``bounds``."""
    return None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])


@dataclass
class ArmSummary:
    """One arm's objective over its finished seeds."""

    name: str
    seeds: list[Key]
    values: list[float]
    n: int
    mean: float | None
    sd: float | None
    ci_t: Interval
    ci_boot: Interval
    ci_clipped: bool = False  # an interval was cut to the metric's range


def summarise_arm(name: str, by_seed: Mapping[Key, float], bounds: Bounds = None) -> ArmSummary:
    seeds = sorted(by_seed)
    values = np.array([by_seed[s] for s in seeds], dtype=float)
    n = len(values)
    ci_t, cut_t = clipped(t_interval(values), bounds)
    ci_boot, cut_boot = clipped(bootstrap_interval(values), bounds)
    return ArmSummary(
        name=name,
        seeds=seeds,
        values=values.tolist(),
        n=n,
        mean=float(values.mean()) if n else None,
        sd=float(values.std(ddof=1)) if n >= 2 else None,
        ci_t=ci_t,
        ci_boot=ci_boot,
        ci_clipped=cut_t or cut_boot,
    )


@dataclass
class PairedComparison:
    """``arm`` − ``baseline``, paired by seed."""

    arm: str
    baseline: str
    seeds: list[Key]  # seeds both finished, ascending
    dropped: list[Key]  # seeds only one of the two finished
    d: list[float]  # arm − baseline per paired seed
    n: int
    mean_d: float | None
    sd_d: float | None
    ci_t: Interval
    ci_boot: Interval
    p_t: float | None  # paired t-test, two-sided
    p_wilcoxon: float | None  # Wilcoxon signed-rank, two-sided (zero differences dropped)
    wins: int  # seeds where the arm is better in the objective's direction
    ties: int
    losses: int
    p_improvement: float | None  # share of seeds the arm wins, a tie counting half (n ≥ 3)
    p_improvement_ci: Interval
    distinguishable: bool  # the t CI excludes 0
    ci_clipped: bool = False  # an interval was cut to the range a difference can take


def paired(
    arm: str,
    baseline: str,
    arm_by_seed: Mapping[Key, float],
    base_by_seed: Mapping[Key, float],
    direction: Direction = "max",
    bounds: Bounds = None,
) -> PairedComparison:
    """``bounds``: the metric's range; the difference's intervals are cut to what it allows."""
    seeds = sorted(set(arm_by_seed) & set(base_by_seed))
    dropped = sorted(set(arm_by_seed) ^ set(base_by_seed))
    values = [v for s in seeds for v in (arm_by_seed[s], base_by_seed[s])]
    d = without_storage_noise(
        np.array([arm_by_seed[s] - base_by_seed[s] for s in seeds], dtype=float), values
    )
    n = len(d)
    better = d if direction == "max" else -d
    wins, ties = int((better > 0).sum()), int((better == 0).sum())
    raw_t = t_interval(d)
    ci_t, cut_t = clipped(raw_t, difference_bounds(bounds))
    ci_boot, cut_boot = clipped(bootstrap_interval(d), difference_bounds(bounds))
    score = np.where(better > 0, 1.0, np.where(better == 0, 0.5, 0.0))
    p_defined = n >= MIN_PAIRS_FOR_P_IMPROVEMENT
    return PairedComparison(
        arm=arm,
        baseline=baseline,
        seeds=seeds,
        dropped=dropped,
        d=d.tolist(),
        n=n,
        mean_d=float(d.mean()) if n else None,
        sd_d=float(d.std(ddof=1)) if n >= 2 else None,
        ci_t=ci_t,
        ci_boot=ci_boot,
        p_t=_p_paired_t(d),
        p_wilcoxon=_p_wilcoxon(d),
        wins=wins,
        ties=ties,
        losses=n - wins - ties,
        p_improvement=float(score.mean()) if p_defined else None,
        p_improvement_ci=bootstrap_interval(score) if p_defined else None,
        distinguishable=raw_t is not None and (raw_t[0] > 0 or raw_t[1] < 0),
        ci_clipped=cut_t or cut_boot,
    )


def without_storage_noise(d: np.ndarray, values: list[float]) -> np.ndarray:
    """``d`` rounded to ``SIGNIFICANT_DIGITS`` of the largest of ``values`` (the numbers the
    differences were taken between). Metrics are logged as float32, which keeps about 7
    significant digits: an accuracy of 0.305 arrives as 0.3050000071, so two differences that
    are equal (−1.00 and +1.00 points) differ in their 9th digit, and a rank test reads that
    noise as an order (the Wilcoxon p of a tie changes). Rounding keeps every difference the
    stored numbers can tell apart and makes equal ones equal, ties and zeros included."""
    largest = max((abs(v) for v in values if v != 0 and math.isfinite(v)), default=0.0)
    if not largest:
        return d
    decimals = SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(largest))
    return np.round(d, decimals) + 0.0  # + 0.0: no −0.0 (a tie, not a loss)


def _p_paired_t(d: np.ndarray) -> float | None:
    if len(d) < 2:
        return None
    if np.std(d, ddof=1) == 0:  # identical differences: t is ±inf (or 0/0 when all are 0)
        return 1.0 if np.all(d == 0) else 0.0
    return float(_sps().ttest_1samp(d, 0.0).pvalue)


def _p_wilcoxon(d: np.ndarray) -> float | None:
    if len(d) < 2 or np.all(d == 0):
        return None
    return float(_sps().wilcoxon(d).pvalue)


def seeds_needed(sd_d: float | None, effect: float, level: float = LEVEL) -> int | None:
    """Seeds a paired comparison needs to detect ``effect`` (same units as ``sd_d``) with
    80% power at a two-sided ``1 − level``: the smallest n ≥ 2 whose paired t test has that
    power (``t_power``). The normal approximation n ≈ ((z_{1−α/2} + z_{0.8}) · sd(d) / δ)² is
    where the search starts: it ignores that t has n − 1 degrees of freedom, so at a few seeds
    it is far too optimistic (3 where the t test needs 5) and a verdict could say "not
    distinguishable at n = 3; about 3 seeds would be needed"."""
    if sd_d is None or effect <= 0:
        return None
    if sd_d == 0:
        return 2  # no spread: two seeds show any difference
    z = _sps().norm.ppf(0.5 + level / 2) + _sps().norm.ppf(POWER)
    n = max(2, math.ceil((z * sd_d / effect) ** 2))
    while t_power(n, effect / sd_d, level) < POWER:
        n += 1
    return n


def t_power(n: int, standardized_effect: float, level: float = LEVEL) -> float:
    """Power of the two-sided paired t test on n pairs when the true mean difference is
    ``standardized_effect`` standard deviations of the differences: the statistic follows a
    noncentral t with n − 1 degrees of freedom and noncentrality effect · √n."""
    sps = _sps()
    critical = sps.t.ppf(0.5 + level / 2, n - 1)
    shift = standardized_effect * math.sqrt(n)
    return float(sps.nct.sf(critical, n - 1, shift) + sps.nct.cdf(-critical, n - 1, shift))


def _key_text(key: Key) -> str:
    return f"{key[0]}/s{key[1]}" if isinstance(key, tuple) else str(key)


def _signed(x: float, digits: int = 1) -> str:
    """``x`` with its sign to ``digits`` decimals, or more where fewer would print a value that
    is not zero as ±0.0: a lower bound of 0.011 reads +0.01, never +0.0 (which would say the
    interval touches zero when it excludes it)."""
    if x != 0 and round(abs(x), digits) == 0:
        digits = min(MAX_DIGITS, -math.floor(math.log10(abs(x))))
    text = f"{x:+.{digits}f}"
    return text.replace("-", "−")


def _digits(*values: float | None) -> int:
    """Decimals that show the largest of ``values`` to two significant digits (a difference of
    0.020 in a fraction reads +0.020, not +0.0; one of 2.4 points reads +2.4)."""
    largest = max((abs(v) for v in values if v is not None and v != 0), default=1.0)
    return max(1, min(MAX_DIGITS, 1 - math.floor(math.log10(largest))))


def _p(p: float | None) -> str:
    if p is None:
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def wilcoxon_floor(d: list[float]) -> float | None:
    """The smallest two-sided p the exact Wilcoxon signed-rank test can give on ``d`` (zero
    differences dropped): every rank on one side, 2 / 2ⁿ. Under 6 pairs it is above 0.05, so the
    test cannot call any difference significant, however large."""
    n = _nonzero(d)
    return 2.0 / 2**n if n else None


def tests_text(pair: PairedComparison) -> str:
    """Which test the verdict rests on, and the robustness check beside it: "paired t p = 0.049
    (decides); Wilcoxon p = 0.125 (robustness check: the smallest p 4 pairs can give it)".
    The paired t test decides (its 95% interval is the one the verdict gives); the Wilcoxon
    signed-rank test, which assumes no normality, is shown so a reader sees whether a verdict
    leans on that assumption."""
    text = f"paired t {_p(pair.p_t)} (decides)"
    if pair.p_wilcoxon is None:
        return text
    floor = wilcoxon_floor(pair.d)
    at_floor = floor is not None and floor > 1 - LEVEL and math.isclose(pair.p_wilcoxon, floor)
    limit = f": the smallest p {_nonzero(pair.d)} pairs can give it" if at_floor else ""
    return f"{text}; Wilcoxon {_p(pair.p_wilcoxon)} (robustness check{limit})"


def _nonzero(d: list[float]) -> int:
    return sum(1 for v in d if v != 0)


def effect_text(effect: float, unit: str) -> str:
    """The effect a seeds-needed estimate is for, with its unit: "an effect of 1 point", "an
    effect of 0.5 log-prob / token"; a bare number only where the objective has no unit."""
    if not unit:
        return f"an effect of {effect:g} (in the metric's own units)"
    one_word = unit.isalpha() and len(unit) > 2 and unit.endswith("s")
    return f"an effect of {effect:g} {unit[:-1] if one_word and effect == 1 else unit}"


def verdict_line(
    pair: PairedComparison,
    *,
    scale: float = 1.0,
    unit: str = "",
    effect: float = 1.0,
    digits: int | None = None,
) -> str:
    """The one line a study page leads with, for ``pair.arm`` against its baseline (to
    ``digits`` decimals; by default as many as its numbers need).

    ``effect`` is the smallest difference worth detecting, in display units (after ``scale``):
    a study that cannot tell the arms apart says how many seeds would tell that much.
    """
    unit_text = f" {unit}" if unit else ""
    head = f"{pair.arm} − {pair.baseline}"
    tasks = any(isinstance(k, tuple) for k in pair.seeds + pair.dropped)
    seeds = "(task, seed) pairs" if tasks else "seeds"
    dropped = (
        f" ({'runs' if tasks else 'seed' + ('s' if len(pair.dropped) > 1 else '')} "
        f"{', '.join(map(_key_text, pair.dropped))} dropped: not finished by both arms)"
        if pair.dropped
        else ""
    )
    if pair.mean_d is None:
        return f"{head}: no seed finished by both arms yet{dropped}"
    if digits is None:
        digits = _digits(pair.mean_d * scale, *(v * scale for v in pair.ci_t or ()))
    mean = _signed(pair.mean_d * scale, digits)
    if pair.n >= 2 and pair.sd_d == 0 and pair.mean_d == 0:
        return f"{head} = {mean}{unit_text}: identical on all {pair.n} seeds{dropped}"
    if pair.ci_t is None:
        return f"{head} = {mean}{unit_text} at n = {pair.n}: too few seeds for an interval{dropped}"
    lo, hi = (_signed(v * scale, digits) for v in pair.ci_t)
    stated = f"{head} = {mean}{unit_text} [{lo}, {hi}]"
    if pair.distinguishable:
        return f"{stated}, {pair.wins} of {pair.n} {seeds}, {tests_text(pair)}{dropped}"
    return (
        f"{stated}: not distinguishable from seed noise at n = {pair.n}, {tests_text(pair)}"
        f"{power_text(pair, scale, effect, unit)}{dropped}"
    )


def power_text(pair: PairedComparison, scale: float, effect: float, unit: str) -> str:
    """What the seeds say about ``effect`` when the arms could not be told apart: how many
    seeds would detect it, or, when the study already has that many, that it would have
    been detected (so a difference, if any, is smaller): never "about 3 seeds would be
    needed" at n = 3."""
    need = seeds_needed(None if pair.sd_d is None else pair.sd_d * scale, effect)
    if need is None:
        return ""
    what = effect_text(effect, unit)
    if need > pair.n:
        return f"; about {need} seeds would be needed to detect {what}"
    return (
        f"; {pair.n} seeds are enough to detect {what} ({POWER:.0%} power), so a difference,"
        " if any, is likely smaller"
    )


def iqm(values: np.ndarray) -> float:
    """Interquartile mean: the mean of the middle half, ⌊n/4⌋ values cut from each end (as
    ``scipy.stats.trim_mean(values, 0.25)`` and rliable's IQM). Robust to one wild run, less
    noisy than the median."""
    return float(_sps().trim_mean(values, 0.25))


def _iqm_rows(values: np.ndarray) -> np.ndarray:
    return np.asarray(_sps().trim_mean(values, 0.25, axis=-1))


def _mean_rows(values: np.ndarray) -> np.ndarray:
    return np.asarray(values.mean(axis=-1))


def stratified_bootstrap(
    by_task: Mapping[str, Mapping[int, float]],
    statistic: Callable[[np.ndarray], np.ndarray],
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
    level: float = LEVEL,
) -> Interval:
    """Percentile CI of ``statistic`` over all task × seed values, seeds resampled **within**
    each task (each resample keeps every task's number of runs: a task with more seeds never
    crowds another out, and the spread between tasks is not mistaken for seed noise).
    ``statistic`` maps resamples (n_boot, runs) to one value per row. None while no task has
    two seeds (nothing to resample)."""
    strata = [np.array(list(v.values()), dtype=float) for v in by_task.values() if v]
    if not strata or max(len(s) for s in strata) < 2:
        return None
    rng = np.random.default_rng(seed)
    picks = [s[rng.integers(0, len(s), size=(n_boot, len(s)))] for s in strata]
    resamples = np.concatenate(picks, axis=1)  # (n_boot, all runs)
    return percentile_interval(statistic(resamples), level)


@dataclass
class TaskAggregate:
    """One arm over several tasks: every task × seed run pooled."""

    tasks: dict[str, int]  # runs per task
    n: int
    mean: float | None
    ci_mean: Interval  # stratified bootstrap
    iqm: float | None
    ci_iqm: Interval  # stratified bootstrap


def across_tasks(by_task: Mapping[str, Mapping[int, float]]) -> TaskAggregate:
    values = np.array([v for runs in by_task.values() for v in runs.values()], dtype=float)
    n = len(values)
    return TaskAggregate(
        tasks={task: len(runs) for task, runs in by_task.items()},
        n=n,
        mean=float(values.mean()) if n else None,
        ci_mean=stratified_bootstrap(by_task, _mean_rows),
        iqm=iqm(values) if n else None,
        ci_iqm=stratified_bootstrap(by_task, _iqm_rows),
    )


def paired_across_tasks(
    arm_by_task: Mapping[str, Mapping[int, float]],
    base_by_task: Mapping[str, Mapping[int, float]],
) -> TaskAggregate:
    """The differences d = arm − baseline paired by (task, seed), aggregated as ``across_tasks``
    (the mean of d with its stratified bootstrap CI; the IQM of d beside it)."""
    d = {
        task: {s: runs[s] - base_by_task[task][s] for s in runs if s in base_by_task.get(task, {})}
        for task, runs in arm_by_task.items()
    }
    return across_tasks({task: v for task, v in d.items() if v})


@dataclass
class UnpairedComparison:
    """``arm`` − ``baseline`` when the runs cannot be paired (their seeds differ): the difference
    of the means with a Welch t interval and p-value."""

    arm: str
    baseline: str
    n_arm: int
    n_baseline: int
    mean_d: float | None
    ci_t: Interval
    p_t: float | None
    distinguishable: bool
    ci_clipped: bool = False


def unpaired(
    arm: str,
    baseline: str,
    arm_values: list[float],
    base_values: list[float],
    bounds: Bounds = None,
) -> UnpairedComparison:
    a, b = np.array(arm_values, dtype=float), np.array(base_values, dtype=float)
    mean_d = float(a.mean() - b.mean()) if len(a) and len(b) else None
    ci: Interval = None
    p: float | None = None
    if len(a) >= 2 and len(b) >= 2:
        qa, qb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        if qa + qb > 0:
            df = (qa + qb) ** 2 / (qa**2 / (len(a) - 1) + qb**2 / (len(b) - 1))
            half = float(_sps().t.ppf(0.5 + LEVEL / 2, df) * math.sqrt(qa + qb))
            assert mean_d is not None
            ci = (mean_d - half, mean_d + half)
            p = float(_sps().ttest_ind(a, b, equal_var=False).pvalue)
    shown, cut = clipped(ci, difference_bounds(bounds))
    return UnpairedComparison(
        arm=arm,
        baseline=baseline,
        n_arm=len(a),
        n_baseline=len(b),
        mean_d=mean_d,
        ci_t=shown,
        p_t=p,
        distinguishable=ci is not None and (ci[0] > 0 or ci[1] < 0),
        ci_clipped=cut,
    )


def unpaired_line(
    pair: UnpairedComparison, *, scale: float = 1.0, unit: str = "", digits: int | None = None
) -> str:
    """The verdict line of an unpaired comparison; it says it is unpaired."""
    unit_text = f" {unit}" if unit else ""
    head = f"{pair.arm} − {pair.baseline}"
    ns = f"n = {pair.n_arm} and {pair.n_baseline}"
    if pair.mean_d is None:
        return f"{head}: no value in one of the two groups yet"
    if digits is None:
        digits = _digits(pair.mean_d * scale, *(v * scale for v in pair.ci_t or ()))
    mean = _signed(pair.mean_d * scale, digits)
    if pair.ci_t is None:
        return f"{head} = {mean}{unit_text} at {ns}, unpaired: too few runs for an interval"
    lo, hi = (_signed(v * scale, digits) for v in pair.ci_t)
    stated = f"{head} = {mean}{unit_text} [{lo}, {hi}], unpaired (Welch, seeds differ), {ns}"
    if pair.distinguishable:
        return f"{stated}, {_p(pair.p_t)}"
    return f"{stated}: not distinguishable from seed noise, {_p(pair.p_t)}"


@dataclass
class StudySummary:
    arms: dict[str, ArmSummary]
    pairs: dict[str, PairedComparison]  # by arm, every arm but the baseline
    verdict: list[str] = field(default_factory=list)


def summarise(
    arms: Mapping[str, Mapping[Key, float]],
    baseline: str,
    *,
    direction: Direction = "max",
    scale: float = 1.0,
    unit: str = "",
    effect: float = 1.0,
    bounds: Bounds = None,
) -> StudySummary:
    """Every arm summarised, every other arm paired against ``baseline``, and the verdict;
    intervals cut to the metric's ``bounds`` where it has them."""
    out = StudySummary(
        arms={name: summarise_arm(name, by_seed, bounds) for name, by_seed in arms.items()},
        pairs={},
    )
    for name, by_seed in arms.items():
        if name == baseline:
            continue
        pair = paired(name, baseline, by_seed, arms.get(baseline, {}), direction, bounds)
        out.pairs[name] = pair
        out.verdict.append(verdict_line(pair, scale=scale, unit=unit, effect=effect))
    return out
