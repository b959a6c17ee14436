"""Which workers are alive: each worker's reaper thread renews its ``workers`` row every pass.

A worker that stops cleanly removes its row; one that was killed leaves a row that stops being
renewed, is no longer counted after ``Settings.worker_alive_s`` and is pruned a day later.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from backend.models import Worker, utcnow

FORGET_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class WorkerIdentity:
    """This process as a worker: ``host:pid`` (several workers may share a host), and what it
    can run (``worker.capabilities.probe``)."""

    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started_at: datetime = field(default_factory=utcnow)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    capabilities: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.host}:{self.pid}"


def mark_alive(session: Session, me: WorkerIdentity) -> None:
    """Renew ``me``'s row (insert it on the first pass); forget workers gone for a day."""
    now = utcnow()
    renewed = session.execute(update(Worker).where(Worker.name == me.name).values(seen_at=now))
    if not renewed.rowcount:  # type: ignore[attr-defined]
        session.add(
            Worker(
                name=me.name,
                host=me.host,
                pid=me.pid,
                started_at=me.started_at,
                seen_at=now,
                gpus=me.gpus,
                capabilities=me.capabilities,
            )
        )
    session.execute(delete(Worker).where(Worker.seen_at < now - FORGET_AFTER))
    session.commit()


def mark_stopped(session: Session, me: WorkerIdentity) -> None:
    session.execute(delete(Worker).where(Worker.name == me.name))
    session.commit()


def alive(session: Session, seen_after: datetime) -> list[Worker]:
    """Workers whose reaper renewed their row after ``seen_after``, newest first."""
    return list(
        session.scalars(
            select(Worker).where(Worker.seen_at > seen_after).order_by(Worker.seen_at.desc())
        )
    )
