"""Live updates over Server-Sent Events, fed by polling the database (works in both modes).

* ``/runs/{id}/stream``: ``metrics`` events with the points written after the cursor, ``status``
  events when the run's state changes, ``end`` once it is finished and every point was sent.
  The cursor is the run's write sequence (``backend.storage.stream.StreamCursor``), not a
  step, so a key written later to a step already sent (an eval metric, a TRL summary) is still
  streamed. Each event carries it as ``id``; a reconnect with ``Last-Event-ID`` resumes without
  loss or repeats.
* ``/stream/runs``: a ``run`` event whenever any run's status or step changes.

The polling is shared: one poller per process serves every stream (``backend.api.stream_hub``),
and a stream holds no database connection while it is open. Each caller may hold
``stream_max_per_client`` streams (429 beyond), the process ``stream_max_total`` (503 beyond).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy.exc import SQLAlchemyError
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from backend.api.contract import refusals
from backend.api.deps import RunsStreamStart, RunStreamStart, SettingsDep, StreamHubDep
from backend.api.stream_hub import StreamHub, StreamLimitReached, sse_frame
from backend.config import Settings
from backend.schemas import INT32_MAX
from backend.storage.stream import StreamCursor

log = logging.getLogger(__name__)

router = APIRouter(tags=["live"])

LIMIT_STATUS = {"client": 429, "server": 503}
RETRY_AFTER_S = 5
STREAM_LIMITS = {
    429: "This caller holds CONSPO_STREAM_MAX_PER_CLIENT streams already (Retry-After).",
    503: "The process holds CONSPO_STREAM_MAX_TOTAL streams already (Retry-After).",
}


class LiveResponse(EventSourceResponse):
    """An SSE response that frees its stream slot however it ends (even if never started)."""

    def __init__(
        self, events: AsyncIterator[bytes], release: Callable[[], None], settings: Settings
    ) -> None:
        super().__init__(
            events,
            ping=int(settings.stream_keepalive_s),
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _reserve(hub: StreamHub, caller: str) -> Callable[[], None]:
    try:
        return hub.reserve(caller)
    except StreamLimitReached as exc:
        raise HTTPException(
            LIMIT_STATUS[exc.scope], detail=str(exc), headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from exc


def _last_event_id(request: Request, since_step: int | None) -> StreamCursor | None:
    raw = request.headers.get("last-event-id", "")
    return StreamCursor.parse(raw, since_step) if raw.strip() else None


@router.get(
    "/runs/{run_id}/stream",
    response_class=EventSourceResponse,
    responses=refusals(STREAM_LIMITS),
    openapi_extra={
        "parameters": [
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "The id of the last event received: the stream resumes after it"
                " (browsers send it on reconnecting). One that is not this stream's is ignored.",
            }
        ]
    },
)
async def run_stream(
    request: Request,
    start: RunStreamStart,
    hub: StreamHubDep,
    settings: SettingsDep,
    since_step: Annotated[
        int | None,
        Query(
            ge=-1,
            le=INT32_MAX,
            description="Points at steps up to this one that exist now are not sent (the caller "
            "has them); anything written from now on is, whatever its step.",
        ),
    ] = None,
) -> EventSourceResponse:
    """Events ``metrics``, ``status`` and ``end`` for one run (see the module docstring)."""
    cursor = _last_event_id(request, since_step)
    if cursor is None:
        if since_step is None or since_step < 0:
            cursor = StreamCursor()
        else:
            cursor = StreamCursor(since_step=since_step, backlog_until=start.write_seq)
    release = _reserve(hub, start.caller)
    return LiveResponse(_run_events(hub, settings, start.run_id, cursor), release, settings)


async def _run_events(
    hub: StreamHub, settings: Settings, run_id: int, cursor: StreamCursor
) -> AsyncIterator[bytes]:
    last_status: tuple[Any, ...] | None = None
    async with hub.watch_run(run_id) as feed:
        while True:
            snapshot = await feed.next()
            if snapshot.run is None:  # deleted
                yield sse_frame("end", cursor.event_id, {"reason": "deleted"})
                return
            while True:  # a snapshot's new points may come in several chunks
                try:
                    chunk = await hub.points(snapshot, cursor)
                except SQLAlchemyError as exc:
                    log.warning("run %s stream: reading points failed, retrying: %s", run_id, exc)
                    await asyncio.sleep(settings.stream_poll_s)
                    feed.again()
                    break
                cursor = chunk.cursor
                if chunk.frame is not None:
                    yield chunk.frame
                if snapshot.status_key != last_status:
                    last_status = snapshot.status_key
                    yield snapshot.status_frame(cursor.event_id)
                if chunk.frame is None:
                    if snapshot.finished:
                        assert snapshot.run is not None
                        end = {"status": snapshot.run["status"], "step_max": snapshot.run["step"]}
                        yield sse_frame("end", cursor.event_id, end)
                        return
                    break  # wait for the next change


@router.get("/stream/runs", response_class=EventSourceResponse, responses=refusals(STREAM_LIMITS))
async def runs_stream(
    start: RunsStreamStart, hub: StreamHubDep, settings: SettingsDep
) -> EventSourceResponse:
    """A ``run`` event (data: Run) whenever a run's status or step changes."""
    release = _reserve(hub, start.caller)
    return LiveResponse(_runs_events(hub), release, settings)


async def _runs_events(hub: StreamHub) -> AsyncIterator[bytes]:
    async with hub.listen_runs() as feed:
        while True:
            frames = await feed.next()
            if frames is None:  # fell behind the hub's log: end, the client reconnects
                return
            # one send for all the runs that changed: each send costs the event loop that
            # serves every stream far more than the bytes do
            yield b"".join(frames)
