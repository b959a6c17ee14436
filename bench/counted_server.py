"""uvicorn with every SQL statement of the process counted, for the live-stream benches.

    python bench/counted_server.py COUNT_FILE [uvicorn arguments ...]

Statements are counted as they reach the database driver (SQLAlchemy ``before_cursor_execute``,
every engine of the process), split by who issued them: ``stream`` when the live streams' code
(``backend/api/stream_hub.py``, ``backend/api/routes/stream.py``) is on the calling stack, else
``other``. The totals so far are written to COUNT_FILE (JSON) every 0.25 s and at exit. One
process only: uvicorn's ``--workers`` children would not be counted.

Where a request's time goes: every request under /api but the streams is timed from the
moment the application sees it to its response's start, split into the waits it is made of (see
:class:`ReadTrace`), and appended to COUNT_FILE with the suffix ``.reads.jsonl``; the event
loop's lag (how late a 10 ms sleep wakes) goes to ``.lag.jsonl``. Both are written with the
counts.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import anyio.to_thread
import psycopg
import uvicorn
from sqlalchemy import event
from sqlalchemy.engine import Engine

STREAM_CODE = (
    os.path.join("backend", "api", "stream_hub.py"),
    os.path.join("backend", "api", "routes", "stream.py"),
)

_counts = {"stream": 0, "other": 0}
_lock = threading.Lock()


@dataclass
class ReadTrace:
    """One read's time from the application's first sight of it to its response's start (s).

    ``gate_s``: waiting for a session slot; ``queue_s``: its worker-thread calls waiting to
    start (for a free thread, then for the GIL and a CPU); ``thread_cpu_s``: those calls' CPU;
    ``db_s``: their waits on the database driver (every round trip: the pool's ping, BEGIN,
    each statement, COMMIT or ROLLBACK; PostgreSQL's work, its backend's wait for a CPU, and
    this thread's wait to be woken and to get the GIL back); ``thread_other_s``: the rest of
    their time (GIL and CPU waits in Python code); ``resume_s``: from a call's end until the
    event loop took its result up (a busy loop); ``loop_s``: all else, on the event loop
    (routing, dependencies, encoding; and waiting for the loop between those steps).
    """

    at: float  # wall clock (time.time) of its start
    method: str
    path: str
    total_s: float = 0.0
    gate_s: float = 0.0
    queue_s: float = 0.0
    thread_cpu_s: float = 0.0
    db_s: float = 0.0
    thread_other_s: float = 0.0
    resume_s: float = 0.0
    loop_s: float = 0.0
    hops: int = 0
    statements: int = 0
    db_waits: int = 0  # calls into the driver that may wait on the server (round trips, mostly)


_trace: ContextVar[ReadTrace | None] = ContextVar("read_trace", default=None)
_finished: list[ReadTrace] = []
_lags: list[tuple[float, float]] = []  # (wall clock, lag s)


@event.listens_for(Engine, "before_cursor_execute")
def _count(conn: Any, *_: Any) -> None:
    frame: FrameType | None = sys._getframe(1)
    who = "other"
    while frame is not None:
        if frame.f_code.co_filename.endswith(STREAM_CODE):
            who = "stream"
            break
        frame = frame.f_back
    with _lock:
        _counts[who] += 1
    if (trace := _trace.get()) is not None:
        trace.statements += 1


_driver_wait = psycopg.Connection.wait


def _timed_driver_wait(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
    trace = _trace.get()
    if trace is None:
        return _driver_wait(self, *args, **kwargs)
    began = time.perf_counter()
    try:
        return _driver_wait(self, *args, **kwargs)
    finally:
        trace.db_s += time.perf_counter() - began
        trace.db_waits += 1


_run_sync = anyio.to_thread.run_sync


async def _timed_run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    trace = _trace.get()
    if trace is None:
        return await _run_sync(func, *args, **kwargs)
    submitted = time.perf_counter()
    times: dict[str, float] = {}

    def timed(*a: Any) -> Any:
        times["start"], cpu = time.perf_counter(), time.thread_time()
        try:
            return func(*a)
        finally:
            times["cpu"], times["end"] = time.thread_time() - cpu, time.perf_counter()

    db_before = trace.db_s
    try:
        return await _run_sync(timed, *args, **kwargs)
    finally:
        resumed = time.perf_counter()
        if "end" in times:
            trace.hops += 1
            trace.queue_s += times["start"] - submitted
            trace.thread_cpu_s += times["cpu"]
            in_thread = times["end"] - times["start"]
            trace.thread_other_s += in_thread - times["cpu"] - (trace.db_s - db_before)
            trace.resume_s += resumed - times["end"]


def _traced(app: Any) -> Any:
    """The ASGI app with every read timed (see :class:`ReadTrace`)."""

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        timed = (
            scope["type"] == "http"
            and path.startswith("/api/")
            and not path.endswith("/stream")
            and not path.startswith("/api/stream/")
        )
        if not timed:
            await app(scope, receive, send)
            return
        trace = ReadTrace(time.time(), scope["method"], path)
        began = time.perf_counter()
        token = _trace.set(trace)

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                trace.total_s = time.perf_counter() - began
                off_loop = trace.gate_s + trace.queue_s + trace.thread_cpu_s + trace.db_s
                off_loop += trace.thread_other_s + trace.resume_s
                trace.loop_s = trace.total_s - off_loop
                with _lock:
                    _finished.append(trace)
            await send(message)

        try:
            await app(scope, receive, timed_send)
        finally:
            _trace.reset(token)

    return traced_app


def _time_gate_waits() -> None:
    from backend.api.deps import SessionGate

    slot = SessionGate.slot

    @asynccontextmanager
    async def timed_slot(self: SessionGate, write: bool = False) -> AsyncIterator[None]:
        trace, waited = _trace.get(), time.perf_counter()
        async with slot(self, write):
            if trace is not None:
                trace.gate_s += time.perf_counter() - waited
            yield

    SessionGate.slot = timed_slot  # type: ignore[method-assign]


async def _watch_lag(period_s: float = 0.01) -> None:
    while True:
        asked = time.perf_counter()
        await asyncio.sleep(period_s)
        with _lock:
            _lags.append((time.time(), time.perf_counter() - asked - period_s))


def create_traced_app() -> Any:
    """``backend.main.create_app`` with its reads timed and the event loop's lag watched."""
    from backend.main import create_app

    anyio.to_thread.run_sync = _timed_run_sync
    psycopg.Connection.wait = _timed_driver_wait  # type: ignore[method-assign]
    _time_gate_waits()
    app = create_app()
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        watcher = asyncio.get_running_loop().create_task(_watch_lag())
        try:
            async with inner(a) as state:
                yield state
        finally:
            watcher.cancel()

    app.router.lifespan_context = lifespan
    return _traced(app)


def _write(path: Path) -> None:
    with _lock:
        text = json.dumps(_counts)
        reads, _finished[:] = list(_finished), []
        lags, _lags[:] = list(_lags), []
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    if reads:
        with Path(f"{path}.reads.jsonl").open("a") as out:
            out.writelines(json.dumps(asdict(r)) + "\n" for r in reads)
    if lags:
        with Path(f"{path}.lag.jsonl").open("a") as out:
            out.writelines(json.dumps(lag) + "\n" for lag in lags)


def _keep_writing(path: Path, stop: threading.Event) -> None:
    while not stop.wait(0.25):
        _write(path)


def read_traces(path: Path, start: float, end: float) -> tuple[list[dict[str, Any]], list[float]]:
    """The requests (as :class:`ReadTrace` dicts) that began, and the loop lags (s) measured,
    between the wall clock times ``start`` and ``end``."""
    reads, lags = [], []
    with Path(f"{path}.reads.jsonl").open() as lines:
        reads = [r for r in map(json.loads, lines) if start <= r["at"] < end]
    with Path(f"{path}.lag.jsonl").open() as lines:
        lags = [lag for at, lag in map(json.loads, lines) if start <= at < end]
    return reads, lags


def read_counts(path: Path) -> dict[str, int]:
    """The totals the server last wrote (zeros before its first write)."""
    try:
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {"stream": 0, "other": 0}


def main() -> None:
    path = Path(sys.argv[1])
    stop = threading.Event()
    threading.Thread(target=_keep_writing, args=(path, stop), daemon=True).start()
    atexit.register(_write, path)
    # the app with its reads timed: this module's own factory (the same module, not a copy)
    app = {"backend.main:create_app": "__main__:create_traced_app"}
    sys.argv = ["uvicorn", *(app.get(a, a) for a in sys.argv[2:])]
    uvicorn.main()


if __name__ == "__main__":
    main()
