"""A pipeline's stage runs: made from the stage's config, starting from the previous stage's
run, and released once when that run succeeds.

Above the lifecycle, which never imports pipelines: ``install_hooks`` registers
``on_run_finished`` with ``lifecycle.on_finished``, so ``lifecycle.finish`` releases the next
stage in its own transaction. Every process that finishes runs calls it at start (the API's
``backend.main.create_app``, the worker's ``worker.celery_app``, ``worker.watchdog``). This
module makes rows and never changes a run's status.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.models import Pipeline, Run, RunStatus
from backend.runs import lifecycle
from backend.runs.rows import new_run, unique_names
from conspo.config import RunConfig

STOPPED = -1  # pipelines.released of a cancelled pipeline: no later stage is ever released


def stage_run(session: Session, pipeline: Pipeline, stage: int, previous: int | None) -> Run:
    """The run of ``stage``; after stage 0 it starts from the previous stage's run (its
    ``model.step``, default the last checkpoint)."""
    entry = pipeline.stages[stage]
    data = dict(entry["config"])
    if previous is not None:
        data["model"] = {**data.get("model", {}), "from_run": previous}
    config = RunConfig.model_validate(data)
    wanted = config.name or f"{pipeline.name}-{stage + 1}-{config.kind}"
    (name,) = unique_names(session, [wanted])  # a user's run may already hold the name
    run = new_run(pipeline.owner_id, config.model_copy(update={"name": name}), tags=entry["tags"])
    run.pipeline_id, run.pipeline_stage = pipeline.id, stage
    return run


def release_next_stage(session: Session, run_id: int) -> int | None:
    """Create the queued run of the stage after ``run_id``'s (which just succeeded), unless
    there is none or it exists already; returns its id. Not committed, not sent: the caller
    commits it with the finish, then sends it (``service.send_next_stage``; the reaper's
    ``unsent`` pass sends it otherwise). Once only: the conditional update of
    ``pipelines.released`` lets one caller through (PostgreSQL: the second waits on the row
    lock, then matches nothing; SQLite writers are serial)."""
    row = session.execute(
        select(Run.pipeline_id, Run.pipeline_stage).where(Run.id == run_id)
    ).first()
    if row is None or row.pipeline_id is None:
        return None
    pipeline = session.get(Pipeline, row.pipeline_id)
    following = row.pipeline_stage + 1
    if pipeline is None or following >= len(pipeline.stages):
        return None
    won = session.execute(
        update(Pipeline)
        .where(Pipeline.id == pipeline.id, Pipeline.released == following)
        .values(released=following + 1)
    )
    if not won.rowcount:  # type: ignore[attr-defined]
        return None
    run = stage_run(session, pipeline, following, run_id)
    run.name = unique_names(session, [run.name])[0]
    session.add(run)
    session.flush()
    return run.id


def on_run_finished(session: Session, run_id: int, status: RunStatus) -> None:
    """The lifecycle's hook (``lifecycle.on_finished``): a stage that succeeded releases the
    next one (``release_next_stage``), in the transaction of its finish."""
    if status is RunStatus.succeeded:
        release_next_stage(session, run_id)


def install_hooks() -> None:
    """Register the pipelines' part of ``lifecycle.finish`` in this process (idempotent)."""
    lifecycle.on_finished(on_run_finished)
