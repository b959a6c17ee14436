"""A run's pace and ETA, computed in one place.

Every write that advances a run's step (the worker's sink, the external logging endpoint) folds
the time since the previous step into ``runs.pace_s`` in the same UPDATE (``pace_values``): a
running mean over the first ``PACE_WINDOW`` steps, then an exponential average with that span,
so evaluations and checkpoints count in proportion to how often they come (the median step time
left them out: the ETA fell short and jumped at each evaluation). The claim stamps
``last_step_at`` too, so the first step's sample (model loading, the step-0 evaluation and the
step) gives an ETA from the first step on, and later steps correct it.

``eta_s`` is what every page and the CLI show: the pace times the steps left, less the time
since the last step, for a running run that is not being cancelled; the pages count it down from
when they received it (no client clock compared with the server's).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from sqlalchemy import and_, case, select
from sqlalchemy.orm import Session

from backend.models import Run, RunStatus

PACE_WINDOW = 30  # steps the pace averages over


def pace_values(
    last_step: int, wall_time: float, first: tuple[int, float] | None = None
) -> dict[str, Any]:
    """Values for the run's UPDATE when a write logs steps up to ``last_step``, the last one at
    ``wall_time`` (unix time); they read the row's values before the update, as SQL does, and
    leave it as it is unless the step advances. ``first``: the write's first step and its wall
    time, the measure when the row has no earlier step's time (an external run's first write of
    many steps)."""
    advanced = Run.step < last_step
    gained = last_step - Run.step
    span = min(max(last_step, 1), PACE_WINDOW)
    sample = (wall_time - Run.last_step_at) / gained
    weight = case((gained >= span, 1.0), else_=gained * 1.0 / span)
    folded = case((Run.pace_s.is_(None), sample), else_=Run.pace_s + weight * (sample - Run.pace_s))
    measurable = and_(advanced, Run.last_step_at.is_not(None), Run.last_step_at < wall_time)
    whens: list[Any] = [(measurable, folded)]
    if first is not None and first[0] < last_step and first[1] < wall_time:
        within = (wall_time - first[1]) / (last_step - first[0])  # the write's own steps
        whens.append((and_(advanced, Run.last_step_at.is_(None), Run.pace_s.is_(None)), within))
    return {
        "pace_s": case(*whens, else_=Run.pace_s),
        "last_step_at": case((advanced, wall_time), else_=Run.last_step_at),
    }


def eta_s(run: Run, now: float | None = None) -> float | None:
    """Seconds until the run ends at its pace; None when it is not running, is being
    cancelled, or has no pace yet."""
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
    return max(0.0, run.pace_s * (total - run.step) - since)


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
