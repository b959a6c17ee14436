"""Queue, send, cancel and show pipelines (the stage runs themselves: ``stages``).

``GET /api/pipelines/{id}`` shows ``pipeline_view``: each stage's run, the checkpoint it
started from and its held-out evaluation at step 0 and at its last evaluated step (so a chained
stage's start can be read beside its predecessor's end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from backend import markdown
from backend.errors import InvalidInput, Loc
from backend.models import DEFAULT_KIND, FINISHED, Pipeline, Run, RunStatus, User
from backend.pipelines.stages import STOPPED, stage_run
from backend.runs import lifecycle
from backend.runs.queue import JobQueue
from backend.runs.rows import algorithm_of, commit_named, run_label
from backend.runs.scheduling import Cluster
from backend.schemas import run_out
from backend.storage import pipelines as stored
from backend.storage.series import points_under
from conspo.config import RunConfig

ENDED = ("succeeded", "failed", "cancelled")


def check_stages(stages: Sequence[RunConfig], loc: Loc) -> None:
    """A later stage starts from the previous stage's run: it may not name another (the
    error located under ``loc``, e.g. body.stages)."""
    for i, config in enumerate(stages):
        if i > 0 and config.model.from_run is not None:
            raise InvalidInput.at(
                (*loc, i, "model", "from_run"),
                "a later stage starts from the previous stage's run; drop it",
            )


def queue_pipeline(
    session: Session,
    jobs: JobQueue,
    owner: User,
    name: str,
    stages: Sequence[RunConfig],
    tags: Sequence[str] | None = None,
) -> tuple[Pipeline, Run]:
    """(none) → a pipeline with stage 0's run queued; the later stages wait for their turn
    (``stages.release_next_stage``). Nothing is left behind if the broker refuses stage 0."""
    pipeline = Pipeline(
        name=name,
        owner_id=owner.id,
        stages=[{"config": c.model_dump(mode="json"), "tags": list(tags or [])} for c in stages],
        released=1,
    )
    session.add(pipeline)
    session.flush()
    run = stage_run(session, pipeline, 0, None)
    commit_named(session, [run])
    try:
        lifecycle.send(session, jobs, run.id)
    except lifecycle.QueueUnavailable:
        session.execute(delete(Run).where(Run.id == run.id))
        session.execute(delete(Pipeline).where(Pipeline.id == pipeline.id))
        session.commit()
        raise
    session.refresh(run)
    return pipeline, run


def send_next_stage(session: Session, jobs: JobQueue, run_id: int) -> int | None:
    """Send the next stage's run of ``run_id``'s pipeline if it is queued and unsent."""
    row = session.execute(
        select(Run.pipeline_id, Run.pipeline_stage).where(Run.id == run_id)
    ).first()
    if row is None or row.pipeline_id is None:
        return None
    following = session.scalar(
        select(Run.id).where(
            Run.pipeline_id == row.pipeline_id,
            Run.pipeline_stage == row.pipeline_stage + 1,
            Run.status == RunStatus.queued,
            Run.enqueued_at.is_(None),
        )
    )
    if following is not None:
        lifecycle.send(session, jobs, following)
    return following


def cancel_pipeline(session: Session, pipeline: Pipeline) -> list[int]:
    """Stop ``pipeline``: no later stage is released, and its current stage's run is cancelled
    (``lifecycle.request_cancel``); returns the ids of the runs asked to stop. A pipeline that
    has ended is refused with ``lifecycle.Conflict``, naming its status. Race-safe with
    ``release_next_stage``: ``released`` is set first, under the row lock the release's
    conditional update takes, so either the release committed before (its new queued run is
    found below and cancelled) or it runs after and matches nothing."""
    current = pipeline_status(pipeline, stored.stage_runs(session, pipeline.id))
    if current in ENDED:
        raise lifecycle.Conflict(
            f"pipeline {pipeline.id} is {current};"
            " only a queued or running pipeline can be cancelled"
        )
    session.execute(update(Pipeline).where(Pipeline.id == pipeline.id).values(released=STOPPED))
    session.flush()
    active = session.scalars(
        select(Run).where(Run.pipeline_id == pipeline.id, Run.status.not_in(FINISHED))
    ).all()
    for run in active:
        lifecycle.request_cancel(session, run)  # commits (with the update above, at the first)
    session.commit()
    session.refresh(pipeline)
    return [run.id for run in active]


def pipeline_view(
    session: Session, pipeline: Pipeline, cluster: Cluster | None = None
) -> dict[str, Any]:
    """The pipeline with one entry per stage: its run once it has one, else its config; what
    it trains (its kind's label); where it starts from (``from_run``, ``step``); its first and
    last held-out evaluation."""
    runs = stored.stage_runs(session, pipeline.id)
    overall = pipeline_status(pipeline, runs)
    stages = []
    for i, entry in enumerate(pipeline.stages):
        run = runs.get(i)
        config = run.config if run is not None else entry["config"]
        model = config.get("model", {})
        kind, algorithm = config.get("kind", DEFAULT_KIND), config.get("algorithm")
        previous = runs.get(i - 1)
        stages.append(
            {
                "stage": i,
                "kind": kind,
                "algorithm": algorithm_of(kind, algorithm),
                "label": run_label(kind, algorithm),
                "name": config.get("name"),
                "run": run_out(run, cluster) if run is not None else None,
                "waiting_for": None if run is not None or i == 0 else i - 1,
                # a stage without a run in an ended pipeline never runs
                "skipped": run is None and overall in ENDED,
                "from": {
                    "run": model.get("from_run") or (previous.id if previous else None),
                    "step": model.get("step", "last"),
                    "base": model.get("name"),
                },
                "eval": stage_eval(session, run.id) if run is not None else None,
            }
        )
    return {
        "id": pipeline.id,
        "name": pipeline.name,
        "status": overall,
        "released": pipeline.released,
        "created_at": pipeline.created_at.timestamp(),
        "note": pipeline.note or "",
        "note_html": markdown.render(pipeline.note or ""),
        "stages": stages,
    }


def stage_eval(session: Session, run_id: int) -> dict[str, Any] | None:
    """{start: {step, values} | None, end: {step, values}} of the run's held-out evaluation
    (``eval/*`` keys) at step 0 and at its last evaluated step; None before its first
    evaluation. ``start`` is step 0's alone: a run that did not evaluate its start
    (eval.at_start off) has none, and its first evaluation, after training, is no start to
    set beside the previous stage's end (issue 49's walk: SmolLM2's recipe turns it off, and
    the page called the GRPO stage's final eval its start, "equal" to the SFT's)."""
    rows = points_under(session, run_id, "eval/")
    if not rows:
        return None
    first, last = rows[0][0], rows[-1][0]

    def at(step: int) -> dict[str, Any]:
        return {"step": step, "values": {key: value for s, key, value in rows if s == step}}

    return {"start": at(first) if first == 0 else None, "end": at(last)}


def pipeline_status(pipeline: Pipeline, runs: dict[int | None, Run]) -> str:
    """succeeded (every stage did), failed / cancelled (a stage did, or the pipeline was
    cancelled: the rest never run), running (a stage is), else queued."""
    statuses = [runs[i].status for i in sorted(k for k in runs if k is not None)]
    for stopped in (RunStatus.failed, RunStatus.cancelled):
        if stopped in statuses:
            return str(stopped)
    if len(statuses) == len(pipeline.stages) and statuses[-1] == RunStatus.succeeded:
        return "succeeded"
    if pipeline.released == STOPPED:
        # cancelled while a stage was finishing anyway: stopping when it stops
        return "cancelled" if all(s in FINISHED for s in statuses) else "running"
    return "running" if RunStatus.running in statuses or len(statuses) > 1 else "queued"
