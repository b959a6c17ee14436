"""Runs that start from other runs: the submit-time check of the runs a config names.

* ``start_problems(config, ...)``: ``model.from_run`` (or ``kind_params.from_run``) unless that
  run exists, has finished without failing and (for a model) has the checkpoint ``model.step``
  names on disk, checked at submit time (``backend.runs.submit``); the worker resolves it
  again (``worker.job_inputs``).
* ``refused_starts(config, session, caller)``: the runs a config starts from that belong to
  another user who has not shared them (``backend.runs.sharing``): the submit answers 403.

The model registry built from finished runs is ``backend.model_registry``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINISHED, Run, RunStatus, User
from backend.runs import sharing
from conspo.config import RunConfig
from conspo.models.lineage import Which, checkpoint_for, describe, step_checkpoints
from conspo.registry import get_job_kind, job_kind_names

Loc = tuple[str | int, ...]


def start_problems(
    config: RunConfig, session: Session, settings: Settings
) -> list[tuple[Loc, str, Any]]:
    """(where, message, value) of each run a config starts from that cannot be used."""
    problems: list[tuple[Loc, str, Any]] = []
    source = config.model.from_run
    if source is not None:
        message = _unusable(session, settings, source, config.model.step)
        if message:
            problems.append((("model", "from_run"), message, source))
    kind_params = config.job_params()
    for field in get_job_kind(config.kind).input_runs:  # runs whose rollouts the kind reads
        input_run = getattr(kind_params, field)
        if input_run is not None and (message := _unusable(session, settings, input_run, None)):
            problems.append((("kind_params", field), message, input_run))
    return problems


def run_paths() -> set[str]:
    """The config paths whose value names a run: ``model.from_run`` and every job kind's input
    runs (``kind_params.from_run``)."""
    kinds = [get_job_kind(name) for name in job_kind_names()]
    return {"model.from_run", *(f"kind_params.{f}" for kind in kinds for f in kind.input_runs)}


def refused_starts(config: RunConfig, session: Session, caller: User) -> list[tuple[Loc, str, Any]]:
    """(where, message, run id) of each run ``config`` starts from that ``caller`` may not use:
    ``model.from_run`` when it or a run of its lineage is another user's and not shared (a model
    trained from a model carries it), a job kind's input run when it is (its rollouts). A run
    that does not exist is ``start_problems``' to report."""
    problems: list[tuple[Loc, str, Any]] = []
    source = config.model.from_run
    run = session.get(Run, source) if source is not None else None
    refused = sharing.first_refused(session, run, caller) if run is not None else None
    if run is not None and refused is not None:
        action = "starting from " + ("it" if refused is run else "a model trained from it")
        problems.append((("model", "from_run"), sharing.refusal(run, refused, action), source))
    kind_params = config.job_params()
    for field in get_job_kind(config.kind).input_runs:
        input_run = getattr(kind_params, field)
        run = session.get(Run, input_run) if input_run is not None else None
        if run is not None and not sharing.may_use(run, caller):
            message = sharing.refusal(run, run, "reading its rollouts")
            problems.append((("kind_params", field), message, input_run))
    return problems


def _unusable(session: Session, settings: Settings, run_id: int, which: Which | None) -> str:
    run = session.get(Run, run_id)
    if run is None:
        return f"run {run_id} does not exist"
    if run.status not in FINISHED:
        return f"run {run_id} has not finished (it is {run.status})"
    if run.status == RunStatus.failed:
        return f"run {run_id} failed: start from a run that succeeded (or was cancelled)"
    if which is not None and checkpoint_for(settings.run_dir(run_id), which) is None:
        kept = [s for s, _ in step_checkpoints(settings.run_dir(run_id))]
        return f"run {run_id} has no {describe(which)} (kept steps: {kept or 'none'})"
    return ""
