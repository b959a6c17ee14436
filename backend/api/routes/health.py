"""Health: database and broker reachability, deployment mode, version."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter
from sqlalchemy import text

from backend.api.deps import CeleryDep, DatabaseDep, SettingsDep
from backend.config import VERSION
from backend.schemas import Health

router = APIRouter(tags=["health"])


def _short(exc: BaseException) -> str:
    # Never echo credentials that a URL in an error message might carry.
    msg = re.sub(r"://[^@/\s]+@", "://***@", str(exc))[:200]
    return f"error: {type(exc).__name__}: {msg}"


@router.get("/health", response_model=Health)
def health(db: DatabaseDep, celery: CeleryDep, settings: SettingsDep) -> dict[str, Any]:
    try:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        database = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        database = _short(exc)
    try:
        with celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
        broker = "ok"
    except Exception as exc:  # noqa: BLE001
        broker = _short(exc)
    return {
        "status": "ok" if database == "ok" else "degraded",
        "database": database,
        "broker": broker,
        "mode": settings.mode,
        "version": VERSION,
    }
