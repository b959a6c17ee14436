"""A ``conspo.sink.Sink`` that buffers steps and writes them to the database from a thread.

The training thread only buffers: ``log_step`` adds the step to the buffer and, when the buffer
holds ``max_points`` rows (metric points, prompts, and one row per step for its rollouts), or
when a step arrives ``max_delay_s`` after the last hand-over (so dashboards stay live whatever
the step rate) and the writer is idle, hands the whole buffer to a writer thread as one
batch. The writer stores each batch in one transaction (``backend.storage.writes``): every
metric, rollout and prompt pass rate in bulk, plus one update of the run row (step, summary,
heartbeat; only while this attempt still owns the run). While the database stores one batch,
a short-lived helper thread encodes the next one's columns (``encode_points``), so that numpy
work runs beside the database's. So a slow commit costs the trainer nothing until
``max_batches`` batches wait; then ``log_step`` blocks until the writer takes one
(backpressure: memory stays bounded when the database is slower than training). The writer
thread exits when it has been idle ``WRITER_IDLE_S`` and starts again with the next batch, so
a finished sink leaves none behind.

Errors reach the trainer on its own thread: whatever the writer meets (``RunGone``, a
``DatabaseUnavailable`` outage past its limit, any other error) is raised by the next
``log_step`` or ``flush``, and nothing more is written after it.

Database outages: with an ``Outage`` the write is retried with backoff (see ``worker.retry``).
Past its limit ``DatabaseUnavailable`` propagates through the trainer (so no checkpoint is saved
that covers steps the database lacks) and the worker hands the run back without failing it.

Crash safety: the trainer calls ``flush()`` before it saves each checkpoint and before it ends;
``flush`` hands over the buffer and returns only once every batch is committed, so a checkpoint
never covers a step the database lacks. A crash loses at most the steps after the last
checkpoint (buffered or waiting for the writer), which the resumed attempt re-emits; the upserts
on (run_id, key, step), (run_id, step, group, index) and (run_id, step, prompt_key) make a
re-emitted step that was already stored an overwrite, not a duplicate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from sqlalchemy import update

from backend.db import Database
from backend.models import Run, utcnow
from backend.runs.lifecycle import owned_by
from backend.storage.answers import write_answers
from backend.storage.writes import Encoded, StepPoints, encode_points, write_encoded
from conspo.sink import AnswerRecord, StepRecord
from worker.retry import Outage

log = logging.getLogger(__name__)


class RunGone(Exception):
    """The run was deleted, or another attempt owns it now: stop writing."""


WRITER_IDLE_S = 5.0  # an idle writer thread exits after this long; the next batch starts one


class DbSink:
    def __init__(
        self,
        db: Database,
        run_id: int,
        attempt: int,
        *,
        # Per batch, besides its rows: the run row's update, the rollups' delete, extents and
        # aggregate statements, the commit. At 20,000 rows they were a third of a batch's time
        # on PostgreSQL (bench/metrics_store.py: ~108k points/s against ~122k at 60,000).
        max_points: int = 50_000,
        max_delay_s: float = 0.2,
        max_batches: int = 4,
        clock: Callable[[], float] = time.monotonic,
        outage: Outage | None = None,
    ) -> None:
        self.db = db
        self.outage = outage  # retries database errors; None: they are raised at once
        self.run_id = run_id
        self.attempt = attempt
        self.max_points = max_points
        self.max_delay_s = max_delay_s  # short: the writer thread, not the trainer, pays for it
        self.max_batches = max_batches  # batches handed over and not yet committed, at most
        self.clock = clock
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._buffer: dict[int, StepRecord] = {}  # by step: a re-emitted step replaces its twin
        self._buffered = 0  # metric points + rollout and prompt rows in the buffer
        self._last_write = clock()
        # The writer's side, all under _cond: batches handed over and not yet committed, oldest
        # (the one being written) first; the writer's first error; the thread.
        self._cond = threading.Condition()
        self._batches: deque[_Batch] = deque()
        self._error: BaseException | None = None
        self._writer: threading.Thread | None = None

    def log_step(self, record: StepRecord) -> None:
        """Buffer the step; hand the buffer to the writer when it is full or the last hand-over
        is old. Raises what the writer met since the last call."""
        self._raise_writer_error()
        old = self._buffer.pop(record.step, None)
        if old is not None:
            self._buffered -= _rows(old)
        self._buffer[record.step] = record
        self._buffered += _rows(record)
        if self._buffered >= self.max_points:
            self._hand_over()
        elif self.clock() - self._last_write >= self.max_delay_s and not self._writer_busy():
            # A busy writer will be done soon, and the next batch then carries more steps: a
            # per-batch cost paid less often when the database is what is slow.
            self._hand_over()

    def flush(self) -> None:
        """Hand over the buffer and wait until every batch is committed (nothing to do when all
        is written); raises what the writer met.

        With an ``outage``, a dropped connection or a locked database is retried (the write is
        an upsert, so a batch whose commit did land before the error is simply written again).
        """
        self._hand_over()
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or not self._in_flight())
        self._raise_writer_error()

    def wait_written(self) -> None:
        """Wait until the batches handed over so far are committed (the buffer stays); raises
        what the writer met. For tests and benchmarks: the trainer needs only ``flush``."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or not self._in_flight())
        self._raise_writer_error()

    def _hand_over(self) -> None:
        """Queue the buffer as one batch for the writer, waiting while ``max_batches`` wait."""
        self._last_write = self.clock()
        if not self._buffer:
            return
        batch = _Batch(self.run_id, list(self._buffer.values()))
        self._buffer = {}
        self._buffered = 0
        with self._cond:
            # Backpressure: the trainer waits here while the database is behind.
            self._cond.wait_for(
                lambda: self._error is not None or self._queued() < self.max_batches
            )
            if self._error is not None:
                raise self._error
            self._batches.append(batch)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_batches, name=f"db-sink-{self.run_id}", daemon=True
                )
                self._writer.start()
            self._cond.notify_all()

    def _writer_busy(self) -> bool:
        with self._cond:
            return bool(self._batches)

    def _queued(self) -> int:
        return len(self._batches)  # the batch being written stays first in the deque until done

    def _in_flight(self) -> bool:
        return bool(self._batches)

    def _write_batches(self) -> None:
        """The writer thread: commit batches in order until idle for WRITER_IDLE_S or failed."""
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: bool(self._batches), timeout=WRITER_IDLE_S):
                    self._writer = None  # under the lock: the next hand-over starts a new one
                    return
                batch = self._batches[0]  # left in place: it counts until it is committed
                after = self._batches[1] if len(self._batches) > 1 else None
            if after is not None:
                after.encode_ahead()  # on a helper thread while the database stores this one
            try:
                encoded = batch.encoded()
                what = f"run {self.run_id}: storing steps"
                write = partial(self._write, encoded, batch.total_steps, batch.answers)
                owned = self.outage.call(what, write) if self.outage else write()
                error: BaseException | None = (
                    None if owned else RunGone(f"run {self.run_id} was deleted or taken over")
                )
            except BaseException as exc:  # handed to the trainer's thread, raised there
                error = exc
            with self._cond:
                self._batches.popleft()
                if error is not None:
                    self._error = error
                    self._batches.clear()  # nothing is written after an error
                    self._writer = None
                self._cond.notify_all()
                if error is not None:
                    return

    def _raise_writer_error(self) -> None:
        with self._cond:
            error = self._error
        if error is not None:
            raise error

    def _write(
        self, batch: Encoded, total_steps: int, answers: dict[int, list[AnswerRecord]]
    ) -> bool:
        """One transaction for a batch (its evaluations' problems too); False when the attempt
        no longer owns the run."""
        with self.db.session() as session:
            written = write_encoded(
                session,
                self.run_id,
                batch,
                owner_attempt=self.attempt,
                run_values={"heartbeat_at": utcnow(), "total_steps": total_steps},
            )
            if not written.owned:
                session.rollback()
                return False
            if answers:
                write_answers(session, self.run_id, answers)
            session.commit()
        return True

    @property
    def buffered_steps(self) -> list[int]:
        """Steps in the buffer, not yet handed to the writer."""
        return sorted(self._buffer)

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))
        if kind == "phase":  # what the run is doing between steps, on its row for the pages
            self._retried("note the phase", lambda: self._note_phase(str(data["phase"])))
            return
        log.info("run %s: %s %s", self.run_id, kind, data)
        # The run page and `conspo-lab runs` say where a later attempt picked up: its checkpoint,
        # or step 0 when it found none and started over.
        if kind == "resumed" or (kind == "started" and self.attempt > 1):
            step = int(data["step"]) if kind == "resumed" else 0
            self._retried("note the resume", lambda: self._note_resume(step))

    def _retried(self, what: str, write: Callable[[], None]) -> None:
        if self.outage is None:
            write()
        else:
            self.outage.call(f"run {self.run_id}: {what}", write)

    def _note_resume(self, step: int) -> None:
        self._update_run(resumed_from_step=step)

    def _note_phase(self, phase: str) -> None:
        # updated_at moves: open pages get the change on their live stream (backend.api.
        # stream_hub), though no step is logged while the run evaluates.
        self._update_run(phase=phase, updated_at=utcnow())

    def _update_run(self, **values: Any) -> None:
        """The run's row, while this attempt still owns it."""
        with self.db.session() as session:
            owned = owned_by(self.run_id, self.attempt)
            session.execute(update(Run).where(*owned).values(**values))
            session.commit()


class _Batch:
    """Steps handed over together, and their columns (``encode_points``), made once: ahead of
    time on a helper thread while the writer stores the batch before (numpy work beside the
    database's), or by the writer when it gets there first."""

    def __init__(self, run_id: int, records: list[StepRecord]) -> None:
        self.run_id = run_id
        self.records = records
        self.total_steps = max(records, key=lambda r: r.step).total_steps
        self.answers = {r.step: r.answers for r in records if r.answers}
        self._lock = threading.Lock()  # held while encoding: a second caller waits for it
        self._encoded: Encoded | None = None
        self._error: BaseException | None = None
        self._ahead = False

    def encode_ahead(self) -> None:
        """Encode on a thread of its own, which ends with the encoding (once; writer only)."""
        if not self._ahead:
            self._ahead = True
            threading.Thread(target=self._encode, name="db-sink-encode", daemon=True).start()

    def encoded(self) -> Encoded:
        """The columns; raises what encoding them raised."""
        self._encode()
        if self._error is not None:
            raise self._error
        assert self._encoded is not None
        return self._encoded

    def _encode(self) -> None:
        with self._lock:
            if self._encoded is not None or self._error is not None:
                return
            steps = [
                StepPoints(r.step, r.metrics, r.wall_time, r.rollouts, r.prompts)
                for r in self.records
            ]
            try:
                self._encoded = encode_points(self.run_id, steps)
            except Exception as exc:  # the writer raises it when it takes this batch
                self._error = exc


def _rows(record: StepRecord) -> int:
    """The rows a step adds to a write: metric points, its rollouts' row (one per step, however
    many it sampled), prompts and an evaluation's problems."""
    return len(record.metrics) + bool(record.rollouts) + len(record.prompts) + len(record.answers)
