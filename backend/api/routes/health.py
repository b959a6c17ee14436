"""Health: database and broker reachability, live workers, stranded runs, mode, version, and
the live streams open on the answering process.

``down`` (HTTP 503, so a container healthcheck fails) when the database or the broker cannot be
reached; ``degraded`` (200: the API still serves) when runs cannot make progress: queued runs
whose job the broker lost, or no live worker (embedded mode: ever; cluster: while runs wait).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery
from fastapi import APIRouter, Response, status
from sqlalchemy import text

from backend import lifecycle, liveness
from backend.api.deps import CeleryDep, DatabaseDep, JobsDep, SettingsDep, StreamHubDep
from backend.config import VERSION, Settings
from backend.db import Database
from backend.models import Worker, utcnow
from backend.queue import JobQueue
from backend.schemas import Health
from backend.storage.runs import count_queued

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
    stranded: list[int] = field(default_factory=list)


def _work(db: Database, jobs: JobQueue | None, settings: Settings) -> Work:
    """``jobs`` None: the broker is down, so stranded runs cannot be told apart."""
    now = utcnow()
    with db.session() as session:
        work = Work(
            workers=liveness.alive(session, now - timedelta(seconds=settings.worker_alive_s)),
            queued=count_queued(session),
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
    if not work.workers and (settings.mode == "embedded" or work.queued):
        reasons.append(f"no worker is alive; {work.queued} run(s) queued")
    return reasons


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "The database or the broker is down."}},
)
def health(
    db: DatabaseDep,
    celery: CeleryDep,
    jobs: JobsDep,
    settings: SettingsDep,
    hub: StreamHubDep,
    response: Response,
) -> dict[str, Any]:
    checks = {"database": _probe(lambda: _ping_database(db)), "broker": _probe(_pinger(celery))}
    down = [f"{name} {state}" for name, state in checks.items() if state != "ok"]
    work = Work()
    if checks["database"] == "ok":
        try:
            work = _work(db, jobs if checks["broker"] == "ok" else None, settings)
        except Exception as exc:  # noqa: BLE001 - a query failed after the ping: reported
            down.append(f"reading the queue state failed: {_short(exc)}")
    reasons = down + _degraded(settings, work)
    if down:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return {
        "status": "down" if down else "degraded" if reasons else "ok",
        **checks,
        "mode": settings.mode,
        "version": VERSION,
        "workers": [_worker_out(w) for w in work.workers],
        "stranded_runs": work.stranded,
        "reasons": reasons,
        "live_streams": {"open": hub.open_streams, "runs_watched": hub.runs_watched},
    }


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
