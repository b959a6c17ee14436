"""``run_training(run_id)``: claim the run, train it with a DB sink, record how it ended.

The task is thin and idempotent: a duplicate or redelivered message finds the run already
claimed (or finished) and does nothing; a resumed attempt continues from the checkpoint in
``data_dir/runs/<id>``.

How an attempt ends:

* the trainer finished, or honoured a cancel request: ``finish`` (succeeded / cancelled);
* the run raised: ``fail``, with the traceback; out of GPU memory, the message first says what
  to change in the config (the run's own error: never retried); a config over this worker's
  limits (``backend.runs.inputs.refuse_on_worker``: a tool call's timeout) fails before it
  loads anything, the limit first;
* the worker is shutting down (SIGTERM, ``worker.shutdown``): the trainer stops at the next
  step boundary and checkpoints, and ``release`` hands the run back to the queue;
* the database stayed unreachable past ``db_retry_limit_s``: the run is not the culprit, so it
  is not failed; the worker stops training and releases the run once the database answers;
* the run was deleted or another attempt took it over: nothing more is written;
* the training thread holds the interpreter so long that the heartbeat cannot run (a cancel
  unanswered, the heartbeat stalled): ``worker.watchdog``, a process beside the attempt,
  records the cancel and kills this process (the reaper re-queues a stalled run).

Database errors on the way (claim, heartbeat, sink, finish) are retried by one ``Outage`` per
attempt (``worker.retry``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import threading
import traceback
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from celery.exceptions import Reject
from sqlalchemy import select

from backend.config import Settings, get_settings
from backend.db import Database
from backend.models import Run, RunStatus, utcnow
from backend.pipelines import service as pipelines
from backend.runs import inputs as run_inputs
from backend.runs import lifecycle
from backend.runs.queue import TASK_NAME, JobQueue
from backend.runs.scheduling import resources_of
from backend.storage.runs import config_of
from backend.studies import service as studies
from worker import watchdog
from worker.celery_app import celery_app, database
from worker.db_sink import DbSink, RunGone
from worker.retry import DatabaseUnavailable, Outage, is_transient, short
from worker.run_log import Redactor, RunLogCapture, secrets_of
from worker.shutdown import SHUTDOWN, Interrupt

if TYPE_CHECKING:
    from conspo.launch import RayCluster

log = logging.getLogger(__name__)

RELEASE_ON_SHUTDOWN_S = 5.0  # well inside the compose stop grace period


STOPPING = "the worker is shutting down; the job goes back to the queue"


@celery_app.task(name=TASK_NAME, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_training(run_id: int) -> str:
    if SHUTDOWN.is_set():  # delivered while this worker stops (even our own release's job)
        raise Reject(STOPPING, requeue=True)
    settings = get_settings()
    db, jobs = database(), JobQueue(celery_app, settings.queue)
    try:
        first = interrupted_waiting(db, settings, run_id)
    except Exception as exc:  # the database away: this job's own run, as before (it retries)
        log.warning("run %s: could not look for interrupted runs (%s)", run_id, short(exc))
        first = None
    if first is not None:
        # An interrupted run goes before a fresh one (its message went to the back of the
        # queue when it was handed back or re-queued); its own message, when it comes, finds it
        # taken and is skipped.
        log.info("run %s: run %s was interrupted and waits; it resumes first", run_id, first)
        execute_run(db, jobs, settings, first)
        if SHUTDOWN.is_set():
            raise Reject(STOPPING, requeue=True)
    return execute_run(db, jobs, settings, run_id)


def interrupted_waiting(db: Database, settings: Settings, run_id: int) -> int | None:
    """When ``run_id`` is a fresh run: the queued run interrupted longest ago (an attempt
    behind it: handed back by a stopping worker, or re-queued after its worker died) that this
    worker can hold, else None."""
    from worker.capabilities import capacity

    holds = capacity(settings).holds
    with db.session() as session:
        fresh = session.execute(select(Run.attempt).where(Run.id == run_id)).scalar()
        if fresh is None or fresh > 0:
            return None
        waiting = session.execute(
            select(Run.id, Run.config)
            .where(
                Run.status == RunStatus.queued,
                Run.attempt > 0,
                Run.external.is_(False),
                Run.cancel_requested.is_(False),
                Run.id != run_id,
            )
            .order_by(Run.updated_at, Run.id)
            .limit(20)
        ).all()
    for other, config in waiting:
        if holds(resources_of(config)):
            return int(other)
    return None


def rerouted(db: Database, jobs: JobQueue, settings: Settings, run_id: int) -> bool:
    """True when this worker cannot hold the run (its job came on a queue this worker should
    not serve: sent before the run's queue existed, or a hand-started worker with the wrong
    ``-Q``): the job is sent on to the run's own queue, which this worker does not consume, so
    it never comes back here."""
    from worker.capabilities import capacity

    with db.session() as session:
        config = config_of(session, run_id)
    resources = resources_of(config)
    if config is None or capacity(settings).holds(resources):
        return False
    log.warning(
        "run %s needs %s: not here; sent to %s", run_id, resources, jobs.queue_for(resources)
    )
    jobs.publish(run_id, resources)
    return True


def claim(db: Database, settings: Settings, run_id: int) -> Run | None:
    """The run for a new attempt, or None when it is not claimable (``lifecycle.claim``)."""
    stale_before = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)
    with db.session() as session:
        return lifecycle.claim(
            session,
            run_id,
            host=socket.gethostname(),
            stale_before=stale_before,
            max_attempts=settings.max_attempts,
        )


class Heartbeat(threading.Thread):
    """Refreshes heartbeat_at and reads cancel_requested every few seconds.

    A failed beat is tried again at the next one (the database may be restarting); once the
    outage outlasts its limit the attempt is asked to stop (``outage_too_long``).
    """

    def __init__(
        self, db: Database, run_id: int, attempt: int, interval: float, outage: Outage
    ) -> None:
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.db, self.run_id, self.attempt, self.interval = db, run_id, attempt, interval
        self.outage = outage
        self.stop_requested = threading.Event()  # cancel asked, run lost, or database gone
        self.last_beat: lifecycle.Beat | None = None
        self.outage_too_long = False
        self._done = threading.Event()

    def beat(self) -> None:
        with self.db.session() as session:
            beat = lifecycle.heartbeat(session, self.run_id, self.attempt)
        self.last_beat = beat
        if beat is not lifecycle.Beat.OWNED:
            self.stop_requested.set()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.beat()
                self.outage.recovered()
            except Exception as exc:
                if self._note_failure(exc):
                    return

    def _note_failure(self, exc: Exception) -> bool:
        """Log a failed beat; True when the attempt must stop (the outage is too long)."""
        if not is_transient(exc):
            log.exception("run %s: heartbeat failed", self.run_id)
            return False
        try:
            self.outage.failed(f"run {self.run_id}: heartbeat", exc)
        except DatabaseUnavailable as gone:
            log.error("%s; stopping the attempt", gone)
            self.outage_too_long = True
            self.stop_requested.set()
            return True
        return False

    @property
    def lost(self) -> bool:
        return self.last_beat is lifecycle.Beat.LOST

    @property
    def cancel_requested(self) -> bool:
        return self.last_beat is lifecycle.Beat.CANCEL_REQUESTED

    def finish(self) -> None:
        self._done.set()


def device_and_dtype(config: Any) -> tuple[str, str]:
    """Where and in what dtype ``config`` trains here: ("cuda:0 (NVIDIA H200)", "bfloat16")."""
    from conspo.models.loading import describe_device, pick_device

    device, dtype = pick_device(config.model)
    return describe_device(device, dtype), str(dtype).removeprefix("torch.")


OUT_OF_MEMORY_ADVICE = (
    "lower sampling.prompts_per_step, sampling.group_size or sampling.max_new_tokens, raise"
    " optim.mini_batches or set optim.micro_batch_tokens, turn on"
    " model.gradient_checkpointing, train LoRA adapters (model.lora.rank), or pick a smaller"
    " model"
)


def out_of_memory_message(exc: BaseException) -> str | None:
    """The first line of a run's error when ``exc`` is running out of device memory, else None.

    The trainer turns the allocator's error into ``conspo.models.resources.OutOfMemory``, whose
    message gives the estimate and the settings to change; torch's own error (raised outside a step,
    e.g. while loading the model) gets the same advice without the numbers.
    """
    import torch

    from conspo.models.resources import OutOfMemory

    if isinstance(exc, OutOfMemory):
        return str(exc)
    if isinstance(exc, torch.OutOfMemoryError):
        first = str(exc).split("\n", 1)[0]
        return f"out of device memory ({first}); {OUT_OF_MEMORY_ADVICE}"
    return None


def _first_line(exc: BaseException) -> str | None:
    """What a failed run's error says before its traceback, when the failure is the config's
    and the traceback would bury it: out of device memory, or refused by this worker."""
    if isinstance(exc, run_inputs.Refused):
        return f"refused by this worker: {exc}"
    return out_of_memory_message(exc)


class Ending(Enum):
    FINISH = "finish"  # record the status (succeeded, cancelled, failed)
    RELEASE = "release"  # hand the run back to the queue
    GONE = "gone"  # write nothing: deleted, or another attempt owns it


@dataclass
class Outcome:
    ending: Ending
    status: RunStatus | None = None
    error: str | None = None


def execute_run(
    db: Database,
    jobs: JobQueue,
    settings: Settings,
    run_id: int,
    shutdown: Interrupt = SHUTDOWN,
) -> str:
    outage = Outage(settings.db_retry_limit_s, interrupt=shutdown)
    try:
        if outage.call(f"run {run_id}: route", lambda: rerouted(db, jobs, settings, run_id)):
            return "rerouted"
        run = outage.call(f"run {run_id}: claim", lambda: claim(db, settings, run_id))
    except DatabaseUnavailable as exc:  # still queued: the reaper re-sends it (stranded)
        log.error("%s; leaving the run queued", exc)
        return "database unavailable"
    if run is None:
        log.info("run %s: not claimable (already taken, finished or cancelled); skipping", run_id)
        return "skipped"
    if run.attempt == 1:
        clear_stale_run_dir(settings, run.id)
    heartbeat = Heartbeat(db, run_id, run.attempt, settings.heartbeat_interval_s, outage)
    heartbeat.start()
    guard = watchdog.start(settings, run_id, run.attempt)  # for when the heartbeat cannot run
    try:
        with capture_log(db, settings, run):
            outcome = train_attempt(db, settings, run, heartbeat, outage, shutdown)
    finally:
        heartbeat.finish()
        watchdog.stop(guard)
        _free_device_memory()
    return record(db, jobs, settings, run, outcome, outage, shutdown)


def clear_stale_run_dir(settings: Settings, run_id: int) -> None:
    """Empty the directory of a run's first attempt. A first attempt has nothing to resume, so
    whatever is there belongs to a deleted run whose id was given again (SQLite reuses the
    largest id once its row is gone): resuming its checkpoints would train the new run from
    another run's weights, or fail on them (a full model where the new run trains LoRA)."""
    workdir = settings.run_dir(run_id)
    if workdir.exists():
        log.warning("run %s: first attempt, removing a deleted run's files: %s", run_id, workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def capture_log(
    db: Database, settings: Settings, run: Run
) -> contextlib.AbstractContextManager[object]:
    """What the attempt prints, into the run's log (``worker.run_log``); where the capture
    cannot start (no room for its file), the run trains without one rather than not at all."""
    path = settings.run_dir(run.id) / "logs" / f"attempt-{run.attempt}.txt"
    capture = RunLogCapture(db, run.id, run.attempt, path, Redactor(secrets_of(settings)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("run %s: no log captured (%s)", run.id, exc)
        return contextlib.nullcontext()
    return capture


def train_attempt(
    db: Database,
    settings: Settings,
    run: Run,
    heartbeat: Heartbeat,
    outage: Outage,
    shutdown: Interrupt,
) -> Outcome:
    """Train the claimed run; how the attempt ended (nothing is recorded yet)."""
    from conspo import stopping
    from conspo.config import RunConfig
    from conspo.launch import launch
    from worker.job_inputs import prepare

    sink = DbSink(db, run.id, run.attempt, outage=outage)
    try:
        config = RunConfig.model_validate(run.config)
        run_inputs.refuse_on_worker(config, settings)  # this worker's limits, not the API's
        device, dtype = device_and_dtype(config)
        outage.call(
            f"run {run.id}: describe the attempt",
            lambda: _describe(db, run, device, dtype, config.steps),
        )
        workdir = settings.run_dir(run.id)
        workdir.mkdir(parents=True, exist_ok=True)
        # the job kind's train function (rl: conspo.training.trainer.train), on the prepared inputs
        # and on the processes the config's resources ask for (conspo.launch)
        config, store = prepare(db, settings, config, workdir)
        # A cancel (or an attempt taken over) abandons the run inside any phase within seconds
        # (conspo.stopping); a shutdown still stops at the next step boundary, to be resumed.
        with stopping.abandon_when(lambda: heartbeat.cancel_requested or heartbeat.lost):
            result = launch(
                config,
                sink,
                lambda: heartbeat.stop_requested.is_set() or shutdown.is_set(),
                workdir=workdir,
                model_store=store,
                files=run_inputs.data_files(settings),
                memory_limit=run_inputs.memory_limit(settings),
                ray=on_ray(db, settings, run, outage) if config.resources.nodes > 1 else None,
            )
    except stopping.Abandoned:  # a job kind outside conspo's loop let it through
        _flush_quietly(sink)
        return _why_stopped(heartbeat, shutdown)
    except RunGone as exc:
        log.warning("%s; stopping", exc)
        return Outcome(Ending.GONE)
    except DatabaseUnavailable as exc:
        log.error("%s; handing the run back", exc)
        return Outcome(Ending.RELEASE)
    except Exception as exc:
        if is_transient(exc):  # a database error on a path without retries: not the run's fault
            log.error("run %s: %s; handing the run back", run.id, short(exc))
            return Outcome(Ending.RELEASE)
        error = traceback.format_exc()[-20_000:]
        if (first := _first_line(exc)) is not None:
            error = f"{first}\n\n{error}"
        log.error("run %s failed:\n%s", run.id, error)
        _flush_quietly(sink)
        return Outcome(Ending.FINISH, RunStatus.failed, error)
    if result.status == "succeeded":
        return Outcome(Ending.FINISH, RunStatus.succeeded)
    return _why_stopped(heartbeat, shutdown)


def on_ray(db: Database, settings: Settings, run: Run, outage: Outage) -> RayCluster:
    """Where a multi-node run goes: the Ray cluster at ``ray_address``
    (``conspo.launch.ray_cluster``), its Ray job recorded on the run. ``workdir`` must be on
    storage every Ray node shares; a later attempt resubmits and resumes from its checkpoint."""
    from conspo.launch import RayCluster

    def submitted(ray_job_id: str) -> None:
        def write() -> None:
            with db.session() as session:
                lifecycle.record_ray_job(session, run.id, run.attempt, ray_job_id)

        outage.call(f"run {run.id}: record the Ray job", write)

    return RayCluster(settings.ray_address, f"conspo-run-{run.id}-a{run.attempt}", submitted)


def _why_stopped(heartbeat: Heartbeat, shutdown: Interrupt) -> Outcome:
    """The trainer stopped early: a cancel request wins over a shutdown."""
    if heartbeat.lost:
        return Outcome(Ending.GONE)
    if heartbeat.cancel_requested:
        return Outcome(Ending.FINISH, RunStatus.cancelled)
    if heartbeat.outage_too_long or shutdown.is_set():
        return Outcome(Ending.RELEASE)
    return Outcome(Ending.FINISH, RunStatus.cancelled)


def _describe(db: Database, run: Run, device: str, dtype: str, total_steps: int) -> None:
    with db.session() as session:
        lifecycle.describe_attempt(
            session, run.id, run.attempt, device=device, dtype=dtype, total_steps=total_steps
        )


def record(
    db: Database,
    jobs: JobQueue,
    settings: Settings,
    run: Run,
    outcome: Outcome,
    outage: Outage,
    shutdown: Interrupt,
) -> str:
    """Write how the attempt ended, retrying database errors; returns it for Celery's log."""
    if outcome.ending is Ending.GONE:
        return "gone"
    try:
        if outcome.ending is Ending.RELEASE:
            return release(db, jobs, settings, run, shutdown)
        assert outcome.status is not None
        status = outcome.status
        outage.call(
            f"run {run.id}: record {status}",
            lambda: _finish(db, jobs, run, status, outcome.error),
        )
        _release_study_runs(db, jobs, run.id)
        return str(status)
    except DatabaseUnavailable as exc:  # the heartbeat goes stale: the reaper takes over
        log.error("%s; the run is left to the reaper", exc)
        return "database unavailable"


def _finish(db: Database, jobs: JobQueue, run: Run, status: RunStatus, error: str | None) -> None:
    with db.session() as session:
        lifecycle.finish(session, run.id, run.attempt, status, error=error)
        if status is RunStatus.succeeded:  # a pipeline's next stage, created by finish
            try:
                pipelines.send_next_stage(session, jobs, run.id)
            except lifecycle.QueueUnavailable:
                log.warning("run %s: next pipeline stage not sent; a reaper will send it", run.id)


def _release_study_runs(db: Database, jobs: JobQueue, run_id: int) -> None:
    """A finished run frees a slot of its study: release the next pending runs now (the
    reapers' pass does it too, so a failure here only delays them)."""
    try:
        with db.session() as session:
            studies.release_for_run(session, jobs, run_id)
    except Exception as exc:
        log.warning("run %s: releasing its study's next runs failed (%s)", run_id, short(exc))


def release(db: Database, jobs: JobQueue, settings: Settings, run: Run, shutdown: Interrupt) -> str:
    """Hand the run back to the queue and send it (a failed send is retried by the reapers'
    ``unsent`` pass). The attempt has stopped, so the database is waited for as long as it
    takes, unless the worker is shutting down: then for ``RELEASE_ON_SHUTDOWN_S`` at most, and
    a run still not released is left to the reaper (its heartbeat goes stale)."""
    shutting_down = shutdown.is_set()
    patient = Outage(
        RELEASE_ON_SHUTDOWN_S if shutting_down else float("inf"),
        interrupt=None if shutting_down else shutdown,
        max_delay_s=min(10.0, settings.heartbeat_timeout_s / 4),
    )

    def hand_back() -> RunStatus | None:
        with db.session() as session:
            status = lifecycle.release(session, run.id, run.attempt)
            if status is RunStatus.queued:
                _send_quietly(session, jobs, run.id)
            return status

    status = patient.call(f"run {run.id}: release", hand_back)
    log.warning("run %s: stopped at a step boundary; %s", run.id, status or "no longer ours")
    return f"released ({status})" if status else "gone"


def _send_quietly(session: Any, jobs: JobQueue, run_id: int) -> None:
    try:
        lifecycle.send(session, jobs, run_id)
    except lifecycle.QueueUnavailable:
        log.warning("run %s: released but not sent; a reaper will send it", run_id)


def _free_device_memory() -> None:
    """Return the finished attempt's cached GPU memory, so that the next run on this worker (after
    an out-of-memory one above all) starts with the whole device."""
    import gc

    import torch

    gc.collect()  # tensors held in reference cycles (a failed attempt's frames) go first
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _flush_quietly(sink: DbSink) -> None:
    """Keep the steps a failed run logged before it failed (they are real; best effort)."""
    try:
        sink.flush()
    except Exception:  # the run is gone or the database is down: the error says enough
        log.warning("run %s: could not store the last buffered steps", sink.run_id)
