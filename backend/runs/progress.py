"""A run's pace and ETA, computed in one place.

Every write that advances a run's step (the worker's sink, the external logging endpoint) folds
the time since the previous step into ``runs.pace_s`` in the same UPDATE (``pace_values``): a
running mean over the first ``PACE_WINDOW`` steps, then an exponential average with that span,
so checkpoints count in proportion to how often they come (the median step time left them out:
the ETA fell short). Evaluations are counted apart: the seconds a write's steps spent on the
held-out evaluation (``time/eval_s``) are taken off the time it measures, and a write that does
not advance the step (the step-0 evaluation) moves the clock on by them, so the pace is the
steps' alone (issue 49: a 6-minute evaluation at step 0, folded into the first step, made a
15-minute run's ETA 66 minutes). The claim stamps ``last_step_at`` too, so the first step's
sample (model loading and the step) gives an ETA from the first step on, and later steps
correct it.

``eta_s`` is what every page and the CLI show: the pace times the steps left, plus each
evaluation still due (``evals_left``: every ``eval.every`` steps and the last) at the latest
one's measured seconds (estimated from the step's generation speed until one is measured), less
the time since the last step, for a running run that is not being cancelled; the pages count it
down from when they received it (no client clock compared with the server's).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from sqlalchemy import and_, case, select
from sqlalchemy.orm import Session

from backend.models import Run, RunStatus
from conspo import metrics as M
from conspo.config import EvalConfig

PACE_WINDOW = 30  # steps the pace averages over


def pace_values(
    last_step: int,
    wall_time: float,
    first: tuple[int, float] | None = None,
    eval_s: float = 0.0,
    first_eval_s: float = 0.0,
) -> dict[str, Any]:
    """Values for the run's UPDATE when a write logs steps up to ``last_step``, the last one at
    ``wall_time`` (unix time); they read the row's values before the update, as SQL does, and
    leave it as it is unless the step advances. ``first``: the write's first step and its wall
    time, the measure when the row has no earlier step's time (an external run's first write of
    many steps). ``eval_s``: the seconds the write's steps spent evaluating (``first_eval_s`` of
    them in its first step, before that step's wall time), which the pace leaves out."""
    advanced = Run.step < last_step
    gained = last_step - Run.step
    span = min(max(last_step, 1), PACE_WINDOW)
    started = Run.last_step_at + eval_s  # the clock, less the evaluations since
    sample = (wall_time - started) / gained
    weight = case((gained >= span, 1.0), else_=gained * 1.0 / span)
    folded = case((Run.pace_s.is_(None), sample), else_=Run.pace_s + weight * (sample - Run.pace_s))
    measurable = and_(advanced, Run.last_step_at.is_not(None), started < wall_time)
    whens: list[Any] = [(measurable, folded)]
    if first is not None and first[0] < last_step and first[1] + eval_s - first_eval_s < wall_time:
        # the write's own steps, less their evaluations
        within = (wall_time - first[1] - (eval_s - first_eval_s)) / (last_step - first[0])
        whens.append((and_(advanced, Run.last_step_at.is_(None), Run.pace_s.is_(None)), within))
    return {
        "pace_s": case(*whens, else_=Run.pace_s),
        "last_step_at": case((advanced, wall_time), else_=started),
    }


def evals_left(config: dict[str, Any], step: int, total: int) -> int:
    """Held-out evaluations still due after ``step`` of ``total`` (``conspo.training.loop.
    eval_due``: every ``eval.every`` steps and at the last step)."""
    if step >= total:
        return 0
    every = _number(config, ("eval", "every"), EVAL_EVERY_DEFAULT)
    periodic = total // every - step // every if every > 0 else 0
    return int(periodic + (0 if every > 0 and total % every == 0 else 1))


def eval_seconds(run: Run) -> float:
    """Seconds one held-out evaluation of ``run`` takes: the latest measured (``time/eval_s``);
    before one is, an estimate for a platform run: its greedy and pass@k answers
    (eval_size × (1 + pass_k)) at the seconds per rollout of its steps (their generation time,
    else the pace); 0 for an external run that logs none."""
    measured = (run.summary or {}).get(M.TIME_EVAL_S)
    if isinstance(measured, int | float) and math.isfinite(measured):
        return float(measured)
    config = run.config or {}
    if run.external or run.pace_s is None:
        return 0.0
    rollouts = _number(config, ("sampling", "prompts_per_step"), 1) * _number(
        config, ("sampling", "group_size"), 1
    )
    generation = (run.summary or {}).get(M.TIME_ROLLOUT_S)
    step_s = generation if isinstance(generation, int | float) else run.pace_s
    answers = _number(config, ("task", "eval_size"), 0) * (
        1 + _number(config, ("eval", "pass_k"), 1)
    )
    return float(step_s) / max(rollouts, 1) * answers


def eta_s(run: Run, now: float | None = None) -> float | None:
    """Seconds until the run ends: its pace times the steps left plus its evaluations still due
    at ``eval_seconds`` each, less the time since the last step; None when it is not running,
    is being cancelled, or has no pace yet."""
    total = run.total_steps or 0
    if (
        run.status != RunStatus.running
        or run.cancel_requested
        or run.pace_s is None
        or run.last_step_at is None
        or run.step >= total
    ):
        return None
    since = (time.time() if now is None else now) - run.last_step_at
    evals = evals_left(run.config or {}, run.step, total) * eval_seconds(run)
    return max(0.0, run.pace_s * (total - run.step) + evals - since)


EVAL_EVERY_DEFAULT = EvalConfig.model_fields["every"].default  # for a config without one


def _number(config: dict[str, Any], path: tuple[str, ...], default: float) -> float:
    value: Any = config
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else default


# What a step's cost depends on, besides the machine: runs that agree on these are "like" a
# config for the estimate's seconds per step.
SHAPE_PATHS = (
    ("kind",),
    ("model", "name"),
    ("model", "dtype"),
    ("model", "lora", "rank"),
    ("sampling", "prompts_per_step"),
    ("sampling", "group_size"),
    ("sampling", "max_new_tokens"),
    ("optim", "mini_batches"),
    ("optim", "epochs"),
    ("resources", "gpus"),
    ("resources", "cpu_processes"),
)
LIKE_RUNS = 10  # the most recent runs like it that the estimate takes the median of


def _shape(config: dict[str, Any]) -> tuple[Any, ...]:
    out = []
    for path in SHAPE_PATHS:
        value: Any = config
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        out.append(value)
    return tuple(out)


def pace_of_like(session: Session, config: dict[str, Any]) -> dict[str, Any] | None:
    """Seconds per step of the latest runs of the same model and shape (their median pace),
    how many, and where they ran; None when none has a pace yet."""
    name = _shape(config)[1]
    rows = session.execute(
        select(Run.pace_s, Run.config, Run.device)
        .where(Run.model == name, Run.pace_s.is_not(None), Run.external.is_(False))
        .order_by(Run.id.desc())
        .limit(200)
    ).all()
    want = _shape(config)
    like = [(pace, device) for pace, cfg, device in rows if _shape(cfg or {}) == want]
    like = like[:LIKE_RUNS]
    if not like:
        return None
    return {
        "seconds_per_step": statistics.median(p for p, _ in like),
        "runs": len(like),
        "devices": sorted({d for _, d in like if d}),
    }
