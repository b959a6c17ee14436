"""Live updates over Server-Sent Events, fed by polling the database (works in both modes).

* ``/runs/{id}/stream``: ``metrics`` events with the points written after the cursor, ``status``
  events when the run's state changes, ``end`` once it is finished and every point was sent.
  The cursor is the run's write sequence (``backend.storage.stream.StreamCursor``), not a
  step, so a key written later to a step already sent (an eval metric, a TRL summary) is still
  streamed. Each event carries it as ``id``; a reconnect with ``Last-Event-ID`` resumes without
  loss or repeats.
* ``/stream/runs``: a ``run`` event whenever any run's status or step changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from pydantic_core import to_json
from sqlalchemy import select
from sse_starlette import EventSourceResponse

from backend.api.deps import DatabaseDep, RunDep, SettingsDep
from backend.config import Settings
from backend.db import Database
from backend.models import FINISHED, Run, utcnow
from backend.schemas import INT32_MAX, run_out
from backend.storage.stream import StreamChunk, StreamCursor, query_new_points

router = APIRouter(tags=["live"])

STATUS_FIELDS = ("status", "cancel_requested", "error", "finished_at", "worker_host", "attempt")


def _event(event: str, data: Any, cursor: StreamCursor) -> dict[str, Any]:
    return {"event": event, "id": cursor.event_id, "data": to_json(data).decode()}


def _last_event_id(request: Request, since_step: int | None) -> StreamCursor | None:
    raw = request.headers.get("last-event-id", "")
    return StreamCursor.parse(raw, since_step) if raw.strip() else None


@router.get("/runs/{run_id}/stream")
async def run_stream(
    request: Request,
    run: RunDep,
    db: DatabaseDep,
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
            cursor = StreamCursor(since_step=since_step, backlog_until=run.write_seq)
    return EventSourceResponse(
        _run_events(request, db, settings, run.id, cursor),
        ping=int(settings.stream_keepalive_s),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _run_events(
    request: Request, db: Database, settings: Settings, run_id: int, cursor: StreamCursor
) -> AsyncIterator[dict[str, Any]]:
    last_status: tuple[Any, ...] | None = None
    while True:
        snapshot = await anyio.to_thread.run_sync(_run_snapshot, db, run_id, cursor)
        if snapshot is None:  # deleted
            yield _event("end", {"reason": "deleted"}, cursor)
            return
        run, chunk = snapshot
        cursor = chunk.cursor
        if chunk.series:
            yield _event("metrics", {"step_max": chunk.step_max, "series": chunk.series}, cursor)
        status_key = tuple(run[f] for f in STATUS_FIELDS)
        if status_key != last_status:
            last_status = status_key
            yield _event("status", run, cursor)
        if run["status"] in FINISHED and not chunk.series:
            yield _event("end", {"status": run["status"], "step_max": run["step"]}, cursor)
            return
        if chunk.series:
            continue  # more may be waiting (writes are sent in chunks)
        if await request.is_disconnected():
            return
        await asyncio.sleep(settings.stream_poll_s)


def _run_snapshot(
    db: Database, run_id: int, cursor: StreamCursor
) -> tuple[dict[str, Any], StreamChunk] | None:
    with db.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        out = run_out(run)
        # Points after the run row was read, so a finished status never outruns its points.
        return out, query_new_points(session, run_id, cursor)


@router.get("/stream/runs")
async def runs_stream(
    request: Request, db: DatabaseDep, settings: SettingsDep
) -> EventSourceResponse:
    """A ``run`` event (data: Run) whenever a run's status or step changes."""
    return EventSourceResponse(
        _runs_events(request, db, settings),
        ping=int(settings.stream_keepalive_s),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _runs_events(
    request: Request, db: Database, settings: Settings
) -> AsyncIterator[dict[str, Any]]:
    # Rows updated in an overlapping window are compared with what was last seen, so writers
    # whose clocks or commits lag by a few seconds are still caught, and nothing repeats.
    overlap = timedelta(seconds=max(10.0, 5 * settings.stream_poll_s))
    seen: dict[int, tuple[Any, ...]] = {}
    since = utcnow() - overlap
    first = True
    while True:
        now = utcnow()
        runs = await anyio.to_thread.run_sync(_changed_runs, db, since)
        since = now - overlap
        for run in runs:
            sig = (run["status"], run["step"], run["cancel_requested"], run["error"])
            if seen.get(run["id"]) != sig:
                seen[run["id"]] = sig
                if not first:
                    yield {"event": "run", "id": str(run["id"]), "data": to_json(run).decode()}
        first = False
        if await request.is_disconnected():
            return
        await asyncio.sleep(settings.stream_poll_s)


def _changed_runs(db: Database, since: Any) -> list[dict[str, Any]]:
    with db.session() as session:
        rows = session.scalars(select(Run).where(Run.updated_at >= since).order_by(Run.updated_at))
        return [run_out(r) for r in rows.unique()]
