"""Search studies: Optuna proposes the arms, every trial runs over every seed.

A trial is an arm named ``t<number>`` whose overrides are the trial's parameters (config paths
of ``search.space``); its value is the mean objective over the seeds it finished, told to
Optuna when all of them have finished. Trials are asked while the study has free slots and no
pending runs (``release`` calls ``advance``), so a TPE sampler sees every trial finished so far.
With ``search.prune`` the mean intermediate eval of a trial's seeds is reported at each step and
Optuna's MedianPruner may stop the trial: its runs are cancelled and it is told PRUNED.

Optuna keeps its study in the platform's database, in its own namespace because its tables
(``studies``, ``trials``, ``alembic_version`` …) would collide with ours: the PostgreSQL schema
``optuna`` of the same database, or a SQLite file beside the platform's (``<name>-optuna.db``).
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.errors import InvalidInput
from backend.models import (
    FINISHED,
    Run,
    RunStatus,
    Study,
    StudyRun,
    StudyRunState,
)
from backend.runs import inputs as run_inputs
from backend.runs import lifecycle
from backend.runs.chaining import run_paths
from backend.runs.queue import JobQueue
from backend.runs.submit import Submitted
from backend.storage.series import whole_series
from backend.studies.arms import add_arms
from backend.studies.objective import reduce_series
from backend.studies.spec import Search, SearchParam, StudyCreate, Tune, validate_arm
from conspo.config import RunConfig

log = logging.getLogger(__name__)
SCHEMA = "optuna"


def _optuna() -> Any:
    import optuna  # lazily: only search studies need it

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@lru_cache(maxsize=8)
def storage(url: str) -> Any:
    """Optuna's RDB storage for the platform database at ``url`` (see the module docstring)."""
    optuna = _optuna()
    if url.startswith("sqlite"):
        path = Path(url.split(":///", 1)[1])
        return optuna.storages.RDBStorage(f"sqlite:///{path.with_name(path.stem + '-optuna.db')}")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    engine.dispose()
    # pinged at checkout: a connection PostgreSQL dropped (a restart, an administrator's
    # terminate) is replaced instead of failing a study page's read; the reads are few
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs={
            "connect_args": {"options": f"-csearch_path={SCHEMA}"},
            "pool_pre_ping": True,
        },
    )


def _url(session: Session) -> str:
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    return engine.url.render_as_string(hide_password=False)


def optuna_name(study_id: int, arm: str | None = None) -> str:
    """The Optuna study of a search study, or of one tuned arm of a tuned study."""
    return f"conspo-lab-study-{study_id}" + (f"-arm-{arm}" if arm is not None else "")


def distributions(search: Tune) -> dict[str, Any]:
    d = _optuna().distributions
    out: dict[str, Any] = {}
    for path, p in search.space.items():
        if p.type == "categorical":
            out[path] = d.CategoricalDistribution(p.choices)
        elif p.type == "int":
            out[path] = d.IntDistribution(
                int(p.low or 0), int(p.high or 0), log=p.log, step=int(p.step or 1)
            )
        else:
            out[path] = d.FloatDistribution(
                float(p.low or 0), float(p.high or 0), log=p.log, step=p.step
            )
    return out


def _grid(p: SearchParam, path: str) -> list[Any]:
    if p.type == "categorical":
        return list(p.choices or [])
    if p.step is None and p.type == "float":
        raise ValueError(f"a grid over the float {path} needs a step")
    step, low, high = p.step or 1, float(p.low or 0), float(p.high or 0)
    n = int(math.floor((high - low) / step + 1e-9)) + 1
    values = [low + i * step for i in range(n)]
    return [int(v) for v in values] if p.type == "int" else values


def sampler(search: Tune, seed: int = 0) -> Any:
    """The search's sampler, ``seed`` its random state; a grid's is always 0: it shuffles its
    grid by it, and trial n takes point n of that order, so every load must shuffle alike."""
    samplers = _optuna().samplers
    if search.sampler == "grid":
        return samplers.GridSampler({k: _grid(p, k) for k, p in search.space.items()}, seed=0)
    if search.sampler == "random":
        return samplers.RandomSampler(seed=seed)
    return samplers.TPESampler(seed=seed)


def _load(session: Session, study: Study) -> Any:
    search = Search.model_validate(study.spec["search"])
    optuna = _optuna()
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1) if search.prune else None
    return optuna.load_study(
        study_name=optuna_name(study.id),
        storage=storage(_url(session)),
        sampler=sampler(search),
        pruner=pruner,
    )


def check_space(body: StudyCreate) -> list[Submitted]:
    """Each search path must be a config path whose low/high or choices validate: 422 at
    body.search.space.<path> otherwise, before anything is stored. Returns the configs the
    submit checks look at (``backend.runs.submit``): the base, and the base with each value
    of each parameter (the low and high of a range), named by its path."""
    assert body.search is not None
    errors, submitted = space_problems(body.config, {}, body.search, ("body", "search"))
    base, base_errors = validate_arm(body.config, {}, ("body", "config"))
    errors += base_errors
    if errors:
        raise InvalidInput(errors)
    assert base is not None
    return [Submitted(("body", "config"), base), *submitted]


def space_problems(
    base: dict[str, Any], overrides: dict[str, Any], search: Tune, at: tuple[str | int, ...]
) -> tuple[list[dict[str, Any]], list[Submitted]]:
    """The errors of ``search``'s space over the config ``base`` ⊕ ``overrides`` (each located
    at ``<at>.space.<path>``), and the configs of each value of each parameter alone (the ends
    of a range) for the submit checks. A search study's space (``at``: body.search) and a
    tuned arm's (body.arms.<i>.tune) are checked alike."""
    errors: list[dict[str, Any]] = []
    submitted: list[Submitted] = []
    for path, p in search.space.items():
        loc = (*at, "space", path)
        if p.type != "categorical" and path in run_paths():
            # only the ends of a range are checked: every run a trial may start from must be
            msg = "a run id is searched over as choices (categorical), not as a range"
            errors.append({"type": "value_error", "loc": loc, "msg": msg})
            continue
        for value in _values(p):
            config, problems = validate_arm(base, {**overrides, path: value}, loc)
            errors += [{**e, "loc": loc} for e in problems[:1]]
            if config is None:
                break
            submitted.append(Submitted((*at, "space"), config, {path: value}))
        if search.sampler == "grid":
            try:
                _grid(p, path)
            except ValueError as exc:
                errors.append({"type": "value_error", "loc": (*loc, "step"), "msg": str(exc)})
    return errors, submitted


def _values(p: SearchParam) -> list[Any]:
    """The values of ``p`` the submit checks try: every choice, or the ends of its range."""
    if p.type == "categorical":
        return list(p.choices or [])
    return [int(v) if p.type == "int" else v for v in (p.low, p.high) if v is not None]


def largest_trial(body: StudyCreate, settings: Settings) -> Submitted | None:
    """The trial the space allows that needs the most memory by ``conspo.resources``' estimate,
    found one parameter at a time (each set to its hungriest value, the others held there):
    exact while memory grows or shrinks with each parameter alone, as the estimate does. None
    when no trial's estimate is readable here (the worker checks each trial's config)."""
    assert body.search is not None
    chosen: dict[str, Any] = {}
    largest: tuple[int, RunConfig] | None = None
    for path, p in body.search.space.items():
        best: tuple[int, Any, RunConfig] | None = None
        for value in _values(p):
            config, _ = validate_arm(body.config, {**chosen, path: value}, ())
            size = None if config is None else run_inputs.estimated_bytes(config, settings)
            if config is not None and size is not None and (best is None or size > best[0]):
                best = (size, value, config)
        if best is not None:
            chosen[path] = best[1]
            largest = (best[0], best[2])
    if largest is None:
        return None
    return Submitted(("body", "search", "space"), largest[1], dict(chosen))


def create_optuna_study(session: Session, study: Study, arm: str | None = None) -> None:
    """The Optuna study of the (flushed) search ``study`` (or of its tuned ``arm``), in the
    same database."""
    direction = "maximize" if study.spec["objective"]["direction"] == "max" else "minimize"
    _optuna().create_study(
        study_name=optuna_name(study.id, arm), storage=storage(_url(session)), direction=direction
    )


def advance(session: Session, jobs: JobQueue, study: Study, free: int) -> None:
    """Tell finished trials, prune hopeless ones, ask new ones while there are free slots."""
    ostudy = _load(session, study)
    search = Search.model_validate(study.spec["search"])
    spec = StudyCreate.model_validate(study.spec)
    rows = list(session.query(StudyRun).filter(StudyRun.study_id == study.id))
    by_trial: dict[int, list[StudyRun]] = {}
    for row in rows:
        if row.trial is not None:
            by_trial.setdefault(row.trial, []).append(row)
    runs = {
        r.id: r for r in session.query(Run).filter(Run.id.in_([r.run_id for r in rows if r.run_id]))
    }
    trial_state = {t.number: t for t in ostudy.get_trials(deepcopy=False)}
    TrialState = _optuna().trial.TrialState
    for number, mine in by_trial.items():
        trial = trial_state.get(number)
        if trial is None or trial.state != TrialState.RUNNING:
            continue
        mine_runs = [runs.get(r.run_id) for r in mine if r.run_id is not None]
        done = all(r.state == StudyRunState.released for r in mine) and all(
            r is not None and r.status in FINISHED for r in mine_runs
        )
        if done:
            values = [
                run_objective(session, r, spec)
                for r in mine_runs
                if r is not None and r.status == RunStatus.succeeded
            ]
            finite = [v for v in values if v is not None]
            if finite:
                tell(ostudy, number, sum(finite) / len(finite))
            else:
                tell(ostudy, number, state=TrialState.FAIL)
        elif search.prune and _prune(session, ostudy, trial, mine, mine_runs, spec):
            for row in mine:  # all released (``_prune``): their runs are stopped by the study
                row.state = StudyRunState.stopped  # itself, which ``release`` tells from a user's
            session.commit()
            for run in mine_runs:
                if run is not None and run.status not in FINISHED:
                    lifecycle.request_cancel(session, run)
            tell(ostudy, number, state=TrialState.PRUNED)
    asked = len(by_trial)
    pending = any(r.state == StudyRunState.pending for r in rows)
    while free > 0 and not pending and asked < search.trials:
        # seeded by the trials asked so far: a sampler built anew at each load and seeded alike
        # would draw a random search's first parameters again at every later pass
        ostudy.sampler = sampler(search, seed=len(ostudy.get_trials(deepcopy=False)))
        trial = ostudy.ask(distributions(search))
        asked += 1
        config, problems = validate_arm(spec.config, dict(trial.params), ("search",))
        if config is None:  # a combination the config refuses (a cross-field rule)
            log.info("study %s: trial %s refused: %s", study.id, trial.number, problems[:1])
            tell(ostudy, trial.number, state=TrialState.FAIL)
            continue
        add_arms(session, study, spec.seeds, [(f"t{trial.number}", config)], trials=[trial.number])
        session.flush()
        free -= len(spec.seeds)
        pending = True


def tell(ostudy: Any, number: int, value: float | None = None, state: Any = None) -> None:
    """``ostudy.tell`` outside Optuna's optimize loop: a grid sampler whose grid is done calls
    ``Study.stop()`` after the tell, which raises there; the trial's state is stored first (in a
    ``finally``), so that error is nothing to act on."""
    try:
        ostudy.tell(number, value, state=state)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise


def run_objective(session: Session, run: Run, spec: StudyCreate) -> float | None:
    series = whole_series(session, [run.id], [spec.objective.metric])
    steps, values = series[(run.id, spec.objective.metric)]
    return reduce_series(steps, values, spec.objective.reduce, spec.objective.k)


def _prune(
    session: Session,
    ostudy: Any,
    trial: Any,
    mine: list[StudyRun],
    runs: list[Run | None],
    spec: StudyCreate,
) -> bool:
    """Report the mean over the trial's seeds at each step all of them have logged; ask the
    pruner. A trial with seeds not yet released is not judged (its mean would lack them)."""
    if any(r.state != StudyRunState.released for r in mine) or any(r is None for r in runs):
        return False
    ids = [r.id for r in runs if r is not None]
    series = whole_series(session, ids, [spec.objective.metric])
    per_step: dict[int, list[float]] = {}
    for run_id in ids:
        for step, value in zip(*series[(run_id, spec.objective.metric)], strict=True):
            if value is not None:
                per_step.setdefault(step, []).append(value)
    reported = set(trial.intermediate_values)
    for step in sorted(per_step):
        if len(per_step[step]) == len(ids) and step not in reported:
            ostudy._storage.set_trial_intermediate_value(
                trial._trial_id, step, sum(per_step[step]) / len(ids)
            )
    if not per_step:
        return False
    fresh = ostudy._storage.get_trial(trial._trial_id)
    return bool(fresh.intermediate_values) and ostudy.pruner.prune(ostudy, fresh)


def search_view(session: Session, study: Study) -> dict[str, Any]:
    """Trials (parameters, value, state), and parameter importances once 2+ trials finished."""
    search = Search.model_validate(study.spec["search"])
    ostudy = _load(session, study)
    trials = [
        {
            "number": t.number,
            "arm": f"t{t.number}",
            "params": t.params,
            "value": t.value if t.values else None,
            "state": t.state.name.lower(),
        }
        for t in ostudy.get_trials(deepcopy=False)
    ]
    importances: dict[str, float] = {}
    note = None
    complete = [t for t in trials if t["state"] == "complete"]
    if len(complete) >= 2 and len(search.space) >= 1:
        try:
            raw = _optuna().importance.get_param_importances(ostudy)
            importances = {k: float(v) for k, v in raw.items()}
        except (ValueError, RuntimeError) as exc:
            note = f"importances unavailable: {exc}"
    else:
        note = "importances need 2 or more finished trials"
    return {
        "sampler": search.sampler,
        "n_trials": search.trials,
        "params": list(search.space),
        "trials": trials,
        "importances": importances,
        "importance_note": note,
    }
