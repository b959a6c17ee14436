"""Studies in the database: create one, release its pending runs, cancel it, read it back.

* ``create_study`` stores the study and one ``study_runs`` row per (arm, seed), all pending, in
  one transaction, then ``release`` queues the first ``concurrency`` of them.
* ``release`` is the one place pending runs become ordinary runs. It is called where runs
  finish (the worker after ``lifecycle.finish``, every reaper pass, a cancel) and is
  idempotent and race-safe: it first UPDATEs the study row, which holds that row's lock on
  PostgreSQL and the database's write lock on SQLite, so two callers release one after the
  other and the second sees the first's runs when it counts the free slots.
* ``study_view`` computes what the study page, the CLI and the report show: the objective of
  every finished run, the statistics (``backend.studies.stats``), the verdict and the curves.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from backend import lifecycle
from backend.models import (
    FINISHED,
    Metric,
    Run,
    RunStatus,
    Study,
    StudyRun,
    StudyRunState,
    StudyStatus,
    User,
    utcnow,
)
from backend.queue import JobQueue
from backend.studies import stats
from backend.studies.spec import (
    Objective,
    StudyCreate,
    group_of,
    row_arm,
    run_name,
    split_row_arm,
)
from conspo import metrics as M
from conspo.config import RunConfig

log = logging.getLogger(__name__)
ACTIVE = (RunStatus.queued, RunStatus.running)
CURVE_POINTS = 400  # steps per curve at most (a longer run is sampled evenly: said on the chart)


# --------------------------------------------------------------------------------------------
# Creating, releasing, cancelling
# --------------------------------------------------------------------------------------------


def create_study(
    session: Session,
    jobs: JobQueue,
    owner: User,
    spec: StudyCreate,
    arms: Sequence[tuple[str, RunConfig]],
    *,
    trials: Sequence[int | None] | None = None,
) -> Study:
    """Store the study and its (arm, seed) rows in one transaction, then release the first."""
    study = Study(
        name=spec.name,
        owner_id=owner.id,
        status=StudyStatus.active,
        spec=spec.model_dump(mode="json"),
        baseline=spec.baseline or (arms[0][0] if arms else None),
        concurrency=spec.concurrency,
    )
    session.add(study)
    session.flush()
    add_arms(session, study, spec.seeds, arms, trials=trials)
    session.commit()
    release(session, jobs, study.id)
    session.refresh(study)
    return study


def add_arms(
    session: Session,
    study: Study,
    seeds: Sequence[int],
    arms: Sequence[tuple[str, RunConfig]],
    *,
    trials: Sequence[int | None] | None = None,
) -> None:
    """Pending rows for ``arms`` × ``seeds``, released seed-major with the arms interleaved, so
    a study cut short still has whole seeds to pair (not all of one arm and none of another)."""
    start = (
        session.scalar(select(func.max(StudyRun.position)).where(StudyRun.study_id == study.id))
        or -1
    ) + 1
    order = [(s, a) for s in range(len(seeds)) for a in range(len(arms))]
    for position, (s, a) in enumerate(order, start):
        name, config = arms[a]
        seed = seeds[s]
        session.add(
            StudyRun(
                study_id=study.id,
                arm=row_arm(name, _task(study, config)),
                seed=seed,
                position=position,
                state=StudyRunState.pending,
                config=config.model_copy(
                    update={
                        "seed": seed,
                        "name": run_name(study.id, name, seed, _task(study, config)),
                    }
                ).model_dump(mode="json"),
                trial=trials[a] if trials else None,
            )
        )


def _task(study: Study, config: RunConfig) -> str | None:
    return config.task.name if study.spec.get("tasks") else None


def release(session: Session, jobs: JobQueue, study_id: int) -> list[int]:
    """Turn pending rows into queued runs while fewer than ``concurrency`` of the study's runs
    are queued or running; mark the study done when nothing is left. Returns the new run ids.

    Runs are committed before they are sent (as ``lifecycle.queue_runs`` does); a send that
    fails leaves the run with ``enqueued_at`` NULL for the reapers' ``unsent`` pass.
    """
    now = utcnow()
    locked = session.execute(
        update(Study)
        .where(Study.id == study_id, Study.status == StudyStatus.active)
        .values(updated_at=now)
    )
    if not locked.rowcount:  # type: ignore[attr-defined]
        session.rollback()
        return []
    study = session.get(Study, study_id, populate_existing=True)
    assert study is not None
    busy = session.scalar(
        select(func.count())
        .select_from(StudyRun)
        .join(Run, Run.id == StudyRun.run_id)
        .where(StudyRun.study_id == study_id, Run.status.in_(ACTIVE))
    )
    free = max(0, study.concurrency - int(busy or 0))
    if study.spec.get("search"):
        from backend.studies import search  # search imports this module

        search.advance(session, jobs, study, free)
    pending = list(
        session.scalars(
            select(StudyRun)
            .where(StudyRun.study_id == study_id, StudyRun.state == StudyRunState.pending)
            .order_by(StudyRun.position)
            .limit(free)
        )
    )
    runs = [_new_run(study, row) for row in pending]
    # Run names are unique (ux_runs_name): a user's run may already hold a study run's name.
    for run, name in zip(
        runs, lifecycle.unique_names(session, [r.name for r in runs]), strict=True
    ):
        run.name = name
    session.add_all(runs)
    session.flush()
    for row, run in zip(pending, runs, strict=True):
        row.run_id, row.state = run.id, StudyRunState.released
    if not busy and not runs and not _any_pending(session, study_id):
        study.status = StudyStatus.done
    session.commit()
    for run in runs:
        try:
            lifecycle.send(session, jobs, run.id)
        except lifecycle.QueueUnavailable:
            log.warning("study %s: run %s not sent; the reaper will send it", study_id, run.id)
    return [run.id for run in runs]


def _any_pending(session: Session, study_id: int) -> bool:
    return (
        session.scalar(
            select(StudyRun.id).where(
                StudyRun.study_id == study_id, StudyRun.state == StudyRunState.pending
            )
        )
        is not None
    )


def _new_run(study: Study, row: StudyRun) -> Run:
    config = RunConfig.model_validate(row.config)
    arm, task = split_row_arm(row.arm)
    return Run(
        name=run_name(study.id, arm, int(row.seed), task),
        owner_id=study.owner_id,
        status=RunStatus.queued,
        algorithm=config.algorithm,
        task=config.task.name,
        model=config.model.name,
        config=row.config,
        seed=row.seed,
        group_id=group_of(study.id),
        tags=list(dict.fromkeys([*study.spec.get("tags", []), f"study:{study.id}", arm])),
        total_steps=config.steps,
        summary={},
    )


def release_all(session: Session, jobs: JobQueue) -> list[int]:
    """``release`` every active study (the reapers' pass: catches runs that failed, were
    cancelled or died without their worker releasing anything)."""
    ids = list(session.scalars(select(Study.id).where(Study.status == StudyStatus.active)))
    return [run_id for study_id in ids for run_id in release(session, jobs, study_id)]


def release_for_run(session: Session, jobs: JobQueue, run_id: int) -> list[int]:
    """``release`` the study ``run_id`` belongs to, if any (called when that run finished)."""
    study_id = session.scalar(select(StudyRun.study_id).where(StudyRun.run_id == run_id))
    return release(session, jobs, study_id) if study_id is not None else []


def cancel_study(session: Session, study: Study) -> Study:
    """Pending rows → cancelled, queued or running runs → cancel requested, study → cancelled."""
    session.execute(
        update(StudyRun)
        .where(StudyRun.study_id == study.id, StudyRun.state == StudyRunState.pending)
        .values(state=StudyRunState.cancelled)
    )
    session.execute(
        update(Study)
        .where(Study.id == study.id, Study.status == StudyStatus.active)
        .values(status=StudyStatus.cancelled, updated_at=utcnow())
    )
    session.commit()
    for run in _runs(session, study.id):
        if run.status not in FINISHED:
            lifecycle.request_cancel(session, run)
    session.refresh(study)
    return study


def _runs(session: Session, study_id: int) -> list[Run]:
    return list(
        session.scalars(
            select(Run)
            .join(StudyRun, StudyRun.run_id == Run.id)
            .where(StudyRun.study_id == study_id)
            .order_by(StudyRun.position)
        ).unique()
    )


# --------------------------------------------------------------------------------------------
# Reading: objective per run, statistics, verdict, curves
# --------------------------------------------------------------------------------------------


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


Series = dict[tuple[int, str], tuple[list[int], list[float | None]]]  # (run, key) → steps, values


def _series(session: Session, run_ids: Iterable[int], keys: Iterable[str]) -> Series:
    out: Series = defaultdict(lambda: ([], []))
    ids, key_list = list(run_ids), list(keys)
    if not ids:
        return out
    rows = session.execute(
        select(Metric.run_id, Metric.key, Metric.step, Metric.value)
        .where(Metric.run_id.in_(ids), Metric.key.in_(key_list))
        .order_by(Metric.run_id, Metric.key, Metric.step)
    )
    for run_id, key, step, value in rows:
        steps, values = out[(run_id, key)]
        steps.append(step)
        values.append(value)
    return out


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


def study_view(session: Session, study: Study, *, curves: bool = True) -> dict[str, Any]:
    """Everything the study page shows, as JSON."""
    spec = StudyCreate.model_validate(study.spec)
    objective = spec.objective
    rows = list(
        session.scalars(
            select(StudyRun).where(StudyRun.study_id == study.id).order_by(StudyRun.position)
        )
    )
    arm_names = list(dict.fromkeys(split_row_arm(r.arm)[0] for r in rows))
    runs = {r.id: r for r in _runs(session, study.id)}
    keys = [objective.metric, *SEPARATION_KEYS]
    series = _series(session, runs, keys)
    # Runs pair by seed, or by (task, seed) when the study crosses tasks.
    by_arm: dict[str, dict[stats.Key, float]] = {a: {} for a in arm_names}
    separation: dict[str, dict[str, dict[stats.Key, float]]] = {
        a: defaultdict(dict) for a in arm_names
    }
    run_rows = []
    for row in rows:
        run = runs.get(row.run_id) if row.run_id is not None else None
        value = None
        arm, task = split_row_arm(row.arm)
        pair_key: stats.Key = (task, int(row.seed)) if task else int(row.seed)
        if run is not None and run.status == RunStatus.succeeded:
            value, window = run_objective(series, run.id, objective)
            if value is not None:
                by_arm[arm][pair_key] = value
                for key, mean in window.items():
                    separation[arm][key][pair_key] = mean
        run_rows.append(
            {
                "arm": arm,
                "task": task,
                "seed": row.seed,
                "state": row.state,
                "trial": row.trial,
                "run_id": row.run_id,
                "name": run.name if run is not None else run_name(study.id, arm, row.seed, task),
                "status": run.status if run is not None else row.state,
                "step": run.step if run is not None else 0,
                "total_steps": run.total_steps if run is not None else row.config.get("steps"),
                "objective": value,
            }
        )
    baseline = study.baseline or (arm_names[0] if arm_names else "")
    summary = stats.summarise(
        by_arm,
        baseline,
        direction=objective.direction,
        scale=objective.scale or 1.0,
        unit=objective.unit or "",
        effect=objective.effect,
        bounds=M.bounds(objective.metric),
    )
    counts: dict[str, int] = defaultdict(int)
    for r in run_rows:
        counts[str(r["status"])] += 1
    out: dict[str, Any] = {
        "id": study.id,
        "name": study.name,
        "owner": study.owner.name if study.owner is not None else None,
        "status": study.status,
        "created_at": study.created_at.timestamp(),
        "spec": study.spec,
        "baseline": baseline,
        "concurrency": study.concurrency,
        "objective": objective.model_dump(mode="json"),
        "group_id": group_of(study.id),
        "arms": [_arm_out(summary.arms[a], study, rows, a) for a in arm_names],
        "pairs": [_jsonable(vars(p)) for p in summary.pairs.values()],
        "verdict": summary.verdict,
        "separation": {
            a: {k: _jsonable(vars(stats.summarise_arm(a, v, M.bounds(k)))) for k, v in sep.items()}
            for a, sep in separation.items()
        },
        "bounds": bounds_of(keys),
        "runs": run_rows,
        "counts": dict(counts),
        "seeds": spec.seeds,
    }
    if spec.tasks:
        out["tasks"] = _across_tasks(by_arm, baseline, spec, summary.verdict)
    if curves:
        arm_runs = [ArmRunRow(split_row_arm(r.arm)[0], r.run_id) for r in rows]
        out["curves"] = group_curves(session, arm_runs, runs, keys)
    return out


def _across_tasks(
    by_arm: dict[str, dict[stats.Key, float]],
    baseline: str,
    spec: StudyCreate,
    verdict: list[str],
) -> dict[str, Any]:
    """Per arm, and per arm's paired differences, the IQM and mean over all task × seed runs
    with stratified bootstrap CIs; a verdict line per arm on the IQM of the differences."""

    def per_task(values: dict[stats.Key, float]) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {t: {} for t in spec.tasks}
        for (task, seed), value in values.items():
            out[task][seed] = value
        return {t: v for t, v in out.items() if v}

    scale = spec.objective.scale or 1.0
    unit = f" {spec.objective.unit}" if spec.objective.unit else ""
    arms = {a: _jsonable(vars(stats.across_tasks(per_task(v)))) for a, v in by_arm.items()}
    pairs = {}
    for arm, values in by_arm.items():
        if arm == baseline:
            continue
        agg = stats.paired_across_tasks(per_task(values), per_task(by_arm.get(baseline, {})))
        pairs[arm] = _jsonable(vars(agg))
        if agg.iqm is not None:
            ci = (
                f" [{stats._signed(agg.ci_iqm[0] * scale)}, {stats._signed(agg.ci_iqm[1] * scale)}]"
                if agg.ci_iqm
                else ""
            )
            verdict.append(
                f"{arm} − {baseline} across {len(agg.tasks)} tasks: IQM of the paired differences"
                f" = {stats._signed(agg.iqm * scale)}{unit}{ci} over {agg.n} (task, seed) pairs"
                " (stratified bootstrap: seeds resampled within each task)"
            )
    return {"tasks": spec.tasks, "arms": arms, "pairs": pairs}


def _arm_out(
    arm: stats.ArmSummary, study: Study, rows: list[StudyRun], name: str
) -> dict[str, Any]:
    mine = [r for r in rows if split_row_arm(r.arm)[0] == name]
    out = _jsonable(vars(arm))
    out["overrides"] = next(
        (a["overrides"] for a in study.spec.get("arms", []) if a["name"] == name), None
    )
    out["trial"] = mine[0].trial if mine else None
    out["params"] = (
        _trial_params(mine[0].config, study.spec) if mine and mine[0].trial is not None else None
    )
    out["planned"] = len(mine)
    return out


def _trial_params(config: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    params = {}
    for path in (spec.get("search") or {}).get("space", {}):
        node: Any = config
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        params[path] = node
    return params


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
    series = _series(session, runs, keys)
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


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def objective_csv(view: dict[str, Any]) -> str:
    """The per-seed objective as CSV: study, arm, seed, run id, status, objective."""
    lines = ["study,arm,seed,run_id,status,objective"]
    for r in view["runs"]:
        value = "" if r["objective"] is None else repr(float(r["objective"]))
        lines.append(
            f"{view['id']},{r['arm']},{r['seed']},{r['run_id'] or ''},{r['status']},{value}"
        )
    return "\n".join(lines) + "\n"


def planned_progress(session: Session, study_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Per study, its progress against the planned work: ``runs`` planned (cancelled rows are
    no longer planned), ``started`` (released into runs), ``steps`` done and ``total_steps``
    planned (a pending row counts its config's steps). A runs list that sees only the released
    runs would otherwise show a study as further along than it is."""
    out = {i: {"runs": 0, "started": 0, "steps": 0, "total_steps": 0} for i in study_ids}
    if not study_ids:
        return out
    rows = session.execute(
        select(StudyRun.study_id, StudyRun.state, StudyRun.config, Run.step, Run.total_steps)
        .outerjoin(Run, Run.id == StudyRun.run_id)
        .where(StudyRun.study_id.in_(list(study_ids)))
    )
    for study_id, state, config, step, total in rows:
        if state == StudyRunState.cancelled:
            continue
        p = out[study_id]
        p["runs"] += 1
        p["started"] += total is not None
        p["steps"] += int(step or 0)
        p["total_steps"] += int(total if total is not None else (config or {}).get("steps") or 0)
    return out


def bounds_of(keys: Iterable[str]) -> dict[str, list[float]]:
    """The range of each bounded key (conspo.metrics.bounds), for the pages' axes."""
    return {key: list(b) for key in keys if (b := M.bounds(key)) is not None}
