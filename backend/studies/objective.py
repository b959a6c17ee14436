"""A run's objective and the grouped curves, read from its stored series: what a study's
verdict, a search's trials and a comparison of runs all compute the same way.

* ``reduce_series``: one number from a run's series (``last``, ``mean_last_k``, ``auc``);
  ``window_start`` the first step of that window; ``run_objective`` the objective and the mean
  of each separation statistic over the same window.
* ``group_curves``: per key and arm, the mean over seeds at each step with a 95% t band.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session

from backend.storage.series import WholeSeries as Series
from backend.storage.series import whole_series
from backend.studies import stats
from backend.studies.spec import Objective
from conspo import metrics as M

CURVE_POINTS = 400  # steps per curve at most (a longer run is sampled evenly: said on the chart)


def reduce_series(
    steps: Sequence[int], values: Sequence[float | None], how: str, k: int
) -> float | None:
    """One number from a run's series (NULL points skipped): ``last``, ``mean_last_k``, ``auc``
    (the trapezoid area divided by the step span: the curve's mean height)."""
    pts = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None and math.isfinite(v)]
    if not pts:
        return None
    if how == "last":
        return pts[-1][1]
    if how == "mean_last_k":
        return float(np.mean([v for _, v in pts[-k:]]))
    if len(pts) == 1:
        return pts[0][1]
    xs, ys = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    return float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(xs)) / (xs[-1] - xs[0]))


def window_start(steps: Sequence[int], how: str, k: int) -> int:
    """The first step of the objective's window (separation statistics use the same window)."""
    if not steps:
        return 0
    if how == "last":
        return steps[-1]
    if how == "mean_last_k":
        return steps[-k:][0]
    return steps[0]


SEPARATION_KEYS = (M.SEP_GAP, M.SEP_ORDER_ACC, M.SEP_MARGIN_ACC)


def run_objective(
    series: Series, run_id: int, objective: Objective
) -> tuple[float | None, dict[str, float]]:
    """A run's objective and, over the same window, the mean of each separation statistic."""
    steps, values = series[(run_id, objective.metric)]
    value = reduce_series(steps, values, objective.reduce, objective.k)
    out: dict[str, float] = {}
    if value is None:
        return None, out
    start = window_start(steps, objective.reduce, objective.k)
    for key in SEPARATION_KEYS:
        s_steps, s_values = series[(run_id, key)]
        window = [
            v
            for s, v in zip(s_steps, s_values, strict=True)
            if s >= start and v is not None and math.isfinite(v)
        ]
        if window:
            out[key] = float(np.mean(window))
    return value, out


@dataclass
class ArmRunRow:
    arm: str
    run_id: int | None


class ArmRun(Protocol):
    """What the grouped curves need of a row: its arm and its run (a StudyRun, or a compared
    run in ``backend.studies.comparison``)."""

    @property
    def arm(self) -> str: ...
    @property
    def run_id(self) -> int | None: ...


def group_curves(
    session: Session, rows: Sequence[ArmRun], runs: Iterable[int], keys: list[str]
) -> dict[str, Any]:
    """Per key and arm: the mean over seeds at each step, a 95% t band (cut to the key's range:
    a band of fractions never leaves [0, 1]), and n, the seeds that reached that step (the page
    cuts the solid line where n is short of the arm's seeds)."""
    series = whole_series(session, runs, keys)
    out: dict[str, Any] = {}
    arms = list(dict.fromkeys(r.arm for r in rows))
    for key in keys:
        per_arm = {}
        for arm in arms:
            ids = [r.run_id for r in rows if r.arm == arm and r.run_id is not None]
            per_step: dict[int, list[float]] = defaultdict(list)
            for run_id in ids:
                for step, value in zip(*series[(run_id, key)], strict=True):
                    if value is not None and math.isfinite(value):
                        per_step[step].append(value)
            steps = sorted(per_step)
            sampled = len(steps) > CURVE_POINTS
            if sampled:
                steps = [steps[i] for i in np.linspace(0, len(steps) - 1, CURVE_POINTS).astype(int)]
            mean, lo, hi, n = [], [], [], []
            for step in steps:
                values = np.array(per_step[step])
                ci, _ = stats.clipped(stats.t_interval(values), M.bounds(key))
                mean.append(float(values.mean()))
                lo.append(ci[0] if ci else None)
                hi.append(ci[1] if ci else None)
                n.append(len(values))
            per_arm[arm] = {
                "steps": steps,
                "mean": mean,
                "lo": lo,
                "hi": hi,
                "n": n,
                "seeds": len([r for r in rows if r.arm == arm]),
                "sampled": sampled,
            }
        out[key] = per_arm
    return out


@dataclass
class ArmObjectives:
    """Per arm, each run's objective and its separation means over the same window, keyed by
    what pairs runs across arms (a seed, a (task, seed), or a position)."""

    by_arm: dict[str, dict[stats.Key, float]]
    separation: dict[str, dict[str, dict[stats.Key, float]]]

    @classmethod
    def of(cls, arms: Iterable[str]) -> ArmObjectives:
        names = list(arms)
        return cls({a: {} for a in names}, {a: defaultdict(dict) for a in names})

    def add(
        self, series: Series, arm: str, key: stats.Key, run_id: int, objective: Objective
    ) -> float | None:
        """Reduce run ``run_id``'s series into ``arm`` at ``key``; returns its objective."""
        value, window = run_objective(series, run_id, objective)
        if value is not None:
            self.by_arm[arm][key] = value
            for metric, mean in window.items():
                self.separation[arm][metric][key] = mean
        return value

    def separation_view(self) -> dict[str, dict[str, Any]]:
        """Per arm and separation statistic: its summary over the arm's runs."""
        return {
            a: {k: jsonable(vars(stats.summarise_arm(a, v, M.bounds(k)))) for k, v in sep.items()}
            for a, sep in self.separation.items()
        }


def bounds_of(keys: Iterable[str]) -> dict[str, list[float]]:
    """The range of each bounded key (conspo.metrics.bounds), for the pages' axes."""
    return {key: list(b) for key in keys if (b := M.bounds(key)) is not None}


def jsonable(value: Any) -> Any:
    """``value`` with NaN and ±Infinity as None, at every depth (JSON has no spelling for them)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
