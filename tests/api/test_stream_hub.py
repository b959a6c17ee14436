"""The stream hub's contract: many streams of a run cost one poll a period and one point read
per write, however many they are (counted on the real database's statements)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from sqlalchemy import event

from backend.api.routes.stream import _run_events
from backend.api.stream_hub import StreamHub
from backend.config import Settings
from backend.db import Database
from backend.storage.stream import StreamCursor
from tests.api.conftest import Api
from tests.support import run_async

STREAMS = 50


def log_points(api: Api, run_id: int, steps: range, **extra: Any) -> None:
    body = {"steps": [{"step": s, "metrics": {"loss": float(s)}} for s in steps], **extra}
    assert api.post(f"/api/runs/{run_id}/log", json=body).status_code == 200


def parse_frame(frame: bytes) -> tuple[str, str]:
    """(event, data) of one encoded SSE event."""
    fields = dict(line.split(": ", 1) for line in frame.decode().splitlines() if line)
    return fields["event"], fields["data"]


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        await asyncio.sleep(0.05)


def test_streams_of_a_run_share_each_poll_and_each_point_read(api: Api, settings: Settings) -> None:
    run = api.external()
    log_points(api, run["id"], range(1, 4))
    fast = settings.model_copy(update={"stream_poll_s": 0.2})
    db = Database(fast)
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    def reads(table: str) -> int:
        return sum(f"FROM {table}" in s for s in statements)

    async def scenario() -> dict[str, int]:
        hub = StreamHub(db, fast)
        received: list[list[tuple[str, Any]]] = [[] for _ in range(STREAMS)]

        async def follow(events: list[tuple[str, Any]]) -> None:
            async for e in _run_events(hub, fast, run["id"], StreamCursor()):
                events.append(parse_frame(e))

        def steps_seen(events: list[tuple[str, Any]]) -> int:
            return sum(data.count('"steps":[') for kind, data in events if kind == "metrics")

        tasks = [asyncio.create_task(follow(r)) for r in received]
        await until(lambda: all(steps_seen(r) == 1 for r in received), 60, "the first points")
        first_reads = reads("metrics")
        polls_before, started = reads("runs"), time.monotonic()
        await asyncio.to_thread(log_points, api, run["id"], range(4, 5), status="succeeded")
        await until(lambda: all(r and r[-1][0] == "end" for r in received), 60, "every end")
        periods = (time.monotonic() - started) / fast.stream_poll_s
        await asyncio.gather(*tasks)
        assert not hub._watches and not any(t.exception() for t in tasks)  # all released
        return {
            "first_reads": first_reads,
            "later_reads": reads("metrics") - first_reads,
            "polls": reads("runs") - polls_before,
            "periods": round(periods),
        }

    try:
        counts = run_async(scenario())
    finally:
        db.dispose()
    assert counts["first_reads"] == 1, counts  # 50 streams at one cursor: one read
    assert counts["later_reads"] == 1, counts  # the new write: one read for all
    assert counts["polls"] <= counts["periods"] + 2, counts  # one poll a period, not 50


def test_runs_list_streams_get_each_change_once(api: Api, settings: Settings) -> None:
    """/stream/runs: a change is one event on every listener; a poll that finds nothing new
    sends nothing (the window of recently updated runs is re-read every period)."""
    from backend.api.routes.stream import _runs_events

    fast = settings.model_copy(update={"stream_poll_s": 0.1})
    db = Database(fast)
    run = api.external()

    async def scenario() -> list[list[tuple[int, int]]]:
        hub = StreamHub(db, fast)
        received: list[list[tuple[int, int]]] = [[], []]

        async def follow(events: list[tuple[int, int]]) -> None:
            async for e in _runs_events(hub):
                data = json.loads(parse_frame(e)[1])
                events.append((data["id"], data["step"]))

        tasks = [asyncio.create_task(follow(r)) for r in received]
        await until(lambda: hub.runs_listeners == 2 and hub._runs_seen is not None, 60, "baseline")
        await asyncio.to_thread(log_points, api, run["id"], range(1, 3))
        await until(lambda: all((run["id"], 2) in r for r in received), 60, "the change")
        await asyncio.sleep(10 * fast.stream_poll_s)  # polls that find the same state
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert hub.runs_listeners == 0
        return received

    try:
        received = run_async(scenario())
    finally:
        db.dispose()
    for events in received:
        assert events.count((run["id"], 2)) == 1, events


def test_steps_logged_through_the_worker_sink_reach_a_live_stream(
    api: Api, settings: Settings
) -> None:
    """The freshness path of bench/freshness.py, on each database: a trainer thread logs steps
    through a default ``DbSink`` (its writer thread commits them, no flush asked for) and a
    stream with the default poll period delivers them, step by step, while the run trains."""
    from backend.models import Run
    from conspo.sink import StepRecord
    from worker.db_sink import DbSink

    run = api.external()
    live = settings.model_copy(
        update={"stream_poll_s": Settings.model_fields["stream_poll_s"].default}
    )
    db = Database(live)
    with db.session() as s:
        attempt = s.get(Run, run["id"]).attempt  # type: ignore[union-attr]
    sink = DbSink(db, run["id"], attempt)
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():  # a step every ~50 ms until the stream has seen enough
            step += 1
            sink.log_step(StepRecord(step, 10**6, time.time(), {"loss": float(step)}))
            time.sleep(0.05)

    async def scenario() -> int:
        hub = StreamHub(db, live)
        seen = [0]

        async def follow() -> None:
            async for frame in _run_events(hub, live, run["id"], StreamCursor()):
                kind, data = parse_frame(frame)
                if kind == "metrics":
                    seen[0] = max(seen[0], json.loads(data)["step_max"])
                if seen[0] >= 5:
                    return

        follower = asyncio.create_task(follow())
        trainer = asyncio.create_task(asyncio.to_thread(train))
        await until(lambda: seen[0] >= 5, 60, "step 5 on the stream")
        stop.set()
        await asyncio.gather(follower, trainer)
        return seen[0]

    try:
        assert run_async(scenario()) >= 5
        sink.flush()  # every logged step is stored, the buffered tail included
    finally:
        db.dispose()


def test_a_poll_that_finds_nothing_new_reads_a_few_columns_only(
    api: Api, settings: Settings
) -> None:
    """What keeps a short poll period cheap: while nothing changes, each poll is one query of a
    few columns of the watched runs and one of the runs-list window; no run is read whole (no
    ``config`` column), no worker list; and a change reads only the run that moved."""
    from backend.api.routes.stream import _runs_events

    quiet, moving = api.external(), api.external()
    fast = settings.model_copy(update={"stream_poll_s": 0.1})
    db = Database(fast)
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    async def scenario() -> tuple[list[str], list[str], list[tuple[str, Any]]]:
        hub = StreamHub(db, fast)
        events: list[tuple[str, Any]] = []

        async def follow(run_id: int) -> None:
            async for frame in _run_events(hub, fast, run_id, StreamCursor()):
                events.append((str(run_id), parse_frame(frame)))

        async def listen() -> None:
            async for frame in _runs_events(hub):
                events.append(("list", parse_frame(frame)))

        tasks = [asyncio.create_task(follow(r["id"])) for r in (quiet, moving) for _ in range(5)]
        tasks.append(asyncio.create_task(listen()))
        await until(lambda: len(events) == 10 and hub._runs_seen is not None, 60, "baselines")
        del statements[:]
        await asyncio.sleep(10 * fast.stream_poll_s)
        idle = list(statements)
        del statements[:]
        await asyncio.to_thread(log_points, api, moving["id"], range(1, 2))
        await until(lambda: sum(e[0] == "list" for e in events) == 1, 60, "the list's event")
        await until(lambda: sum(e[0] == str(moving["id"]) for e in events) == 10, 60, "metrics")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return idle, list(statements), events

    try:
        idle, after_change, events = run_async(scenario())
    finally:
        db.dispose()
    assert 5 <= len(idle) <= 2 * 11, idle  # two a poll, ~10 polls
    assert not [s for s in idle if "config" in s or "FROM workers" in s], idle
    whole = [s for s in after_change if "runs.config" in s]
    # the moved run, once for its 5 streams and the list (twice if the write fell between the
    # poll's two queries)
    assert 1 <= len(whole) <= 2, after_change
    assert not [s for s in after_change if "FROM workers" in s]  # no queued run shown
    assert not any(name == str(quiet["id"]) for name, _ in events[10:])


def test_a_phase_change_alone_reaches_a_live_stream(api: Api, settings: Settings) -> None:
    """A run evaluating for minutes logs no step: its phase, written on its row as the worker's
    sink writes it, is a status frame of its own (an open page said 'setting up' throughout)."""
    from sqlalchemy import update

    from backend.models import Run

    run = api.external()
    log_points(api, run["id"], range(1, 2))
    fast = settings.model_copy(update={"stream_poll_s": 0.2})
    db = Database(fast)

    async def scenario() -> list[tuple[str, Any]]:
        hub = StreamHub(db, fast)
        events: list[tuple[str, Any]] = []

        async def follow() -> None:
            async for e in _run_events(hub, fast, run["id"], StreamCursor()):
                events.append(parse_frame(e))

        def phases() -> list[Any]:
            return [json.loads(d).get("phase") for kind, d in events if kind == "status"]

        task = asyncio.create_task(follow())
        await until(lambda: any(kind == "metrics" for kind, _ in events), 60, "the first points")
        with db.session() as session:
            session.execute(update(Run).where(Run.id == run["id"]).values(phase="evaluating"))
            session.commit()
        await until(lambda: "evaluating" in phases(), 60, "a status frame with the phase")
        await asyncio.to_thread(log_points, api, run["id"], range(2, 3), status="succeeded")
        await until(lambda: events and events[-1][0] == "end", 60, "the end")
        await task
        return events

    try:
        run_async(scenario())
    finally:
        db.dispose()
