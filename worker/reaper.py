"""Recover runs nobody is working on: stale heartbeats and queued runs never handed over.

* ``running`` with ``heartbeat_at`` older than ``heartbeat_timeout_s`` (its worker was killed):
  status back to ``queued`` and a new task sent; the next worker resumes from the checkpoint in
  ``data_dir/runs/<id>``. A run whose cancel was requested is marked cancelled instead.
* ``queued`` with ``enqueued_at`` NULL for longer than ``unsent_grace_s`` (the API died between
  committing the row and publishing): published now.

Every transition is a conditional UPDATE, so concurrent reapers (one per worker) never double up.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from celery import Celery
from sqlalchemy import select, update

from backend.config import Settings
from backend.db import Database
from backend.models import Run, RunStatus, utcnow
from backend.queue import TASK_NAME

log = logging.getLogger(__name__)


def reap(db: Database, celery: Celery, settings: Settings) -> list[int]:
    """One pass; returns the ids (re-)sent to the queue."""
    now = utcnow()
    stale_before = now - timedelta(seconds=settings.heartbeat_timeout_s)
    sent: list[int] = []
    with db.session() as session:
        stale = session.scalars(
            select(Run.id).where(
                Run.status == RunStatus.running,
                Run.external.is_(False),
                Run.heartbeat_at < stale_before,
            )
        ).all()
        for run_id in stale:
            base = update(Run).where(
                Run.id == run_id,
                Run.status == RunStatus.running,
                Run.heartbeat_at < stale_before,
            )
            cancelled = session.execute(
                base.where(Run.cancel_requested.is_(True)).values(
                    status=RunStatus.cancelled, finished_at=now, updated_at=now
                )
            ).rowcount  # type: ignore[attr-defined]
            requeued = session.execute(
                base.values(status=RunStatus.queued, enqueued_at=None, updated_at=now)
            ).rowcount  # type: ignore[attr-defined]
            session.commit()
            if cancelled:
                log.warning("run %s: worker gone after a cancel request; marked cancelled", run_id)
            if requeued:
                log.warning("run %s: heartbeat stale since %s; re-queued", run_id, stale_before)
        unsent_before = now - timedelta(seconds=settings.unsent_grace_s)
        pending = session.scalars(
            select(Run.id).where(
                Run.status == RunStatus.queued,
                Run.enqueued_at.is_(None),
                Run.created_at < unsent_before,
            )
        ).all()
        for run_id in [*stale, *pending]:
            taken = session.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == RunStatus.queued, Run.enqueued_at.is_(None))
                .values(enqueued_at=utcnow())
            ).rowcount  # type: ignore[attr-defined]
            session.commit()
            if not taken:
                continue
            try:
                celery.send_task(TASK_NAME, args=[run_id], queue=settings.queue)
                sent.append(run_id)
            except Exception as exc:  # noqa: BLE001 - retried on the next pass
                log.warning("run %s: re-send failed (%s); will retry", run_id, type(exc).__name__)
                session.execute(update(Run).where(Run.id == run_id).values(enqueued_at=None))
                session.commit()
    return sent


class ReaperThread(threading.Thread):
    def __init__(self, db: Database, celery: Celery, settings: Settings) -> None:
        super().__init__(name="conspo-reaper", daemon=True)
        self.db, self.celery, self.settings = db, celery, settings
        self._stop_event = threading.Event()

    def reap_once(self) -> list[int]:
        try:
            return reap(self.db, self.celery, self.settings)
        except Exception:  # a database hiccup must not kill the thread
            log.exception("reaper pass failed")
            return []

    def run(self) -> None:
        while not self._stop_event.wait(self.settings.reaper_period_s):
            self.reap_once()

    def stop(self) -> None:
        self._stop_event.set()
