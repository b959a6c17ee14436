"""A ``conspo.sink.Sink`` that buffers steps and writes them to the database in batches.

One transaction per batch (``backend.storage.writes.write_points``): every buffered metric,
rollout and prompt pass rate in bulk, plus one update of the run row (step, summary, heartbeat;
only while this attempt still owns the run). A batch is written when ``flush()`` is called, when
the buffer holds ``max_points`` metric points, rollout rows and prompt rows, or when a step
arrives ``max_delay_s`` after the last write (so dashboards stay live whatever the step rate).

Database outages: with an ``Outage`` the write is retried with backoff (see ``worker.retry``).
Past its limit ``DatabaseUnavailable`` propagates through the trainer (so no checkpoint is saved
that covers steps the database lacks) and the worker hands the run back without failing it.

Crash safety: the trainer calls ``flush()`` before it saves each checkpoint and before it ends,
so a checkpoint never covers a step the database lacks. A crash loses at most the buffered
steps after the last checkpoint, which the resumed attempt re-emits; the upserts on
(run_id, key, step), (run_id, step, group, index) and (run_id, step, prompt_key) make a
re-emitted step that was already stored an overwrite, not a duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from backend.db import Database
from backend.models import utcnow
from backend.storage.writes import StepPoints, write_points
from conspo.sink import StepRecord
from worker.retry import Outage

log = logging.getLogger(__name__)


class RunGone(Exception):
    """The run was deleted, or another attempt owns it now: stop writing."""


class DbSink:
    def __init__(
        self,
        db: Database,
        run_id: int,
        attempt: int,
        *,
        max_points: int = 20_000,
        max_delay_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        outage: Outage | None = None,
    ) -> None:
        self.db = db
        self.outage = outage  # retries database errors; None: they are raised at once
        self.run_id = run_id
        self.attempt = attempt
        self.max_points = max_points
        self.max_delay_s = max_delay_s
        self.clock = clock
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._buffer: dict[int, StepRecord] = {}  # by step: a re-emitted step replaces its twin
        self._buffered = 0  # metric points + rollout and prompt rows in the buffer
        self._last_write = clock()

    def log_step(self, record: StepRecord) -> None:
        """Buffer the step; write the buffer when it is full or the last write is old."""
        old = self._buffer.pop(record.step, None)
        if old is not None:
            self._buffered -= _rows(old)
        self._buffer[record.step] = record
        self._buffered += _rows(record)
        if self._buffered >= self.max_points or self.clock() - self._last_write >= self.max_delay_s:
            self.flush()

    def flush(self) -> None:
        """Write every buffered step in one transaction (nothing to do when empty).

        With an ``outage``, a dropped connection or a locked database is retried (the write is
        an upsert, so a batch whose commit did land before the error is simply written again).
        """
        self._last_write = self.clock()
        if not self._buffer:
            return
        what = f"run {self.run_id}: storing steps"
        owned = self.outage.call(what, self._write) if self.outage else self._write()
        self._buffer.clear()
        self._buffered = 0
        if not owned:
            raise RunGone(f"run {self.run_id} was deleted or taken over")

    def _write(self) -> bool:
        """One transaction for the whole buffer; False when the attempt no longer owns the run."""
        records = list(self._buffer.values())
        steps = [StepPoints(r.step, r.metrics, r.wall_time, r.rollouts, r.prompts) for r in records]
        latest = max(records, key=lambda r: r.step)
        with self.db.session() as session:
            written = write_points(
                session,
                self.run_id,
                steps,
                owner_attempt=self.attempt,
                run_values={"heartbeat_at": utcnow(), "total_steps": latest.total_steps},
            )
            if not written.owned:
                session.rollback()
                return False
            session.commit()
        return True

    @property
    def buffered_steps(self) -> list[int]:
        return sorted(self._buffer)

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))
        log.info("run %s: %s %s", self.run_id, kind, data)


def _rows(record: StepRecord) -> int:
    """The rows a step adds to a write: metric points, sampled rollouts and prompts."""
    return len(record.metrics) + len(record.rollouts) + len(record.prompts)
