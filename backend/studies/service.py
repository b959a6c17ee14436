"""Studies in the database: create one, release its pending runs, cancel it, read it back.

* ``create_study`` stores the study and one ``study_runs`` row per (arm, seed), all pending, in
  one transaction, then ``release`` queues the first ``concurrency`` of them.
* ``release`` is the one place pending runs become ordinary runs. It is called where runs
  finish (the worker after ``lifecycle.finish``, every reaper pass) and is
  idempotent and race-safe: it first UPDATEs the study row, which holds that row's lock on
  PostgreSQL and the database's write lock on SQLite, so two callers release one after the
  other and the second sees the first's runs when it counts the free slots. A run cancelled
  by its owner is not a free slot: it stops the study (``cancel_study`` stops it from its page).
* ``study_view`` computes what the study page, the CLI and the report show: the objective of
  every finished run, the statistics (``backend.studies.stats``), the verdict and the curves.
* A tuned study (``backend.studies.tuned``) starts with no rows: ``release`` asks its arms'
  trials on the tuning seeds, then plans the final rows; its verdict reads the final rows only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend import markdown
from backend.errors import InvalidInput, Loc
from backend.models import (
    FINISHED,
    Run,
    RunStatus,
    Study,
    StudyRun,
    StudyRunState,
    StudyStatus,
    User,
    utcnow,
)
from backend.runs import lifecycle
from backend.runs.queue import JobQueue
from backend.runs.rows import name_uniquely, new_run, study_tag
from backend.storage import studies as stored
from backend.storage.series import WholeSeries as Series
from backend.storage.series import whole_series
from backend.studies import progress, search, stats, tuned
from backend.studies.arms import add_arms
from backend.studies.objective import (
    SEPARATION_KEYS,
    ArmObjectives,
    ArmRunRow,
    bounds_of,
    group_curves,
    jsonable,
)
from backend.studies.spec import (
    Objective,
    StudyCreate,
    group_of,
    run_name,
    split_row_arm,
    tuned_arm_of,
    validate_arm,
)
from conspo import metrics as M
from conspo.config import RunConfig
from conspo.spreadsheet import csv_cell

log = logging.getLogger(__name__)


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
    """Store the study and its (arm, seed) rows in one transaction, then release the first.
    A tuned study stores no rows yet: its arms' Optuna studies, whose trials ``release`` asks
    (``tuned.advance``), and its final rows once they have finished."""
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
    if spec.tuned:
        tuned.create_optuna_studies(session, study)
    else:
        add_arms(session, study, spec.seeds, arms, trials=trials)
    session.commit()
    release(session, jobs, study.id)
    session.refresh(study)
    return study


def arm_configs(body: StudyCreate, loc: Loc) -> list[tuple[str, RunConfig]]:
    """Every arm's validated RunConfig (one per task when the study crosses tasks), or
    ``InvalidInput`` with all the errors, located under ``loc`` (the body); nothing stored."""
    arms, errors = [], []
    for j, name in enumerate(body.tasks):
        _, problems = validate_arm(body.config, {"task.name": name}, (*loc, "tasks", j))
        errors += [{**e, "loc": (*loc, "tasks", j)} for e in problems[:1]]
    if errors:
        raise InvalidInput(errors)
    # The base config's own problems are said once, on it, not under every arm's overrides.
    _, errors = validate_arm(body.config, {}, (*loc, "config"))
    from_base = {(tuple(e["loc"][len(loc) + 1 :]), e["msg"]) for e in errors}
    # task-major, then arms: released seed by seed in this order, a study cut short still has
    # every arm of a (task, seed) to pair
    tasks: list[str | None] = [*body.tasks] or [None]
    for task in tasks:
        for i, arm in enumerate(body.arms):
            overrides = {**arm.overrides, "task.name": task} if task else arm.overrides
            config, problems = validate_arm(body.config, overrides, (*loc, "arms", i, "overrides"))
            errors += [
                e
                for e in problems
                if e not in errors and (tuple(e["loc"][len(loc) + 3 :]), e["msg"]) not in from_base
            ]
            if config is not None:
                arms.append((arm.name, config))
    if errors:
        raise InvalidInput(errors)
    return arms


def create_search_study(session: Session, jobs: JobQueue, owner: User, body: StudyCreate) -> Study:
    """Validate the space, store the study, create its Optuna study, release the first trials
    (``search.advance`` asks them as slots free up)."""
    assert body.search is not None
    search.check_space(body)
    spec = body.model_copy(update={"arms": [], "baseline": None})
    study = Study(
        name=spec.name,
        owner_id=owner.id,
        status=StudyStatus.active,
        spec=spec.model_dump(mode="json"),
        baseline=None,
        concurrency=spec.concurrency,
    )
    session.add(study)
    session.flush()
    search.create_optuna_study(session, study)
    session.commit()
    release(session, jobs, study.id)
    session.refresh(study)
    return study


def release(session: Session, jobs: JobQueue, study_id: int) -> list[int]:
    """Turn pending rows into queued runs while fewer than ``concurrency`` of the study's runs
    are queued or running; mark the study done when nothing is left. Returns the new run ids.
    A run of the study cancelled from outside it (not by ``cancel_study`` or a search's
    pruner) stops the study instead: it is ``cancelled`` and releases nothing more.

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
    if outside := stored.cancelled_from_outside(session, study_id):
        # Its owner stopped one of its runs: the next one would undo that (a user who cancels
        # a study's runs from the runs list means to stop the study, not to make room).
        log.info("study %s: run %s cancelled from outside it; no more runs", study_id, outside)
        _stop_releasing(session, study_id)
        session.commit()
        return []
    busy = stored.active_runs(session, study_id)
    free = max(0, study.concurrency - busy)
    if study.spec.get("search"):
        search.advance(session, jobs, study, free)
    elif is_tuned(study.spec):
        tuned.advance(session, study, free)
    pending = stored.pending_rows(session, study_id, free)
    runs = [_new_run(study, row) for row in pending]
    # Run names are unique (ux_runs_name): a user's run may already hold a study run's name.
    name_uniquely(session, runs)
    session.add_all(runs)
    session.flush()
    for row, run in zip(pending, runs, strict=True):
        row.run_id, row.state = run.id, StudyRunState.released
    if not busy and not runs and not stored.pending_rows(session, study_id, 1):
        study.status = StudyStatus.done
    session.commit()
    for run in runs:
        try:
            lifecycle.send(session, jobs, run.id)
        except lifecycle.QueueUnavailable:
            log.warning("study %s: run %s not sent; the reaper will send it", study_id, run.id)
    return [run.id for run in runs]


def is_tuned(spec: dict[str, Any]) -> bool:
    """A stored spec with a tuned arm (``StudyCreate.tuned`` without validating it)."""
    return any(arm.get("tune") for arm in spec.get("arms", []))


def _new_run(study: Study, row: StudyRun) -> Run:
    """The queued run of a pending row: its config holds its seed and name (``add_arms``); a
    tuning run is tagged with its arm and ``tuning``."""
    arm, _ = split_row_arm(row.arm)
    tuning = tuned_arm_of(arm)
    mine = [tuning, "tuning"] if tuning is not None else [arm]
    tags = [*study.spec.get("tags", []), study_tag(study.id), *mine]
    config = RunConfig.model_validate(row.config)
    return new_run(study.owner_id, config, tags=tags, group_id=group_of(study.id))


def release_all(session: Session, jobs: JobQueue) -> list[int]:
    """``release`` every active study (the reapers' pass: catches runs that failed, were
    cancelled or died without their worker releasing anything)."""
    ids = stored.active_study_ids(session)
    return [run_id for study_id in ids for run_id in release(session, jobs, study_id)]


def release_for_run(session: Session, jobs: JobQueue, run_id: int) -> list[int]:
    """``release`` the study ``run_id`` belongs to, if any (called when that run finished)."""
    study_id = stored.study_of_run(session, run_id)
    return release(session, jobs, study_id) if study_id is not None else []


def cancel_study(session: Session, study: Study) -> Study:
    """Pending rows → cancelled, queued or running runs → cancel requested (their rows →
    stopped: the study stopped them), study → cancelled. A study that is no longer active
    (done, or cancelled already) is refused with ``Conflict``."""
    if study.status != StudyStatus.active:
        raise lifecycle.Conflict(
            f"study {study.id} is {study.status}; only an active study can be cancelled"
        )
    _stop_releasing(session, study.id)
    session.execute(
        update(StudyRun)
        .where(
            StudyRun.study_id == study.id,
            StudyRun.state == StudyRunState.released,
            StudyRun.run_id.in_(select(Run.id).where(Run.status.not_in(FINISHED))),
        )
        .values(state=StudyRunState.stopped)  # the study stops them, not their owner
    )
    session.commit()
    for run in stored.study_runs(session, study.id):
        if run.status not in FINISHED:
            lifecycle.request_cancel(session, run)
    session.refresh(study)
    return study


def _stop_releasing(session: Session, study_id: int) -> None:
    """Study → cancelled, its pending rows → cancelled (uncommitted). The study row first, as
    ``release`` takes it: a release that locked it before finishes first (its runs are then
    found and cancelled by the caller), one that comes after finds the study no longer active."""
    session.execute(
        update(Study)
        .where(Study.id == study_id, Study.status == StudyStatus.active)
        .values(status=StudyStatus.cancelled, updated_at=utcnow())
    )
    session.execute(
        update(StudyRun)
        .where(StudyRun.study_id == study_id, StudyRun.state == StudyRunState.pending)
        .values(state=StudyRunState.cancelled)
    )


def study_summary(study: Study, planned: dict[str, Any] | None = None) -> dict[str, Any]:
    """A study as the studies list shows it (with its ``progress.study_progress`` when given)."""
    return {
        "progress": planned,
        "id": study.id,
        "name": study.name,
        "status": study.status,
        "owner": study.owner.name if study.owner else None,
        "created_at": study.created_at.timestamp(),
        "note": study.note or "",
        "baseline": study.baseline,
        "arms": [a["name"] for a in study.spec.get("arms", [])],
        "seeds": study.spec.get("seeds", []),
        "search": study.spec.get("search") is not None,
    }


# --------------------------------------------------------------------------------------------
# Reading: objective per run, statistics, verdict, curves
# --------------------------------------------------------------------------------------------


def study_view(session: Session, study: Study, *, curves: bool = True) -> dict[str, Any]:
    """Everything the study page shows, as JSON."""
    spec = StudyCreate.model_validate(study.spec)
    objective = spec.objective
    # a tuned study's verdict rests on its final rows alone: its trials are ``tuning`` below
    rows = [r for r in stored.study_rows(session, study.id) if tuned_arm_of(r.arm) is None]
    arm_names = list(dict.fromkeys(split_row_arm(r.arm)[0] for r in rows))
    if spec.tuned and not rows:  # still tuning: every arm, none with a run yet
        arm_names = [a.name for a in spec.arms]
    final_ids = {r.run_id for r in rows}
    runs = {r.id: r for r in stored.study_runs(session, study.id) if r.id in final_ids}
    keys = [objective.metric, *SEPARATION_KEYS]
    values = ArmObjectives.of(arm_names)
    run_rows = _run_rows(study, rows, runs, whole_series(session, runs, keys), objective, values)
    by_arm = values.by_arm
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
    planned = progress.progress_of(session, [study.id])[study.id]
    out: dict[str, Any] = {
        "id": study.id,
        "name": study.name,
        "owner": study.owner.name if study.owner is not None else None,
        "status": study.status,
        "created_at": study.created_at.timestamp(),
        "note": study.note or "",
        "note_html": markdown.render(study.note or ""),
        "spec": study.spec,
        "baseline": baseline,
        "concurrency": study.concurrency,
        "objective": objective.model_dump(mode="json"),
        "group_id": group_of(study.id),
        "arms": [_arm_out(summary.arms[a], study, rows, a) for a in arm_names],
        "pairs": [jsonable(vars(p)) for p in summary.pairs.values()],
        "verdict": summary.verdict,
        "separation": values.separation_view(),
        "bounds": bounds_of(keys),
        "runs": run_rows,
        "counts": planned["counts"],  # the same figures as the studies list and the runs list
        "progress": planned,
        "seeds": spec.seeds,
        "stopped_by": stored.cancelled_from_outside(session, study.id)
        if study.status == StudyStatus.cancelled
        else [],
    }
    if spec.tasks:
        out["tasks"] = _across_tasks(by_arm, baseline, spec, summary.verdict)
    if spec.tuned:
        out["tuning"] = tuned.tuning_view(session, study)
    if curves:
        arm_runs = [ArmRunRow(split_row_arm(r.arm)[0], r.run_id) for r in rows]
        out["curves"] = group_curves(session, arm_runs, runs, keys)
    return out


def _run_rows(
    study: Study,
    rows: Sequence[StudyRun],
    runs: dict[int, Run],
    series: Series,
    objective: Objective,
    values: ArmObjectives,
) -> list[dict[str, Any]]:
    """Each row as the study page lists it, the objective of each succeeded run added to
    ``values`` (paired by seed, or by (task, seed) when the study crosses tasks)."""
    out = []
    for row in rows:
        run = runs.get(row.run_id) if row.run_id is not None else None
        value = None
        arm, task = split_row_arm(row.arm)
        if run is not None and run.status == RunStatus.succeeded:
            pair_key: stats.Key = (task, int(row.seed)) if task else int(row.seed)
            value = values.add(series, arm, pair_key, run.id, objective)
        out.append(
            {
                "arm": arm,
                "task": task,
                "seed": row.seed,
                "state": row.state,
                "trial": row.trial,
                "run_id": row.run_id,
                "name": run.name if run is not None else run_name(study.id, arm, row.seed, task),
                "status": progress.status_of(row.state, run.status if run else None),
                "step": run.step if run is not None else 0,
                "total_steps": run.total_steps if run is not None else row.config.get("steps"),
                "objective": value,
            }
        )
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
    arms = {a: jsonable(vars(stats.across_tasks(per_task(v)))) for a, v in by_arm.items()}
    pairs = {}
    for arm, values in by_arm.items():
        if arm == baseline:
            continue
        agg = stats.paired_across_tasks(per_task(values), per_task(by_arm.get(baseline, {})))
        pairs[arm] = jsonable(vars(agg))
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
    out = jsonable(vars(arm))
    out["overrides"] = next(
        (a["overrides"] for a in study.spec.get("arms", []) if a["name"] == name), None
    )
    out["trial"] = mine[0].trial if mine else None
    out["params"] = (
        _trial_params(mine[0].config, study.spec) if mine and mine[0].trial is not None else None
    )
    pick = ((study.tuning or {}).get("picks") or {}).get(name)
    if pick is not None:  # a tuned arm's final runs: its best trial's parameters
        out["trial"], out["params"] = pick["trial"], pick["params"]
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


def objective_csv(view: dict[str, Any]) -> str:
    """The per-seed objective as CSV: study, arm, seed, run id, status, objective. A tuned
    study's adds phase (tuning, final) and trial (a final run's: the trial its arm picked), its
    tuning runs first."""
    tuning = view.get("tuning")
    picked = {a["name"]: a.get("trial") for a in view["arms"]}
    lines = ["study,arm,seed,run_id,status,objective" + (",phase,trial" if tuning else "")]
    for arm in (tuning or {}).get("arms", []):
        for trial in arm["trials"]:
            for r in trial["runs"]:
                value = "" if r["objective"] is None else float(r["objective"])
                cells = [view["id"], arm["arm"], r["seed"], r["run_id"] or "", r["status"], value]
                lines.append(",".join(csv_cell(c) for c in [*cells, "tuning", trial["number"]]))
    for r in view["runs"]:
        value = "" if r["objective"] is None else float(r["objective"])
        cells = [view["id"], r["arm"], r["seed"], r["run_id"] or "", r["status"], value]
        trial = picked.get(r["arm"])
        extra = ["final", "" if trial is None else trial] if tuning else []
        lines.append(",".join(csv_cell(c) for c in [*cells, *extra]))
    return "\n".join(lines) + "\n"
