"""The live stream's cursor: points written after a run's write sequence, whole writes at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from backend.models import Metric


@dataclass(frozen=True)
class StreamCursor:
    """Where a live stream stands, as its event id says.

    Every metric write gives its points the run's next ``write_seq`` (under the run row's lock,
    so per run it follows commit order); a stream has sent every point with ``seq <= seq``.
    A stream opened with ``since_step=N`` starts with a backlog: points written up to
    ``backlog_until`` (the run's write_seq when it opened) are sent only if their step is
    above N (the caller already has the rest); anything written later is sent whatever its
    step. The event id is ``"<seq>"``, or ``"<seq>:<backlog_until>"`` during the backlog.
    """

    seq: int = -1
    since_step: int = -1
    backlog_until: int | None = None

    @property
    def event_id(self) -> str:
        return str(self.seq) if self.backlog_until is None else f"{self.seq}:{self.backlog_until}"

    @classmethod
    def parse(cls, raw: str, since_step: int | None) -> StreamCursor | None:
        """A Last-Event-ID back into a cursor (None when it is not one of ours)."""
        parts = raw.strip().split(":")
        if len(parts) > 2 or not all(p.lstrip("-").isdigit() for p in parts):
            return None
        nums = [int(p) for p in parts]
        if not all(-1 <= n < 2**63 for n in nums):
            return None
        backlog = nums[1] if len(nums) == 2 and nums[1] > nums[0] else None
        return cls(nums[0], -1 if since_step is None else since_step, backlog)


@dataclass(slots=True)
class StreamSeries:
    """One key's new points, in step order."""

    steps: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)


@dataclass
class StreamChunk:
    """What ``query_new_points`` found, and the cursor that follows it."""

    cursor: StreamCursor
    step_max: int | None  # the highest step among the points; None when there are none
    series: dict[str, StreamSeries]  # by key; empty when nothing new was written


def query_new_points(
    session: Session, run_id: int, cursor: StreamCursor, limit_rows: int = 20_000
) -> StreamChunk:
    """Points written after ``cursor``, whole writes only, about ``limit_rows`` at most.

    A point rewritten after it was sent (an overwrite, e.g. a resumed run re-emitting a step)
    is sent again with its new value.
    """
    m = Metric

    def select_points(*conds: Any, limit: int | None) -> list[Any]:
        stmt = select(m.key, m.step, m.value, m.wall_time, m.seq).where(m.run_id == run_id, *conds)
        if cursor.backlog_until is not None:
            stmt = stmt.where(or_(m.seq > cursor.backlog_until, m.step > cursor.since_step))
        return list(session.execute(stmt.order_by(m.seq).limit(limit)).all())

    rows = select_points(m.seq > cursor.seq, limit=limit_rows + 1)
    complete = len(rows) <= limit_rows
    if not complete:  # keep whole writes: drop the last seq, or read a huge first write whole
        last = rows[-1].seq
        rows = [r for r in rows if r.seq != last]
        if not rows:
            rows = select_points(m.seq == last, limit=None)
    new_seq = max([cursor.seq, *(r.seq for r in rows[-1:])])
    backlog = cursor.backlog_until
    if backlog is not None and (complete or new_seq >= backlog):
        # Everything up to now matched or was skipped; the backlog is over.
        new_seq, backlog = max(new_seq, backlog), None
    series: dict[str, StreamSeries] = {}
    step_max = None
    for key, step, value, wall, _ in sorted(rows, key=lambda r: (r.key, r.step)):
        s = series.get(key)
        if s is None:
            s = series[key] = StreamSeries()
        s.steps.append(step)
        s.values.append(value)
        s.wall_time.append(wall)
        step_max = step if step_max is None else max(step_max, step)
    return StreamChunk(StreamCursor(new_seq, cursor.since_step, backlog), step_max, series)
