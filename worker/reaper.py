"""Recover runs nobody is working on, and keep this worker's liveness row fresh.

* ``running`` with ``heartbeat_at`` older than ``heartbeat_timeout_s`` (its worker was killed):
  back to ``queued`` with one more worker death and a new task sent; the next worker resumes
  from the checkpoint in ``data_dir/runs/<id>``. At ``max_attempts`` deaths the run fails
  instead; a run whose cancel was requested is marked cancelled.
* ``queued`` with ``enqueued_at`` NULL for longer than ``unsent_grace_s`` (the API died between
  committing the row and publishing, or a worker released it and could not send it): published.
* ``queued``, sent more than ``unclaimed_resend_s`` ago and still unclaimed while the broker's
  queue holds fewer jobs than runs waiting (Redis lost them: no persistence, the AOF fsync
  window, a failover): published again (``lifecycle.stranded``).
* shared-memory directories whose process is gone (the vLLM weights of a trainer killed with
  ``kill -9``): removed (``conspo.generation.shm_dirs``).

Every transition is one of ``backend.runs.lifecycle``'s conditional UPDATEs, so concurrent reapers
(one per worker) never double up. Stale heartbeats are only acted on once this reaper has
reached the database for a whole ``heartbeat_timeout_s``: after an outage, every heartbeat is
stale because no worker could write one, not because the workers died.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from backend import liveness
from backend.config import Settings
from backend.db import Database
from backend.liveness import WorkerIdentity
from backend.models import utcnow
from backend.runs import lifecycle
from backend.runs.queue import JobQueue
from backend.studies import service as studies
from conspo.generation.shm_dirs import VLLM_PREFIX, remove_abandoned
from worker.retry import short

log = logging.getLogger(__name__)


def reap(
    db: Database, jobs: JobQueue, settings: Settings, *, requeue_stale: bool = True
) -> list[int]:
    """One pass; returns the ids (re-)sent to the queue."""
    now = utcnow()
    sent: list[int] = []
    with db.session() as session:
        requeued = _requeue_stale(session, settings, now) if requeue_stale else []
        unsent = lifecycle.unsent(session, now - timedelta(seconds=settings.unsent_grace_s))
        lost = _stranded(session, jobs, settings, now)
        released = _release_studies(session, jobs)
        for run_id in dict.fromkeys([*requeued, *unsent, *lost]):
            try:
                if lifecycle.send(session, jobs, run_id):
                    sent.append(run_id)
            except lifecycle.QueueUnavailable:  # retried on the next pass
                log.warning("run %s: re-send failed; will retry", run_id)
    return [*released, *sent]


def _release_studies(session: Session, jobs: JobQueue) -> list[int]:
    """Release the pending runs of studies with free slots (runs that failed, were cancelled
    or whose worker died free slots too; ``studies.release`` is idempotent)."""
    try:
        return studies.release_all(session, jobs)
    except Exception as exc:
        session.rollback()
        log.warning("releasing study runs failed (%s); will retry", short(exc))
        return []


def _requeue_stale(session: Session, settings: Settings, now: datetime) -> list[int]:
    stale_before = now - timedelta(seconds=settings.heartbeat_timeout_s)
    recovered = lifecycle.requeue_stale(session, stale_before, settings.max_attempts)
    for run_id in recovered.cancelled:
        log.warning("run %s: worker gone after a cancel request; marked cancelled", run_id)
    for run_id in recovered.failed:
        log.error("run %s: its worker died %s times; failed", run_id, settings.max_attempts)
    for run_id in recovered.queued:
        log.warning("run %s: heartbeat stale since %s; re-queued", run_id, stale_before)
    return recovered.queued


def _stranded(session: Session, jobs: JobQueue, settings: Settings, now: datetime) -> list[int]:
    sent_before = now - timedelta(seconds=settings.unclaimed_resend_s)
    try:
        lost = lifecycle.stranded(session, jobs, sent_before)
    except Exception as exc:  # the broker is down: nothing can be re-sent this pass anyway
        session.rollback()
        log.warning("cannot count the jobs in the queue (%s)", short(exc))
        return []
    if lost:
        log.warning("runs %s: sent but never claimed, and missing from the queue; re-sent", lost)
    return lost


class ReaperThread(threading.Thread):
    """Every ``reaper_period_s``: mark this worker alive, then ``reap``."""

    def __init__(
        self, db: Database, jobs: JobQueue, settings: Settings, me: WorkerIdentity | None = None
    ) -> None:
        super().__init__(name="conspo-reaper", daemon=True)
        self.db, self.jobs, self.settings = db, jobs, settings
        self.me = me or WorkerIdentity()
        self._stop_event = threading.Event()
        self._reachable_since: float | None = float("-inf")  # None: the last pass failed

    def reap_once(self) -> list[int]:
        started = time.monotonic()
        # Shared memory a trainer killed with kill -9 left (vLLM's weights), database or not.
        try:
            for path in remove_abandoned(VLLM_PREFIX):
                log.warning("removed %s: the process that made it is gone", path)
        except OSError as exc:
            log.warning("cleaning shared memory failed (%s)", short(exc))
        try:
            with self.db.session() as session:
                liveness.mark_alive(session, self.me)
            sent = reap(self.db, self.jobs, self.settings, requeue_stale=self._steady(started))
        except Exception as exc:  # a database outage must not kill the thread
            log.warning("reaper pass failed (%s)", short(exc))
            self._reachable_since = None
            return []
        if self._reachable_since is None:
            self._reachable_since = started
        return sent

    def _steady(self, now: float) -> bool:
        """Has the database answered this reaper for a whole heartbeat timeout?"""
        since = self._reachable_since
        return since is not None and now - since >= self.settings.heartbeat_timeout_s

    def run(self) -> None:
        while not self._stop_event.wait(self.settings.reaper_period_s):
            self.reap_once()

    def stop(self) -> None:
        """Stop reaping and remove this worker's liveness row (health stops counting it)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)
        try:
            with self.db.session() as session:
                liveness.mark_stopped(session, self.me)
        except Exception as exc:  # its row expires by itself
            log.warning("could not remove this worker's liveness row (%s)", short(exc))
