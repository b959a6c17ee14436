"""Tuned studies: each arm at its own best settings before the final seeds decide.

An arm study whose arms may carry ``tune: {space, trials}`` runs in two phases:

1. *Tuning.* Each tuned arm has its own Optuna study (``search.optuna_name(study, arm)``, in the
   platform database as a search study's is). A trial is a row arm ``<arm>:t<number>``
   (``spec.trial_row_arm``) on every tuning seed, its config the arm's (base ⊕ overrides) with the
   trial's parameters over them; its value, told when all its seeds have finished, is the mean
   objective of those that succeeded. An arm asks its next trial only when none of its rows is
   pending, so a TPE sampler sees every trial of that arm finished so far.
2. *Final.* When every tuned arm has asked all its trials and each has been told, each arm's best
   trial's parameters are merged over its own overrides, the picks are stored in
   ``studies.tuning`` and the arms × final seeds rows are added: from there on it is the usual arm
   study, and its verdict (``service.study_view``) reads the final rows alone.

Everything is driven from the database (rows, runs, Optuna's tables, ``studies.tuning``) by
``advance``, which ``service.release`` calls under the study row's lock: a server restarted
mid-tuning carries on at the reapers' next pass, and a cancelled study releases nothing more.

How sure a pick is (``confidence``): the gap between the best trial's mean objective and the
runner-up's, against the standard error of that difference over the tuning seeds
(√(s²_best/n_best + s²_second/n_second), each s the sample standard deviation of a trial's
per-seed values). A ratio under 2 means these seeds do not tell the two settings apart; with one
tuning seed there is no spread and the page says so. It judges only the top two trials, on few
seeds: a hint at how much the pick rests on noise, not a test.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

from sqlalchemy.orm import Session

from backend.errors import InvalidInput
from backend.models import FINISHED, Run, RunStatus, Study, StudyRun, StudyRunState, utcnow
from backend.runs.submit import Submitted
from backend.storage import studies as stored
from backend.storage.series import whole_series
from backend.studies import search
from backend.studies.arms import add_arms
from backend.studies.objective import reduce_series
from backend.studies.spec import (
    StudyCreate,
    Tune,
    run_name,
    trial_row_arm,
    tuned_arm_of,
    validate_arm,
)

log = logging.getLogger(__name__)

TELLS_APART = 2.0  # gap / standard error at which the pick is said to be clear of the runner-up


def check_tunes(body: StudyCreate) -> list[Submitted]:
    """Each tuned arm's space checked as a search's is, over that arm's config: 422 at
    body.arms.<i>.tune.space.<path>. Returns each value's config for the submit checks."""
    errors: list[dict[str, Any]] = []
    submitted: list[Submitted] = []
    for i, arm in enumerate(body.arms):
        if arm.tune is not None:
            found, configs = search.space_problems(
                body.config, arm.overrides, arm.tune, ("body", "arms", i, "tune")
            )
            errors += found
            submitted += configs
    if errors:
        raise InvalidInput(errors)
    return submitted


def create_optuna_studies(session: Session, study: Study) -> None:
    """One Optuna study per tuned arm of the (flushed) ``study``."""
    for arm in StudyCreate.model_validate(study.spec).arms:
        if arm.tune is not None:
            search.create_optuna_study(session, study, arm.name)


def _load(session: Session, study: Study, arm: str, tune: Tune) -> Any:
    return search._optuna().load_study(
        study_name=search.optuna_name(study.id, arm),
        storage=search.storage(search._url(session)),
        sampler=search.sampler(tune),
    )


def advance(session: Session, study: Study, free: int) -> None:
    """Tell each tuned arm's finished trials and ask new ones while there are free slots; when
    every arm's search has finished, store the picks and plan the final runs (once: a study
    with ``tuning`` set is in its final phase). Uncommitted: ``service.release`` commits."""
    if study.tuning is not None:
        return
    spec = StudyCreate.model_validate(study.spec)
    rows = stored.study_rows(session, study.id)
    runs = _runs_of(session, rows)
    searching = False
    for arm in spec.arms:
        if arm.tune is None:
            continue
        ostudy = _load(session, study, arm.name, arm.tune)
        mine = [r for r in rows if tuned_arm_of(r.arm) == arm.name]
        _tell_finished(session, ostudy, spec, mine, runs)
        asked = len(ostudy.get_trials(deepcopy=False))  # refused ones too: trials, not rows
        pending = any(r.state == StudyRunState.pending for r in mine)
        while free > 0 and not pending and asked < arm.tune.trials:
            # seeded by the trials asked so far: a sampler built anew at each load and seeded
            # alike would draw a random search's first parameters again at every later pass
            ostudy.sampler = search.sampler(arm.tune, seed=asked)
            trial = ostudy.ask(search.distributions(arm.tune))
            asked += 1
            overrides = {**arm.overrides, **trial.params}
            config, problems = validate_arm(spec.config, overrides, ())
            if config is None:  # a combination the config refuses (a cross-field rule)
                log.info("study %s: %s trial %s refused: %s", study.id, arm.name, trial.number,
                         problems[:1])  # fmt: skip
                search.tell(ostudy, trial.number, state=search._optuna().trial.TrialState.FAIL)
                continue
            row_arm = trial_row_arm(arm.name, trial.number)
            add_arms(session, study, spec.tuning_seeds, [(row_arm, config)], trials=[trial.number])
            session.flush()
            free -= len(spec.tuning_seeds)
            pending = True
        running = search._optuna().trial.TrialState.RUNNING
        if asked < arm.tune.trials or any(
            t.state == running for t in ostudy.get_trials(deepcopy=False)
        ):
            searching = True
    if not searching:
        _start_final(session, study, spec, rows, runs)


def _runs_of(session: Session, rows: list[StudyRun]) -> dict[int, Run]:
    ids = [r.run_id for r in rows if r.run_id is not None]
    return {r.id: r for r in session.query(Run).filter(Run.id.in_(ids))} if ids else {}


def _tell_finished(
    session: Session,
    ostudy: Any,
    spec: StudyCreate,
    mine: list[StudyRun],
    runs: dict[int, Run],
) -> None:
    """Tell Optuna each running trial whose seeds have all finished: the mean objective of
    those that succeeded, or FAIL when none did; and FAIL a running trial with no rows (its
    pass never committed them: ``advance`` runs under the study row's lock, so no other pass
    is between its ask and its commit)."""
    TrialState = search._optuna().trial.TrialState
    state = {t.number: t.state for t in ostudy.get_trials(deepcopy=False)}
    by_trial: dict[int, list[StudyRun]] = {}
    for row in mine:
        if row.trial is not None:
            by_trial.setdefault(row.trial, []).append(row)
    for number, trial_state in state.items():
        if trial_state == TrialState.RUNNING and number not in by_trial:
            # asked by a pass whose rows were never committed (the process died, the commit
            # failed): nothing will ever run it, and a running trial holds the search open
            log.warning("study trial %s has no runs; told FAIL", number)
            search.tell(ostudy, number, state=TrialState.FAIL)
    for number, trial_rows in by_trial.items():
        if state.get(number) != TrialState.RUNNING:
            continue
        trial_runs = [runs.get(r.run_id) for r in trial_rows if r.run_id is not None]
        done = all(r.state == StudyRunState.released for r in trial_rows) and all(
            r is not None and r.status in FINISHED for r in trial_runs
        )
        if not done:
            continue
        values = [
            search.run_objective(session, r, spec)
            for r in trial_runs
            if r is not None and r.status == RunStatus.succeeded
        ]
        finite = [v for v in values if v is not None]
        if finite:
            search.tell(ostudy, number, sum(finite) / len(finite))
        else:
            search.tell(ostudy, number, state=TrialState.FAIL)


def _start_final(
    session: Session,
    study: Study,
    spec: StudyCreate,
    rows: list[StudyRun],
    runs: dict[int, Run],
) -> None:
    """Every arm's search has finished: store the picks, plan arms × final seeds at them."""
    values = _trial_values(session, spec, rows, runs)
    picks: dict[str, Any] = {}
    arms = []
    for arm in spec.arms:
        params: dict[str, Any] = {}
        if arm.tune is not None:
            ostudy = _load(session, study, arm.name, arm.tune)
            pick = pick_of(ostudy, values.get(arm.name, {}), spec)
            picks[arm.name] = pick
            params = pick["params"]
        # the arm's own overrides validated at submit, and its trial with these parameters
        config, _ = validate_arm(spec.config, {**arm.overrides, **params}, ())
        assert config is not None
        arms.append((arm.name, config))
    study.tuning = {"picks": picks, "decided_at": utcnow().timestamp()}
    add_arms(session, study, spec.seeds, arms)
    session.flush()


def _trial_values(
    session: Session, spec: StudyCreate, rows: list[StudyRun], runs: dict[int, Run]
) -> dict[str, dict[int, dict[int, float]]]:
    """Per tuned arm, per trial, per tuning seed: the objective of each succeeded run."""
    ids = [
        r.run_id
        for r in rows
        if tuned_arm_of(r.arm) is not None
        and r.run_id is not None
        and r.run_id in runs
        and runs[r.run_id].status == RunStatus.succeeded
    ]
    metric = spec.objective.metric
    series = whole_series(session, ids, [metric]) if ids else {}
    out: dict[str, dict[int, dict[int, float]]] = {}
    for row in rows:
        arm = tuned_arm_of(row.arm)
        if arm is None or row.trial is None or row.run_id not in ids:
            continue
        steps, points = series[(row.run_id, metric)]
        value = reduce_series(steps, points, spec.objective.reduce, spec.objective.k)
        if value is not None:
            out.setdefault(arm, {}).setdefault(row.trial, {})[int(row.seed)] = value
    return out


def pick_of(ostudy: Any, values: dict[int, dict[int, float]], spec: StudyCreate) -> dict[str, Any]:
    """The arm's best complete trial and how sure the pick is (the module docstring)::

        {trial, params, value, values: {seed: objective}, runner_up: {trial, value, values} |
         None, gap, se, gap_over_se, confidence: text}

    ``trial`` None when no trial finished: the arm runs at its own overrides."""
    TrialState = search._optuna().trial.TrialState
    complete = [t for t in ostudy.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    empty = {"runner_up": None, "gap": None, "se": None, "gap_over_se": None}
    if not complete:
        return {
            "trial": None,
            "params": {},
            "value": None,
            "values": {},
            **empty,
            "confidence": "no trial finished: the arm runs at its own overrides",
        }
    ranked = sorted(complete, key=lambda t: t.value, reverse=spec.objective.direction == "max")
    best = ranked[0]
    out: dict[str, Any] = {
        "trial": best.number,
        "params": dict(best.params),
        "value": best.value,
        "values": {str(s): v for s, v in sorted(values.get(best.number, {}).items())},
        **empty,
    }
    if len(ranked) == 1:
        out["confidence"] = "the only trial that finished: nothing to compare it with"
        return out
    second = ranked[1]
    gap = abs(best.value - second.value)
    theirs = values.get(second.number, {})
    out["runner_up"] = {
        "trial": second.number,
        "params": dict(second.params),
        "value": second.value,
        "values": {str(s): v for s, v in sorted(theirs.items())},
    }
    out["gap"] = gap
    scale = spec.objective.scale or 1.0
    unit = f" {spec.objective.unit}" if spec.objective.unit else ""
    if gap == 0:
        out["confidence"] = (
            f"t{best.number} ties with t{second.number} ({best.value * scale:.3g}{unit}): the"
            " earlier trial is kept, and these seeds do not tell the two apart"
        )
        return out
    ahead = f"t{best.number} is ahead of t{second.number} by {gap * scale:.3g}{unit}"
    se = _difference_se(list(values.get(best.number, {}).values()), list(theirs.values()))
    if se is None:
        out["confidence"] = (
            f"{ahead}; one tuning seed per trial gives no seed spread to judge the gap by"
        )
        return out
    out["se"] = se
    ratio = gap / se if se > 0 else math.inf
    out["gap_over_se"] = ratio if math.isfinite(ratio) else None
    told = (
        "clear of the runner-up on these seeds"
        if ratio >= TELLS_APART
        else "not told apart from the runner-up by these seeds"
    )
    shown = f"{ratio:.2g}" if math.isfinite(ratio) else "∞ (no spread)"
    out["confidence"] = (
        f"{ahead}, {shown}× the standard error of that difference over the tuning seeds:"
        f" {told} (≥ {TELLS_APART:g}× counts as clear)"
    )
    return out


def _difference_se(best: list[float], second: list[float]) -> float | None:
    """√(s²_a/n_a + s²_b/n_b), or None when either trial has fewer than two seeds' values."""
    if len(best) < 2 or len(second) < 2:
        return None
    return math.sqrt(
        statistics.variance(best) / len(best) + statistics.variance(second) / len(second)
    )


def tuning_view(session: Session, study: Study) -> dict[str, Any]:
    """The tuning phase as the study page shows it::

    {phase: tuning | final, seeds: [tuning seeds], arms: [{arm, sampler, n_trials,
     params: [paths], trials: [{number, params, value, state, runs: [{seed, run_id,
     name, status, objective}]}], pick: pick_of's dict | None}]}"""
    spec = StudyCreate.model_validate(study.spec)
    rows = stored.study_rows(session, study.id)
    runs = _runs_of(session, rows)
    values = _trial_values(session, spec, rows, runs)
    picks = (study.tuning or {}).get("picks", {})
    arms = []
    for arm in spec.arms:
        if arm.tune is None:
            continue
        ostudy = _load(session, study, arm.name, arm.tune)
        mine = [r for r in rows if tuned_arm_of(r.arm) == arm.name]
        trials = []
        for t in ostudy.get_trials(deepcopy=False):
            trial_rows = [r for r in mine if r.trial == t.number]
            trials.append(
                {
                    "number": t.number,
                    "params": t.params,
                    "value": t.value if t.values else None,
                    "state": t.state.name.lower(),
                    "runs": [
                        _run_out(study, r, runs, values.get(arm.name, {}).get(t.number, {}))
                        for r in trial_rows
                    ],
                }
            )
        arms.append(
            {
                "arm": arm.name,
                "sampler": arm.tune.sampler,
                "n_trials": arm.tune.trials,
                "params": list(arm.tune.space),
                "trials": trials,
                "pick": picks.get(arm.name),
            }
        )
    tuning_runs, final_runs = spec.planned_runs()
    return {
        "phase": "tuning" if study.tuning is None else "final",
        # the plan of both phases: the study's progress counts only the rows planned so far
        "planned": {"tuning_runs": tuning_runs, "final_runs": final_runs},
        "seeds": spec.tuning_seeds,
        "arms": arms,
        "rule": f"gap / standard error ≥ {TELLS_APART:g}: the pick is clear of the runner-up",
    }


def _run_out(
    study: Study, row: StudyRun, runs: dict[int, Run], values: dict[int, float]
) -> dict[str, Any]:
    run = runs.get(row.run_id) if row.run_id is not None else None
    return {
        "seed": row.seed,
        "run_id": row.run_id,
        "name": run.name if run is not None else run_name(study.id, row.arm, row.seed),
        "status": str(run.status) if run is not None else str(row.state),
        "objective": values.get(int(row.seed)),
    }
