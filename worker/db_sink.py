"""A ``conspo.sink.Sink`` that writes each step to the database in one transaction.

``log_step`` runs before the trainer checkpoints that step, so a checkpoint never covers a step
the database lacks; after a resume the trainer re-emits the steps after its checkpoint, and the
upserts on (run_id, key, step) overwrite them instead of duplicating.
"""

from __future__ import annotations

import logging
from typing import Any

from backend.db import Database
from backend.models import utcnow
from backend.storage import RolloutPoint, StepPoints, write_points
from conspo.sink import StepRecord

log = logging.getLogger(__name__)


class RunGone(Exception):
    """The run was deleted, or another attempt owns it now: stop writing."""


class DbSink:
    def __init__(self, db: Database, run_id: int, attempt: int) -> None:
        self.db = db
        self.run_id = run_id
        self.attempt = attempt
        self.events: list[tuple[str, dict[str, Any]]] = []

    def log_step(self, record: StepRecord) -> None:
        """One transaction: metrics + rollouts upserted, step/summary/heartbeat of the run."""
        step = StepPoints(record.step, record.metrics, record.wall_time)
        rollouts = [
            RolloutPoint(record.step, r.group, r.index, r.reward, r.score, r.length, r.truncated)
            for r in record.rollouts
        ]
        with self.db.session() as session:
            written = write_points(
                session,
                self.run_id,
                [step],
                rollouts,
                owner_attempt=self.attempt,
                run_values={"heartbeat_at": utcnow(), "total_steps": record.total_steps},
            )
            if not written.owned:
                session.rollback()
                raise RunGone(f"run {self.run_id} was deleted or taken over")
            session.commit()

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))
        log.info("run %s: %s %s", self.run_id, kind, data)
