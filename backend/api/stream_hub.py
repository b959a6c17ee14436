"""One database poller per API process, shared by every open live stream.

A stream that polled for itself cost a query per stream and period, and held its request's
connection (and transaction) for its whole life: 31 streams exhausted the pool. Here:

* A run stream *watches* its run. Once a period the hub reads a few columns of every watched
  run in one query (its write sequence, state and step: :data:`ROW_KEY`) and reads in full,
  and wakes the streams of, only the runs whose columns moved. A woken stream asks for its new
  points through :meth:`StreamHub.points`, which shares one read (and its JSON) among the
  streams at the same cursor: all those following a live run read its new points once.
* ``/stream/runs`` streams read the hub's log of changed runs, filled by one query a period
  (of the columns the list shows, :data:`RUNS_LIST_FIELDS`; the changed runs read in full).
* So a period that finds nothing new costs one or two small queries and no serialisation,
  whatever the number of streams and runs: a short period stays cheap.
* Every read runs in a worker thread in a short session of its own, at most
  ``stream_db_connections`` at a time: no stream holds a connection between polls, and streams
  cannot take the connections normal requests need.
* Events shared by many streams are encoded once, as the bytes of a whole SSE frame.

The hub also counts open streams per caller and in all (``stream_max_per_client``,
``stream_max_total``). Its asyncio state belongs to the event loop that serves the streams; the
poller task stops when the last stream closes and starts again with the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

import anyio
from pydantic_core import to_json
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sse_starlette import ServerSentEvent

from backend.config import Settings
from backend.db import Database
from backend.models import FINISHED, RunStatus, utcnow
from backend.runs.scheduling import Cluster
from backend.schemas import run_out
from backend.storage import runs as stored_runs
from backend.storage.stream import StreamChunk, StreamCursor, query_new_points

log = logging.getLogger(__name__)

T = TypeVar("T")

# phase: a run evaluating for minutes logs no step; its page hears of it through these.
STATUS_FIELDS = (
    "status", "cancel_requested", "error", "finished_at", "worker_host", "attempt", "phase",
)  # fmt: skip
RUNS_LIST_FIELDS = ("status", "step", "cancel_requested", "error")
# The columns a poll reads of each watched run; the row is read in full when one moved.
ROW_KEY = ("write_seq", "updated_at", "step", *STATUS_FIELDS)
UNREAD: tuple[Any, ...] = ()  # the row key of a run not read yet (no real key is empty)
CHUNKS_REMEMBERED = 64  # point reads kept per snapshot for streams that arrive at the same cursor
RUNS_LOG_POLLS = 256  # polls of changed runs kept for /stream/runs streams that fall behind
MIN_POLL_GAP_S = 0.02  # early polls (a stream of a run not yet watched) come at most this often


class StreamLimitReached(Exception):
    """No slot for one more stream: ``scope`` says whose bound was hit (the message names it)."""

    def __init__(self, scope: Literal["client", "server"], message: str) -> None:
        super().__init__(message)
        self.scope = scope


def sse_frame(event: str, event_id: str, data: Any) -> bytes:
    """One whole SSE event, encoded (``EventSourceResponse`` sends bytes as they are)."""
    return ServerSentEvent(data=to_json(data).decode(), event=event, id=event_id).encode()


@dataclass(frozen=True)
class SharedChunk:
    """A point read and its ``metrics`` event, encoded once for every stream at its cursor
    (streams at one cursor get the same points and the same next cursor, hence the same id)."""

    cursor: StreamCursor
    frame: bytes | None  # None when no point was new

    @classmethod
    def read(cls, chunk: StreamChunk) -> SharedChunk:
        if not chunk.series:
            return cls(chunk.cursor, None)
        body = {"step_max": chunk.step_max, "series": chunk.series}
        return cls(chunk.cursor, sse_frame("metrics", chunk.cursor.event_id, body))


@dataclass(eq=False)
class RunSnapshot:
    """A run's row as one poll read it (``run`` is None once the run is deleted).

    Point reads are shared through ``chunks``, per snapshot: a read made after this snapshot
    was taken never misses a point it counts, so a finished snapshot plus an empty read means
    every point was sent.
    """

    run_id: int
    run: dict[str, Any] | None
    write_seq: int
    chunks: OrderedDict[StreamCursor, asyncio.Future[SharedChunk]] = field(
        default_factory=OrderedDict
    )
    _status_frames: dict[str, bytes] = field(default_factory=dict)  # by event id

    @property
    def status_key(self) -> tuple[Any, ...] | None:
        return None if self.run is None else tuple(self.run[f] for f in STATUS_FIELDS)

    @property
    def wake_key(self) -> tuple[Any, ...]:
        """What a stream reacts to: new points, a changed state, deletion."""
        return (self.write_seq, self.status_key)

    @property
    def finished(self) -> bool:
        return self.run is not None and self.run["status"] in FINISHED

    def status_frame(self, event_id: str) -> bytes:
        """The ``status`` event (data: the Run), encoded once per id for the streams at it."""
        frame = self._status_frames.get(event_id)
        if frame is None:
            frame = self._status_frames[event_id] = sse_frame("status", event_id, self.run)
        return frame

    def same_row(self, other: RunSnapshot) -> bool:
        return self.write_seq == other.write_seq and self.run == other.run


class RunWatch:
    """The latest snapshot of one watched run, and the streams waiting for it to change."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.streams = 0
        self.snapshot: RunSnapshot | None = None  # None until the first poll reads it
        self.row_key: tuple[Any, ...] | None = UNREAD  # as last read; None: deleted
        self.version = 0  # bumped when the wake key changes
        self._changed = asyncio.Event()

    def publish(self, snapshot: RunSnapshot) -> None:
        old = self.snapshot
        if old is not None and old.same_row(snapshot):
            return  # keep the old object: its shared point reads stay valid
        self.snapshot = snapshot
        if old is None or old.wake_key != snapshot.wake_key:
            self.version += 1
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def after(self, version: int) -> tuple[RunSnapshot, int]:
        """The latest snapshot once its version differs from ``version``."""
        while self.snapshot is None or self.version == version:
            await self._changed.wait()
        return self.snapshot, self.version


class RunFeed:
    """One stream's view of a :class:`RunWatch`: each snapshot it has not seen yet."""

    def __init__(self, watch: RunWatch) -> None:
        self._watch = watch
        self._seen = -1

    async def next(self) -> RunSnapshot:
        snapshot, self._seen = await self._watch.after(self._seen)
        return snapshot

    def again(self) -> None:
        """Make ``next`` return the current snapshot at once (after a failed point read)."""
        self._seen = -1


class RunsFeed:
    """One ``/stream/runs`` stream's place in the hub's log of changed runs."""

    def __init__(self, hub: StreamHub) -> None:
        self._hub = hub
        self._generation = hub.runs_generation

    async def next(self) -> list[bytes] | None:
        """The ``run`` events of the runs changed since the last call, the latest state of
        each, oldest change first; None when this stream fell further behind than the log
        reaches (it should end: the client reconnects and reloads)."""
        hub = self._hub
        while hub.runs_generation == self._generation:
            await hub.runs_changed.wait()
        entries = [(gen, runs) for gen, runs in hub.runs_log if gen > self._generation]
        if not entries or entries[0][0] != self._generation + 1:
            return None
        self._generation = entries[-1][0]
        latest: dict[int, bytes] = {}
        for _, runs in entries:
            for run_id, frame in runs:
                latest.pop(run_id, None)  # re-inserted: ordered by its latest change
                latest[run_id] = frame
        return list(latest.values())


class StreamHub:
    """Live streams of one API process (see the module docstring)."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self._db = db
        self._settings = settings
        self._open: Counter[str] = Counter()
        self._open_total = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._reset_loop_state()

    def _reset_loop_state(self) -> None:
        """Everything bound to an event loop, made afresh for each loop that serves streams."""
        self._watches: dict[int, RunWatch] = {}
        self._wake = asyncio.Event()
        self._limiter: anyio.CapacityLimiter | None = None
        self.runs_listeners = 0
        self.runs_generation = 0
        # (generation, [(run id, its run event)]) per poll that found changes
        self.runs_log: deque[tuple[int, list[tuple[int, bytes]]]] = deque(maxlen=RUNS_LOG_POLLS)
        self.runs_changed = asyncio.Event()
        self._runs_seen: dict[int, tuple[Any, ...]] | None = None  # None: no baseline yet
        self._runs_since: datetime | None = None

    # --- bounds ---------------------------------------------------------------------------

    def reserve(self, caller: str) -> Callable[[], None]:
        """A slot for one more stream of ``caller``; call the returned function to free it
        (calls after the first do nothing). Raises :class:`StreamLimitReached`."""
        total, per_client = self._settings.stream_max_total, self._settings.stream_max_per_client
        if self._open_total >= total:
            raise StreamLimitReached(
                "server",
                f"the server has {total} live streams open, its limit "
                "(CONSPO_STREAM_MAX_TOTAL); retry later",
            )
        if self._open[caller] >= per_client:
            raise StreamLimitReached(
                "client",
                f"{caller} has {per_client} live streams open, the limit per caller "
                "(CONSPO_STREAM_MAX_PER_CLIENT); close one first",
            )
        self._open[caller] += 1
        self._open_total += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._open_total -= 1
            self._open[caller] -= 1
            if not self._open[caller]:
                del self._open[caller]

        return release

    @property
    def open_streams(self) -> int:
        return self._open_total

    @property
    def runs_watched(self) -> int:
        return len(self._watches)

    # --- subscriptions --------------------------------------------------------------------

    @asynccontextmanager
    async def watch_run(self, run_id: int) -> AsyncIterator[RunFeed]:
        self._ensure_poller()
        watch = self._watches.get(run_id)
        if watch is None:
            watch = self._watches[run_id] = RunWatch(run_id)
            self._wake.set()  # read it now rather than at the next period
        watch.streams += 1
        try:
            yield RunFeed(watch)
        finally:
            watch.streams -= 1
            if not watch.streams and self._watches.get(run_id) is watch:
                del self._watches[run_id]

    @asynccontextmanager
    async def listen_runs(self) -> AsyncIterator[RunsFeed]:
        self._ensure_poller()
        self.runs_listeners += 1
        try:
            yield RunsFeed(self)
        finally:
            self.runs_listeners -= 1
            if not self.runs_listeners:  # the next listener starts from a fresh baseline
                self._runs_seen = self._runs_since = None
                self.runs_log.clear()

    async def points(self, snapshot: RunSnapshot, cursor: StreamCursor) -> SharedChunk:
        """Points written after ``cursor`` (read after ``snapshot``), shared among streams."""
        nothing_new = cursor.backlog_until is None and cursor.seq >= snapshot.write_seq
        if snapshot.run is None or nothing_new:
            return SharedChunk(cursor, None)
        future = snapshot.chunks.get(cursor)
        if future is None:
            future = asyncio.ensure_future(
                self._in_thread(_read_points, self._db, snapshot.run_id, cursor)
            )
            future.add_done_callback(lambda f: _forget_failed(snapshot, cursor, f))
            snapshot.chunks[cursor] = future
            if len(snapshot.chunks) > CHUNKS_REMEMBERED:
                snapshot.chunks.popitem(last=False)
        # shield: a stream closing while it waits must not cancel the read others wait for
        return await asyncio.shield(future)

    # --- the poller -----------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests run several): the old state is dead
            self._loop, self._task = loop, None
            self._reset_loop_state()
        return loop

    def _ensure_poller(self) -> None:
        loop = self._ensure_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._poll_while_watched(), name="stream-hub")

    async def _poll_while_watched(self) -> None:
        period = self._settings.stream_poll_s
        while self._watches or self.runs_listeners:
            self._wake.clear()
            await self._poll_once()
            await asyncio.sleep(min(MIN_POLL_GAP_S, period))
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, period - MIN_POLL_GAP_S))
        # No await between the check above and here: a stream that subscribes from now on
        # finds the task done and starts another.

    async def _poll_once(self) -> None:
        known = {run_id: watch.row_key for run_id, watch in self._watches.items()}
        since = self._runs_window_start() if self.runs_listeners else None
        started = utcnow()
        try:
            read = await self._in_thread(
                _read_runs, self._db, self._settings, known, since, self._runs_seen
            )
        except SQLAlchemyError as exc:
            log.warning("live streams: poll failed, retrying next period: %s", exc)
            return
        except Exception:  # the poller must outlive any one bad poll: every stream waits on it
            log.exception("live streams: poll failed, retrying next period")
            return
        for run_id, (key, run) in read.watched.items():
            watch = self._watches.get(run_id)
            if watch is not None:
                watch.row_key = key
                seq = run.pop("write_seq") if run is not None else -1
                watch.publish(RunSnapshot(run_id, run, seq))
        if since is not None:
            self._runs_since = started
            self._publish_changed_runs(read.signatures, read.listed)

    def _runs_window_start(self) -> datetime:
        # Rows updated in an overlapping window are compared with what was last seen, so
        # writers whose clocks or commits lag by a few seconds are still caught.
        overlap = timedelta(seconds=max(10.0, 5 * self._settings.stream_poll_s))
        return (self._runs_since or utcnow()) - overlap

    def _publish_changed_runs(
        self, signatures: dict[int, tuple[Any, ...]], runs: dict[int, dict[str, Any]]
    ) -> None:
        """``signatures``: the list's columns of each run in the window, by update time;
        ``runs``: those whose signature differs from the last poll's, in full."""
        seen, self._runs_seen = self._runs_seen, signatures  # runs out of the window: forgotten
        if seen is None:
            return  # the baseline: only later changes are events
        changed = [
            (run_id, sse_frame("run", str(run_id), runs[run_id]))  # once for every listener
            for run_id, signature in signatures.items()
            if seen.get(run_id) != signature and run_id in runs
        ]
        if changed:
            self.runs_generation += 1
            self.runs_log.append((self.runs_generation, changed))
            event, self.runs_changed = self.runs_changed, asyncio.Event()
            event.set()

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread on the hub's connections (a stream's start)."""
        self._ensure_loop()
        return await self._in_thread(fn, *args)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._settings.stream_db_connections)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)


def _forget_failed(
    snapshot: RunSnapshot, cursor: StreamCursor, future: asyncio.Future[SharedChunk]
) -> None:
    """A failed read is dropped so the next stream at this cursor tries again."""
    failed = future.cancelled() or future.exception() is not None
    if failed and snapshot.chunks.get(cursor) is future:
        del snapshot.chunks[cursor]


def _read_points(db: Database, run_id: int, cursor: StreamCursor) -> SharedChunk:
    with db.read_session() as session:
        return SharedChunk.read(query_new_points(session, run_id, cursor))


@dataclass
class PollRead:
    """What one poll read (see :func:`_read_runs`)."""

    # watched runs whose row key moved: (new key, the run with its write_seq); (None, None)
    # when deleted
    watched: dict[int, tuple[tuple[Any, ...] | None, dict[str, Any] | None]]
    signatures: dict[int, tuple[Any, ...]]  # RUNS_LIST_FIELDS of the runs in the window
    listed: dict[int, dict[str, Any]]  # the runs whose signature moved, in full


def _read_runs(
    db: Database,
    settings: Settings,
    known: dict[int, tuple[Any, ...] | None],
    since: datetime | None,
    seen: dict[int, tuple[Any, ...]] | None,
) -> PollRead:
    """In one short session: the row key of every watched run (``known``: as last read), and
    the list's columns of the runs updated since ``since`` (none when it is None; ``seen``: as
    last read, None for none); then, in full, only the runs whose columns moved."""
    with db.read_session() as session:
        keys = stored_runs.columns_of(session, known, ROW_KEY)
        moved = [run_id for run_id in known if keys.get(run_id) != known[run_id]]
        signatures: dict[int, tuple[Any, ...]] = {}
        if since is not None:
            signatures = stored_runs.columns_updated_since(session, since, RUNS_LIST_FIELDS)
        relisted = [] if seen is None else [i for i, s in signatures.items() if seen.get(i) != s]
        runs = _full_runs(session, settings, {*(i for i in moved if i in keys), *relisted})
    watched: dict[int, tuple[tuple[Any, ...] | None, dict[str, Any] | None]] = {}
    for run_id in moved:
        full = runs.get(run_id)
        watched[run_id] = (None, None) if full is None else (full.key, full.with_write_seq())
    listed: dict[int, dict[str, Any]] = {}
    for run_id in relisted:
        if (full := runs.get(run_id)) is not None:
            listed[run_id] = full.out
            signatures[run_id] = full.signature  # as sent: a later poll compares with it
    return PollRead(watched, signatures, listed)


@dataclass(frozen=True)
class FullRun:
    key: tuple[Any, ...]  # ROW_KEY
    signature: tuple[Any, ...]  # RUNS_LIST_FIELDS
    out: dict[str, Any]  # as the API shows it
    write_seq: int

    def with_write_seq(self) -> dict[str, Any]:
        return {**self.out, "write_seq": self.write_seq}


def _full_runs(session: Session, settings: Settings, ids: set[int]) -> dict[int, FullRun]:
    out: dict[int, FullRun] = {}
    if not ids:
        return out
    rows = list(stored_runs.runs_by_id(session, ids).values())
    # Queued runs say why they wait: the live workers are read only when one is shown.
    waiting = any(run.status == RunStatus.queued and not run.external for run in rows)
    cluster = Cluster.load(session, settings) if waiting else None
    for run in rows:
        out[run.id] = FullRun(
            tuple(getattr(run, name) for name in ROW_KEY),
            tuple(getattr(run, name) for name in RUNS_LIST_FIELDS),
            run_out(run, cluster),
            run.write_seq,
        )
    return out
