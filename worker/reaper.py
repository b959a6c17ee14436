"""Recover runs nobody is working on: stale heartbeats and queued runs never handed over.

* ``running`` with ``heartbeat_at`` older than ``heartbeat_timeout_s`` (its worker was killed):
  status back to ``queued`` and a new task sent; the next worker resumes from the checkpoint in
  ``data_dir/runs/<id>``. A run whose cancel was requested is marked cancelled instead.
* ``queued`` with ``enqueued_at`` NULL for longer than ``unsent_grace_s`` (the API died between
  committing the row and publishing): published now.

Every transition is one of ``backend.lifecycle``'s conditional UPDATEs, so concurrent reapers
(one per worker) never double up.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from backend import lifecycle
from backend.config import Settings
from backend.db import Database
from backend.models import utcnow
from backend.queue import JobQueue

log = logging.getLogger(__name__)


def reap(db: Database, jobs: JobQueue, settings: Settings) -> list[int]:
    """One pass; returns the ids (re-)sent to the queue."""
    now = utcnow()
    stale_before = now - timedelta(seconds=settings.heartbeat_timeout_s)
    sent: list[int] = []
    with db.session() as session:
        recovered = lifecycle.requeue_stale(session, stale_before)
        for run_id in recovered.cancelled:
            log.warning("run %s: worker gone after a cancel request; marked cancelled", run_id)
        for run_id in recovered.queued:
            log.warning("run %s: heartbeat stale since %s; re-queued", run_id, stale_before)
        unsent_before = now - timedelta(seconds=settings.unsent_grace_s)
        for run_id in dict.fromkeys([*recovered.queued, *lifecycle.unsent(session, unsent_before)]):
            try:
                if lifecycle.send(session, jobs, run_id):
                    sent.append(run_id)
            except lifecycle.QueueUnavailable:  # retried on the next pass
                log.warning("run %s: re-send failed; will retry", run_id)
    return sent


class ReaperThread(threading.Thread):
    def __init__(self, db: Database, jobs: JobQueue, settings: Settings) -> None:
        super().__init__(name="conspo-reaper", daemon=True)
        self.db, self.jobs, self.settings = db, jobs, settings
        self._stop_event = threading.Event()

    def reap_once(self) -> list[int]:
        try:
            return reap(self.db, self.jobs, self.settings)
        except Exception:  # a database hiccup must not kill the thread
            log.exception("reaper pass failed")
            return []

    def run(self) -> None:
        while not self._stop_event.wait(self.settings.reaper_period_s):
            self.reap_once()

    def stop(self) -> None:
        self._stop_event.set()
