"""``run_training(run_id)``: claim the run, train it with a DB sink, record how it ended.

The task is thin and idempotent: a duplicate or redelivered message finds the run already
claimed (or finished) and does nothing; a resumed attempt continues from the checkpoint in
``data_dir/runs/<id>``.
"""

from __future__ import annotations

import logging
import socket
import threading
import traceback
from datetime import timedelta
from functools import lru_cache
from typing import Any

from backend import lifecycle, run_inputs
from backend.config import Settings, get_settings
from backend.db import Database
from backend.models import Run, RunStatus, utcnow
from backend.queue import TASK_NAME
from worker.celery_app import celery_app
from worker.db_sink import DbSink, RunGone

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def database() -> Database:
    return Database(get_settings())


@celery_app.task(name=TASK_NAME, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_training(run_id: int) -> str:
    return execute_run(database(), get_settings(), run_id)


def claim(db: Database, settings: Settings, run_id: int) -> Run | None:
    """The run for a new attempt, or None when it is not claimable (``lifecycle.claim``)."""
    stale_before = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)
    with db.session() as session:
        return lifecycle.claim(
            session, run_id, host=socket.gethostname(), stale_before=stale_before
        )


class Heartbeat(threading.Thread):
    """Refreshes heartbeat_at and reads cancel_requested every few seconds."""

    def __init__(self, db: Database, run_id: int, attempt: int, interval: float) -> None:
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.db, self.run_id, self.attempt, self.interval = db, run_id, attempt, interval
        self.stop_requested = threading.Event()  # cancel asked, run deleted or taken over
        self.lost = False
        self._done = threading.Event()

    def beat(self) -> None:
        with self.db.session() as session:
            beat = lifecycle.heartbeat(session, self.run_id, self.attempt)
        if beat is lifecycle.Beat.LOST:
            self.lost = True
        if beat is not lifecycle.Beat.OWNED:
            self.stop_requested.set()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.beat()
            except Exception:  # a database hiccup: try again next beat
                log.exception("run %s: heartbeat failed", self.run_id)

    def finish(self) -> None:
        self._done.set()


def device_name(config: Any) -> str:
    import torch

    want = config.model.device
    if want != "cpu" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    return "cpu"


def execute_run(db: Database, settings: Settings, run_id: int) -> str:
    run = claim(db, settings, run_id)
    if run is None:
        log.info("run %s: not claimable (already taken, finished or cancelled); skipping", run_id)
        return "skipped"
    attempt = run.attempt
    heartbeat = Heartbeat(db, run_id, attempt, settings.heartbeat_interval_s)
    heartbeat.start()
    status, error = RunStatus.failed, None
    sink = DbSink(db, run_id, attempt)
    try:
        from conspo.config import RunConfig
        from conspo.models import ModelStore
        from conspo.trainer import train

        config = RunConfig.model_validate(run.config)
        with db.session() as session:
            lifecycle.describe_attempt(
                session, run_id, attempt, device=device_name(config), total_steps=config.steps
            )
        workdir = settings.run_dir(run_id)
        workdir.mkdir(parents=True, exist_ok=True)
        result = train(
            config,
            sink,
            heartbeat.stop_requested.is_set,
            workdir=workdir,
            model_store=ModelStore(settings.model_store, run_inputs.model_sources(settings)),
            files=run_inputs.data_files(settings),
            memory_limit=run_inputs.memory_limit(settings),
        )
        status = RunStatus.succeeded if result.status == "succeeded" else RunStatus.cancelled
    except RunGone as exc:
        log.warning("%s; stopping", exc)
        return "gone"
    except Exception:
        error = traceback.format_exc()[-20_000:]
        log.error("run %s failed:\n%s", run_id, error)
        _flush_quietly(sink)
    finally:
        heartbeat.finish()
    if heartbeat.lost:
        return "gone"
    with db.session() as session:
        lifecycle.finish(session, run_id, attempt, status, error=error)
    return str(status)


def _flush_quietly(sink: DbSink) -> None:
    """Keep the steps a failed run logged before it failed (they are real; best effort)."""
    try:
        sink.flush()
    except Exception:  # the run is gone or the database is down: the error says enough
        log.warning("run %s: could not store the last buffered steps", sink.run_id)
