"""The run's log (``run_logs``): chunks appended by the worker, read by ``since``, bounded.

A run keeps at most ``HEAD_BYTES`` of its first output and ``TAIL_BYTES`` of its latest: when a
new chunk takes it over ``HEAD_BYTES + TAIL_BYTES``, the chunks between are deleted and one
``cut`` chunk takes the place of the first of them, saying how many lines and bytes went (a later
cut adds to it). A reader following with ``since`` never sees a chunk twice and never waits for
one that was cut: sequence numbers only grow, and the marker keeps a number it had passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from backend.models import RunLogChunk

HEAD_BYTES = 256 * 1024  # how the run started: imports, warnings, the first steps
TAIL_BYTES = 768 * 1024  # how it is going, or how it ended: the traceback


@dataclass(frozen=True)
class Cut:
    lines: int
    nbytes: int

    @property
    def text(self) -> str:
        return (
            f"[… {self.lines:,} lines ({self.nbytes / 1024:,.0f} KiB) cut here: a run's log keeps"
            f" its first {HEAD_BYTES // 1024} KiB and its last {TAIL_BYTES // 1024} KiB …]\n"
        )


def append(session: Session, run_id: int, attempt: int, text: str) -> int:
    """Store ``text`` (whole lines) as the run's next chunk, cut the middle when the log is over
    its cap; the chunk's sequence number. The caller commits."""
    last = session.scalar(select(func.max(RunLogChunk.seq)).where(RunLogChunk.run_id == run_id))
    seq = (last or 0) + 1
    session.add(
        RunLogChunk(
            run_id=run_id, seq=seq, attempt=attempt, wall_time=time.time(), text=text,
            lines=text.count("\n"), nbytes=len(text.encode()), cut=False,
        )
    )  # fmt: skip
    session.flush()
    _bound(session, run_id)
    return seq


def _bound(session: Session, run_id: int) -> None:
    rows = session.execute(
        select(RunLogChunk.seq, RunLogChunk.nbytes, RunLogChunk.lines, RunLogChunk.cut)
        .where(RunLogChunk.run_id == run_id)
        .order_by(RunLogChunk.seq)
    ).all()
    if sum(r.nbytes for r in rows if not r.cut) <= HEAD_BYTES + TAIL_BYTES:
        return
    head, used = 0, 0  # chunks kept from the start
    for r in rows:
        if r.cut or used + r.nbytes > HEAD_BYTES:
            break
        used, head = used + r.nbytes, head + 1
    tail, used = 0, 0  # chunks kept from the end (the newest always: it is what is going on)
    for r in reversed(rows[head:]):
        if r.cut or (tail and used + r.nbytes > TAIL_BYTES):
            break
        used, tail = used + r.nbytes, tail + 1
    middle = rows[head : len(rows) - tail]
    if not any(not r.cut for r in middle):
        return
    # a cut chunk's lines and nbytes count what it replaced: an earlier cut adds to this one
    cut = Cut(sum(r.lines for r in middle), sum(r.nbytes for r in middle))
    first, rest = middle[0].seq, [r.seq for r in middle[1:]]
    if rest:
        session.execute(
            delete(RunLogChunk).where(RunLogChunk.run_id == run_id, RunLogChunk.seq.in_(rest))
        )
    session.execute(
        update(RunLogChunk)
        .where(RunLogChunk.run_id == run_id, RunLogChunk.seq == first)
        .values(text=cut.text, cut=True, lines=cut.lines, nbytes=cut.nbytes)
    )


def read(session: Session, run_id: int, since: int, limit: int) -> list[RunLogChunk]:
    """The run's chunks after ``since``, oldest first, at most ``limit``."""
    return list(
        session.scalars(
            select(RunLogChunk)
            .where(RunLogChunk.run_id == run_id, RunLogChunk.seq > since)
            .order_by(RunLogChunk.seq)
            .limit(limit)
        )
    )


def tail_lines(session: Session, run_id: int, n: int) -> list[str]:
    """The run's last ``n`` lines (what a failed run's page shows beside its error)."""
    lines: list[str] = []
    chunks = session.scalars(
        select(RunLogChunk).where(RunLogChunk.run_id == run_id).order_by(RunLogChunk.seq.desc())
    )
    for chunk in chunks:
        lines = chunk.text.splitlines() + lines
        if len(lines) >= n:
            break
    return lines[-n:]
