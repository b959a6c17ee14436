"""The run lifecycle: every change of a run's status is one of the named transitions below.

The routes, the worker, its reaper and the CLI call these functions and nothing else writes
``runs.status``. Each transition is a conditional UPDATE (it applies only from the states drawn
here, so two workers, two reapers or a worker racing a user's cancel can never both win) and
reports a refusal as a ``LifecycleError``; mapping those to HTTP statuses is the API's business
(``backend.api.errors``), so the CLI can call the same functions.

Worker runs::

                 queue_runs            claim                 finish
      (none) ─────────────► queued ─────────────► running ───────────────► succeeded
                             │  ▲ send              │  │ heartbeat (renews it; reports a cancel
                             │  │ (publish, stamp   │  │   request or a lost claim)
                             │  │  enqueued_at;     │  ├── fail ─────────► failed
                             │  │  again when       │  ├── finish ───────► cancelled (the worker
                             │  │  stranded)        │  │                    honoured a cancel)
                             │  ├── release ────────┤  (the worker stops cleanly: SIGTERM, a
                             │  │                   │   long database outage; no death counted)
                             │  └── requeue_stale ──┤  (heartbeat stale: its worker died; one
                             │      (a death)       │   more worker death counted)
                             │                      ├── requeue_stale ► failed (the worker died
                             │                      │                    max_attempts times)
                             │                      └── requeue_stale ► cancelled (stale, and
                             │                                            a cancel was asked)
                             └── request_cancel ─────────────────────────► cancelled
      running ── request_cancel ──► running with cancel_requested (the worker stops, then finish)
      succeeded | failed | cancelled ── request_cancel ──► refused (Conflict): a final state

External runs (a trainer elsewhere logs over HTTP)::

      (none) ── open_external ──► running ── close_external ──► succeeded | failed
                                          ── request_cancel ──► cancelled

``claim`` also takes a ``running`` run whose heartbeat is stale (its worker died and the message
came back): it counts the death as ``requeue_stale`` would, then starts a new attempt, and every
write of the old one (heartbeat, points, finish) is refused from then on, because each is
conditional on (status running, attempt).

What else a finish sets off is not the lifecycle's business: a room above it registers an
``on_finished`` hook, which ``finish`` calls inside its own transaction (a pipeline's next stage
is released that way: ``backend.pipelines.stages.install_hooks``, called at start by every
process that finishes runs: the API's ``create_app``, the worker's ``worker.celery_app``, its
``worker.watchdog``). The other ways a run ends (a cancel, ``requeue_stale`` failing a run,
``close_external``) call no hook: none of them is a worker run succeeding.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Update, delete, select, update
from sqlalchemy.orm import Session

from backend.errors import DomainError
from backend.models import (
    FINISHED,
    EvalAnswer,
    Metric,
    MetricRollup,
    PromptStat,
    RolloutStep,
    RolloutText,
    Run,
    RunLogChunk,
    RunStatus,
    User,
    utcnow,
)
from backend.runs.queue import JobQueue
from backend.runs.rows import commit_named, new_run
from backend.runs.scheduling import resources_of
from conspo.config import RunConfig

log = logging.getLogger(__name__)


class LifecycleError(DomainError):
    """A transition that cannot happen; the message says why in the user's terms."""


class QueueUnavailable(LifecycleError):
    """The broker refused the job; nothing was queued."""


class Conflict(LifecycleError):
    """The run is not in a state that allows this (e.g. logging into a finished run)."""


# --------------------------------------------------------------------------------------------
# Hooks: what a finish sets off in the rooms above (pipelines)
# --------------------------------------------------------------------------------------------

OnFinished = Callable[[Session, int, RunStatus], None]
"""``hook(session, run_id, status)``: ``finish`` has just moved ``run_id`` to ``status`` (one of
``FINISHED``), in ``session``'s open transaction; whatever the hook writes there is committed
with the finish (both or neither). It must not commit."""

_on_finished: list[OnFinished] = []


def on_finished(hook: OnFinished) -> OnFinished:
    """Register ``hook`` for every later ``finish`` of this process (once: registering the same
    hook again changes nothing); returns it."""
    if hook not in _on_finished:
        _on_finished.append(hook)
    return hook


def finished_hooks() -> tuple[OnFinished, ...]:
    """The hooks ``finish`` calls, in the order they were registered."""
    return tuple(_on_finished)


# --------------------------------------------------------------------------------------------
# Ownership: what every write of a worker's attempt is conditional on
# --------------------------------------------------------------------------------------------


def owned_by(run_id: int, attempt: int) -> tuple[ColumnElement[bool], ...]:
    """WHERE clauses true while ``attempt`` still owns the running run ``run_id``."""
    return (Run.id == run_id, Run.attempt == attempt, Run.status == RunStatus.running)


def _rows(result: Any) -> int:
    return int(result.rowcount)


def _cancelled_if_asked(session: Session, runs: Update, now: datetime) -> bool:
    """→ cancelled (committed) for the run ``runs`` matches when a cancel was asked of it: a
    run handed back by its worker, or whose worker died, would otherwise never finish it."""
    cancelled = session.execute(
        runs.where(Run.cancel_requested.is_(True)).values(
            status=RunStatus.cancelled, finished_at=now, updated_at=now
        )
    )
    if not _rows(cancelled):
        return False
    session.commit()
    return True


# --------------------------------------------------------------------------------------------
# Creating and sending
# --------------------------------------------------------------------------------------------


def queue_runs(
    session: Session,
    jobs: JobQueue,
    owner: User,
    config: RunConfig,
    *,
    seeds: Sequence[int] | None = None,
    tags: Sequence[str] | None = None,
    name: str | None = None,
    cloned_from: int | None = None,
) -> tuple[str | None, list[Run]]:
    """(none) → queued, one run per seed; returns (group id of 2+ seeds, the runs).

    The rows are committed before they are sent, so a worker never receives an id it cannot
    see. If the broker refuses, the runs not yet sent are deleted and ``QueueUnavailable`` is
    raised; a process dying between commit and send leaves runs with ``enqueued_at`` NULL,
    which the reaper sends after ``unsent_grace_s`` (``unsent``).
    """
    seed_list = list(dict.fromkeys(seeds)) if seeds else [config.seed]
    group_id = uuid.uuid4().hex if len(seed_list) >= 2 else None
    runs = []
    for seed in seed_list:
        cfg = config.model_copy(update={"seed": seed})
        if name:
            cfg = cfg.model_copy(
                update={"name": name if len(seed_list) == 1 else f"{name}-s{seed}"}
            )
        runs.append(new_run(owner.id, cfg, tags=tags or (), group_id=group_id))
        runs[-1].cloned_from = cloned_from
    commit_named(session, runs)
    pending = list(runs)
    try:
        while pending:
            send(session, jobs, pending[0].id)
            pending.pop(0)
    except QueueUnavailable:
        session.execute(delete(Run).where(Run.id.in_([r.id for r in pending])))
        session.commit()
        raise
    for run in runs:
        session.refresh(run)
    return group_id, runs


def send(session: Session, jobs: JobQueue, run_id: int) -> bool:
    """Hand a queued run to the broker, on the queue of workers that can hold it
    (``backend.runs.scheduling``), and stamp ``enqueued_at``; False if it is not queued.

    The stamp is written first, inside a transaction that stays open while the job is
    published: the UPDATE holds the run row, so a second sender (another worker's reaper)
    waits and then finds the run stamped, and a failed publish rolls the stamp back. A crash
    after publishing but before the commit leaves the run unstamped and it is sent again later:
    a duplicate message is harmless (``claim`` takes a run once).
    """
    stamped = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status == RunStatus.queued)
        .values(enqueued_at=utcnow())
        .returning(Run.config)
    ).first()
    if stamped is None:
        session.rollback()
        return False
    try:
        jobs.publish(run_id, resources_of(stamped[0]))
    except Exception as exc:
        session.rollback()
        log.warning("run %s: the broker refused the job (%s)", run_id, type(exc).__name__)
        raise QueueUnavailable(
            f"the job queue is unavailable ({type(exc).__name__}); nothing was queued"
        ) from exc
    session.commit()
    return True


def unsent(session: Session, created_before: datetime) -> list[int]:
    """Queued runs never handed to the broker, created before ``created_before``."""
    return list(
        session.scalars(
            select(Run.id).where(
                Run.status == RunStatus.queued,
                Run.enqueued_at.is_(None),
                Run.created_at < created_before,
            )
        )
    )


# --------------------------------------------------------------------------------------------
# A worker's attempt
# --------------------------------------------------------------------------------------------


def claim(
    session: Session, run_id: int, *, host: str, stale_before: datetime, max_attempts: int
) -> Run | None:
    """queued → running (a new attempt). A running run whose heartbeat is older than
    ``stale_before`` (its worker died) is first recovered as by ``requeue_stale``, so the death
    counts. None: not claimable (taken, finished, cancelled, failed for too many deaths,
    external, or deleted)."""
    stale = session.execute(
        select(*STALE_RUN).where(Run.id == run_id, *_stale(stale_before))
    ).first()
    if stale is not None:
        _recover_stale(session, StaleRun(*stale), stale_before, max_attempts)
    now = utcnow()
    claimed = _rows(
        session.execute(
            update(Run)
            .where(
                Run.id == run_id,
                Run.external.is_(False),
                Run.status == RunStatus.queued,
                Run.cancel_requested.is_(False),
            )
            .values(
                status=RunStatus.running,
                attempt=Run.attempt + 1,
                worker_host=host,
                heartbeat_at=now,
                updated_at=now,
                error=None,
                # the pace's clock starts with the attempt: its first step counts the setup
                last_step_at=time.time(),
                phase=None,  # setting up until the trainer says otherwise
            )
        )
    )
    if not claimed:
        session.commit()
        return None
    session.execute(
        update(Run).where(Run.id == run_id, Run.started_at.is_(None)).values(started_at=now)
    )
    session.commit()
    return session.get(Run, run_id, populate_existing=True)


class Beat(Enum):
    OWNED = "owned"  # still ours: keep going
    CANCEL_REQUESTED = "cancel requested"  # stop, then finish(cancelled)
    LOST = "lost"  # deleted, or another attempt took over: stop, write nothing more


def heartbeat(session: Session, run_id: int, attempt: int) -> Beat:
    """Renew the attempt's heartbeat (running stays running) and read ``cancel_requested``."""
    row = session.execute(
        update(Run)
        .where(*owned_by(run_id, attempt))
        .values(heartbeat_at=utcnow())
        .returning(Run.cancel_requested)
    ).first()
    session.commit()
    if row is None:
        return Beat.LOST
    return Beat.CANCEL_REQUESTED if row[0] else Beat.OWNED


def describe_attempt(
    session: Session,
    run_id: int,
    attempt: int,
    *,
    device: str,
    total_steps: int,
    dtype: str | None = None,
) -> bool:
    """Record where (and in what dtype) the attempt runs, no status change; False when it no
    longer owns the run."""
    done = session.execute(
        update(Run)
        .where(*owned_by(run_id, attempt))
        .values(device=device, dtype=dtype, total_steps=total_steps, updated_at=utcnow())
    )
    session.commit()
    return _rows(done) > 0


def record_ray_job(session: Session, run_id: int, attempt: int, ray_job_id: str) -> bool:
    """Record the Ray job a multi-node attempt trains in, no status change; False when the
    attempt no longer owns the run."""
    done = session.execute(
        update(Run).where(*owned_by(run_id, attempt)).values(ray_job_id=ray_job_id)
    )
    session.commit()
    return _rows(done) > 0


def finish(
    session: Session,
    run_id: int,
    attempt: int,
    status: RunStatus,
    *,
    error: str | None = None,
) -> bool:
    """running → succeeded | cancelled | failed, while ``attempt`` owns the run, and the
    ``on_finished`` hooks called in the same transaction (a succeeded pipeline stage releases
    the next stage's run).

    False when it does not (deleted, or re-queued and taken by a newer attempt): the newer
    attempt's outcome is the one that counts, and no hook is called.
    """
    if status not in FINISHED:
        raise ValueError(f"finish needs a final status, not {status!r}")
    now = utcnow()
    done = session.execute(
        update(Run)
        .where(*owned_by(run_id, attempt))
        .values(status=status, error=error, finished_at=now, heartbeat_at=now, updated_at=now)
    )
    if _rows(done):
        for hook in _on_finished:  # in the same transaction: both or neither
            hook(session, run_id, status)
    session.commit()
    return _rows(done) > 0


def fail(session: Session, run_id: int, attempt: int, error: str) -> bool:
    """running → failed with ``error`` (a traceback), while ``attempt`` owns the run."""
    return finish(session, run_id, attempt, RunStatus.failed, error=error)


def release(session: Session, run_id: int, attempt: int) -> RunStatus | None:
    """running → queued with ``enqueued_at`` NULL (to be sent again), while ``attempt`` owns
    the run: its worker stopped cleanly (SIGTERM, a long database outage) after a checkpoint,
    so no death is counted. → cancelled when a cancel was requested meanwhile (a queued run
    with a cancel request would never be claimed). None: the attempt no longer owns the run.
    """
    now = utcnow()
    owned = update(Run).where(*owned_by(run_id, attempt))
    if _cancelled_if_asked(session, owned, now):
        return RunStatus.cancelled
    released = _rows(
        session.execute(
            owned.where(Run.cancel_requested.is_(False)).values(
                status=RunStatus.queued, enqueued_at=None, updated_at=now
            )
        )
    )
    session.commit()
    return RunStatus.queued if released else None


# --------------------------------------------------------------------------------------------
# Recovery (the reaper)
# --------------------------------------------------------------------------------------------


@dataclass
class Requeued:
    queued: list[int]  # back to queued, to be sent again
    cancelled: list[int]  # a cancel had been asked: their worker will not finish them
    failed: list[int]  # their worker died max_attempts times


class StaleRun(NamedTuple):
    """What recovering a stale run needs to know about it (``_recover_stale``)."""

    id: int
    attempt: int
    worker_host: str | None
    step: int
    heartbeat_at: datetime | None  # never None: a NULL heartbeat is not stale
    worker_deaths: int


STALE_RUN = (Run.id, Run.attempt, Run.worker_host, Run.step, Run.heartbeat_at, Run.worker_deaths)


def _stale(stale_before: datetime) -> tuple[ColumnElement[bool], ...]:
    """WHERE clauses of worker runs still running with a heartbeat older than ``stale_before``."""
    return (
        Run.status == RunStatus.running,
        Run.external.is_(False),
        Run.heartbeat_at < stale_before,
    )


def requeue_stale(session: Session, stale_before: datetime, max_attempts: int) -> Requeued:
    """running with a heartbeat older than ``stale_before`` (worker runs only; its worker
    died) → queued with ``enqueued_at`` NULL and one more worker death; → failed when that
    makes ``max_attempts`` deaths (the run itself kills its workers: out of memory, say);
    → cancelled when a cancel was requested."""
    out = Requeued([], [], [])
    for row in session.execute(select(*STALE_RUN).where(*_stale(stale_before))).all():
        stale = StaleRun(*row)
        status = _recover_stale(session, stale, stale_before, max_attempts)
        if status is not None:
            getattr(out, status).append(stale.id)  # Requeued's lists are named by status
    return out


def recover_stalled(
    session: Session, run_id: int, stale_before: datetime, max_attempts: int, why: str
) -> RunStatus | None:
    """The stale run ``run_id``, whose training process a watchdog killed, recovered at once as
    ``requeue_stale`` would, the death recorded with ``why``; None if it was not stale."""
    row = session.execute(select(*STALE_RUN).where(Run.id == run_id, *_stale(stale_before))).first()
    if row is None:
        return None
    return _recover_stale(session, StaleRun(*row), stale_before, max_attempts, why)


def _recover_stale(
    session: Session,
    stale: StaleRun,
    stale_before: datetime,
    max_attempts: int,
    why: str | None = None,
) -> RunStatus | None:
    """One stale run (its ``STALE_RUN`` columns) → cancelled, queued or failed; None if it was
    no longer stale (renewed, or recovered by someone else). ``why``: what stopped the worker,
    when known (else it is taken for a death, out of memory most often)."""
    now = utcnow()
    still_stale = update(Run).where(
        Run.id == stale.id,
        Run.attempt == stale.attempt,
        Run.status == RunStatus.running,
        Run.heartbeat_at < stale_before,
    )
    if _cancelled_if_asked(session, still_stale, now):
        return RunStatus.cancelled
    deaths = stale.worker_deaths + 1
    beat = f"{stale.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC" if stale.heartbeat_at else "none"
    note = (
        f"worker {stale.worker_host} {why or 'stopped responding'} at step {stale.step} "
        f"(attempt {stale.attempt}, last heartbeat {beat})"
    )
    values: dict[str, Any] = {"worker_deaths": deaths, "last_worker_death": note}
    if deaths >= max_attempts:
        guess = "" if why else " (out of memory?)"
        error = f"worker died {deaths} times{guess}; the last time: {note}"
        values |= {"status": RunStatus.failed, "error": error, "finished_at": now}
    else:
        values |= {"status": RunStatus.queued, "enqueued_at": None}
    recovered = session.execute(
        still_stale.where(Run.cancel_requested.is_(False)).values(**values, updated_at=now)
    )
    session.commit()
    return values["status"] if _rows(recovered) else None


def stranded(session: Session, jobs: JobQueue, sent_before: datetime) -> list[int]:
    """Queued runs whose job the broker seems to have lost: sent before ``sent_before`` and
    still unclaimed, while the queue holds fewer jobs than there are sent runs waiting.

    The broker cannot say which job it lost, so every run waiting since before
    ``sent_before`` is named; re-sending one whose job was not lost only adds a duplicate,
    which ``claim`` ignores. A busy cluster, whose queue holds a job for each waiting run,
    strands nothing however long its runs wait. Raises when the broker is unreachable.
    """
    waiting = session.execute(
        select(Run.id, Run.enqueued_at, Run.config).where(
            Run.status == RunStatus.queued, Run.enqueued_at.is_not(None)
        )
    ).all()
    by_queue: dict[str, list[tuple[int, datetime | None]]] = {}
    for run_id, sent_at, config in waiting:
        by_queue.setdefault(jobs.queue_for(resources_of(config)), []).append((run_id, sent_at))
    lost = []
    for queue, runs in by_queue.items():  # each capacity class has its own queue to count
        if jobs.waiting(queue) < len(runs):
            lost += [run_id for run_id, sent_at in runs if sent_at and sent_at < sent_before]
    return lost


# --------------------------------------------------------------------------------------------
# The user's actions
# --------------------------------------------------------------------------------------------


def annotate(
    session: Session,
    run: Run,
    *,
    note: str | None = None,
    tags: list[str] | None = None,
    model_shared: bool | None = None,
) -> Run:
    """Set the run's note, tags and/or whether its model is shared (what ``None`` leaves
    alone). ``updated_at`` moves, so open pages get the change on their live stream."""
    values: dict[str, Any] = {"updated_at": utcnow()}
    if note is not None:
        values["note"] = note
    if tags is not None:
        values["tags"] = list(dict.fromkeys(tags))  # one of each, in the order given
    if model_shared is not None:
        values["model_shared"] = model_shared
    session.execute(update(Run).where(Run.id == run.id).values(**values))
    session.commit()
    session.refresh(run)
    return run


def request_cancel(session: Session, run: Run) -> Run:
    """queued → cancelled at once; running → cancel requested (the worker stops within
    seconds and finishes it as cancelled); a running external run → cancelled (nobody else
    would close it). A finished run (as ``run`` was read) is refused with ``Conflict``: no
    transition leaves a final state. One that finishes meanwhile keeps the status it finished
    with (the conditional updates below match nothing)."""
    if run.status in FINISHED:
        raise Conflict(
            f"run {run.id} is {run.status}; only a queued or running run can be cancelled"
        )
    now = utcnow()
    at_once = {"status": RunStatus.cancelled, "finished_at": now}
    asked = {"cancel_requested": True, "updated_at": now}
    if run.status == RunStatus.queued:
        done = session.execute(
            update(Run)
            .where(Run.id == run.id, Run.status == RunStatus.queued)
            .values(**asked, **at_once)
        )
        if not _rows(done):  # a worker claimed it meanwhile: ask it to stop
            session.execute(update(Run).where(Run.id == run.id).values(**asked))
    elif run.status == RunStatus.running:
        values = {**asked, **at_once} if run.external else asked
        session.execute(
            update(Run).where(Run.id == run.id, Run.status == RunStatus.running).values(**values)
        )
    session.commit()
    session.refresh(run)
    return run


def delete_run(session: Session, run: Run) -> None:
    """Cancel if active, then remove the run and everything logged for it."""
    if run.status not in FINISHED:
        request_cancel(session, run)
    # The run row first: it waits for a writer holding the row's lock to commit, and a writer
    # that comes later finds no run and writes nothing (metrics and rollouts have no foreign
    # key to cascade), so the deletes below catch every point.
    session.execute(delete(Run).where(Run.id == run.id))
    for model in (
        Metric, MetricRollup, RolloutStep, RolloutText, PromptStat, RunLogChunk, EvalAnswer
    ):  # fmt: skip
        session.execute(delete(model).where(model.run_id == run.id))
    session.commit()


# --------------------------------------------------------------------------------------------
# External runs
# --------------------------------------------------------------------------------------------


def open_external(
    session: Session,
    owner: User,
    *,
    name: str,
    config: dict[str, Any],
    algorithm: str,
    task: str,
    model: str,
    tags: Sequence[str],
    total_steps: int | None,
) -> Run:
    """(none) → running: a run that nothing queues; a trainer elsewhere logs into it."""
    seed = config.get("seed")
    now = utcnow()
    run = Run(
        name=name,
        owner_id=owner.id,
        status=RunStatus.running,
        algorithm=algorithm,
        task=task,
        model=model,
        config=config,
        seed=seed if type(seed) is int and 0 <= seed < 2**63 else 0,
        tags=list(dict.fromkeys(tags)),
        total_steps=total_steps or 0,
        started_at=now,
        heartbeat_at=now,
        external=True,
        summary={},
    )
    commit_named(session, [run])
    session.refresh(run)
    return run


def check_accepts_points(run: Run) -> None:
    """Raise ``Conflict`` unless ``run`` is an external run still running."""
    if not run.external:
        raise Conflict(f"run {run.id} is run by a worker; only external runs accept logged points")
    if run.status in FINISHED:
        raise Conflict(f"run {run.id} is {run.status}; it accepts no more points")


def close_external(
    session: Session, run_id: int, status: RunStatus, error: str | None = None
) -> bool:
    """running → succeeded | failed for an external run (its client says how it ended)."""
    if status not in (RunStatus.succeeded, RunStatus.failed):
        raise ValueError(f"an external run closes as succeeded or failed, not {status!r}")
    now = utcnow()
    values: dict[str, Any] = {"status": status, "finished_at": now, "updated_at": now}
    if error is not None:
        values["error"] = error
    done = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.external.is_(True), Run.status == RunStatus.running)
        .values(**values)
    )
    return _rows(done) > 0
