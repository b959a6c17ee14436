"""Health: database and broker reachability, live workers, stranded runs, mode, version, and
the live streams open on the answering process.

``down`` (HTTP 503, so a container healthcheck fails) when the database or the broker cannot be
reached; ``degraded`` (200: the API still serves) when runs cannot make progress: queued runs
whose job the broker lost, no live worker (embedded mode: ever; cluster: while runs wait or
run), a running run whose heartbeat is stale (its worker
died or is stuck), or a database too slow to answer within ``health_timeout_s``.

Health answers within ``health_timeout_s`` whatever the database does: its queries run on a
thread with that deadline (and, on PostgreSQL, that statement timeout), so a locked table makes
it say so rather than wait with everyone else.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
from celery import Celery
from fastapi import APIRouter, Response, status
from sqlalchemy import text
from sqlalchemy.orm import Session

from backend import liveness
from backend.api.deps import CeleryDep, DatabaseDep, JobsDep, SettingsDep, StreamHubDep
from backend.config import VERSION, Settings
from backend.db import Database
from backend.models import RunStatus, Worker, utcnow
from backend.runs import lifecycle
from backend.runs.queue import JobQueue
from backend.schemas import Health
from backend.storage.runs import count_in, count_queued, stale_running
from conspo import plugins

router = APIRouter(tags=["health"])


def _short(exc: BaseException) -> str:
    # Never echo credentials that a URL in an error message might carry.
    msg = re.sub(r"://[^@/\s]+@", "://***@", str(exc))[:200]
    return f"error: {type(exc).__name__}: {msg}"


def _probe(check: Callable[[], Any]) -> str:
    try:
        check()
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        return _short(exc)
    return "ok"


def _ping_database(db: Database) -> None:
    with db.engine.connect() as conn:
        conn.execute(text("SELECT 1"))


@dataclass
class Work:
    """What the database says about the work: live workers, queued and stranded runs."""

    workers: list[Worker] = field(default_factory=list)
    queued: int = 0
    running: int = 0
    stranded: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)  # running, heartbeat older than the timeout


def _work(db: Database, jobs: JobQueue | None, settings: Settings) -> Work:
    """``jobs`` None: the broker is down, so stranded runs cannot be told apart."""
    now = utcnow()
    with db.session() as session:
        # Longer than the answer's own deadline: health answers "locked or overloaded" at that
        # deadline, and this only ends the abandoned query soon after (were it shorter, a
        # cancelled query could be read as the database down).
        _statement_timeout(session, 2 * settings.health_timeout_s + 1)
        work = Work(
            workers=liveness.alive(session, now - timedelta(seconds=settings.worker_alive_s)),
            queued=count_queued(session),
            running=count_in(session, RunStatus.running),
            stale=stale_running(session, now - timedelta(seconds=settings.heartbeat_timeout_s)),
        )
        if jobs is not None:
            sent_before = now - timedelta(seconds=settings.unclaimed_resend_s)
            work.stranded = lifecycle.stranded(session, jobs, sent_before)
    return work


def _degraded(settings: Settings, work: Work) -> list[str]:
    reasons = []
    if work.stranded:
        reasons.append(
            f"{len(work.stranded)} queued run(s) sent over {settings.unclaimed_resend_s:g} s ago "
            "are missing from the job queue (broker data loss?); the workers' reapers re-send "
            "them"
        )
    # a cluster may scale its workers to zero while nothing waits or runs
    if not work.workers and (settings.mode == "embedded" or work.queued or work.running):
        reasons.append(
            f"no worker is alive; {work.queued} run(s) queued"
            + (f", {work.running} running" if work.running else "")
        )
    if work.stale:
        reasons.append(
            f"{len(work.stale)} running run(s) sent no heartbeat for over"
            f" {settings.heartbeat_timeout_s:g} s (worker dead or stuck; the reapers re-queue"
            f" them): {', '.join(map(str, work.stale[:20]))}"
        )
    return reasons


def _statement_timeout(session: Session, seconds: float) -> None:
    """PostgreSQL: this transaction's statements give up after ``seconds``."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL statement_timeout = {max(1, round(seconds * 1000))}"))


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "The database or the broker is down."}},
)
async def health(
    db: DatabaseDep,
    celery: CeleryDep,
    jobs: JobsDep,
    settings: SettingsDep,
    hub: StreamHubDep,
    response: Response,
) -> dict[str, Any]:
    checks, work, down, slow = await _checked(db, celery, jobs, settings)
    reasons = down + slow + _degraded(settings, work)
    if down:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return {
        "status": "down" if down else "degraded" if reasons else "ok",
        **checks,
        "mode": settings.mode,
        "version": VERSION,
        "workers": [_worker_out(w) for w in work.workers],
        "stranded_runs": work.stranded,
        "stale_runs": work.stale,
        "reasons": reasons,
        "live_streams": {"open": hub.open_streams, "runs_watched": hub.runs_watched},
        "plugins": plugins.report(),
    }


async def _checked(
    db: Database, celery: Celery, jobs: JobQueue, settings: Settings
) -> tuple[dict[str, str], Work, list[str], list[str]]:
    """(the probes, the work, what is down, what was too slow), within the health timeout."""
    result: dict[str, Any] = {"checks": {"database": "unknown", "broker": "unknown"}}

    def probe() -> None:
        checks = result["checks"]
        checks["database"] = _probe(lambda: _ping_database(db))
        checks["broker"] = _probe(_pinger(celery))
        if checks["database"] == "ok":
            try:
                result["work"] = _work(db, jobs if checks["broker"] == "ok" else None, settings)
            except Exception as exc:  # noqa: BLE001 - a query failed after the ping: reported
                result["failed"] = f"reading the queue state failed: {_short(exc)}"

    with anyio.move_on_after(settings.health_timeout_s) as scope:
        await anyio.to_thread.run_sync(probe, abandon_on_cancel=True)
    late = f"no answer within {settings.health_timeout_s:g} s (CONSPO_HEALTH_TIMEOUT_S)"
    checks = {k: f"error: {late}" if v == "unknown" else v for k, v in result["checks"].items()}
    down = [f"{name} {state}" for name, state in checks.items() if state != "ok"]
    if "failed" in result:
        down.append(result["failed"])
    slow = []
    if scope.cancelled_caught and not down:  # reachable, but its queries wait (a lock?)
        slow.append(f"the database's queue state: {late}; the database is locked or overloaded")
    return checks, result.get("work", Work()), down, slow


def _pinger(celery: Celery) -> Callable[[], None]:
    def ping() -> None:
        with celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)

    return ping


def _worker_out(worker: Worker) -> dict[str, Any]:
    return {
        "name": worker.name,
        "host": worker.host,
        "started_at": worker.started_at.timestamp(),
        "seen_at": worker.seen_at.timestamp(),
        "gpus": worker.gpus or [],
        "capabilities": worker.capabilities or {},
    }
