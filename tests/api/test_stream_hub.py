"""The stream hub's contract: many streams of a run cost one poll a period and one point read
per write, however many they are (counted on the real database's statements)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sqlalchemy import event

from backend.api.routes.stream import _run_events
from backend.api.stream_hub import StreamHub
from backend.config import Settings
from backend.db import Database
from backend.storage.stream import StreamCursor
from tests.api.conftest import Api

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
        counts = asyncio.run(scenario())
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
        received = asyncio.run(scenario())
    finally:
        db.dispose()
    for events in received:
        assert events.count((run["id"], 2)) == 1, events
