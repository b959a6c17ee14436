"""Riding out database outages: retry transient errors with backoff, for a bounded time.

A dropped connection (a PostgreSQL restart or failover, ``pg_terminate_backend``, a network
blip) or a SQLite database locked past its busy timeout is not the run's fault: the worker's
writes are retried, and they may be, because each is idempotent (points are upserts on
(run, key, step); heartbeat, claim and finish are conditional updates). An error of any other
kind is the run's own and is raised at once. When one outage outlasts the limit the attempt
gives up with ``DatabaseUnavailable``; the worker then hands the run back without failing it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from worker.shutdown import Interrupt

log = logging.getLogger(__name__)

T = TypeVar("T")


class DatabaseUnavailable(Exception):
    """The database stayed unreachable past the limit, or the worker is shutting down."""


def is_transient(exc: BaseException) -> bool:
    """A connection-level failure (retry it), not an error of the statement or the run.

    SQLAlchemy raises ``OperationalError`` for a lost connection, a failed connect, SQLite's
    "database is locked" and PostgreSQL's deadlock or serialization failures, all of which a
    retry of the whole transaction cures.
    """
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError | PoolTimeout)


def short(exc: BaseException) -> str:
    first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    text = first[0] if first else ""
    return f"{type(exc).__name__}: " + re.sub(r"://[^@/\s]+@", "://***@", text)[:200]


class Outage:
    """Retries transient database errors with exponential backoff until one outage (the time
    since the first failure after the last success) has lasted ``limit_s``.

    One per attempt, shared by its writers (claim, sink, heartbeat, finish): an outage is timed
    once, whoever meets it. Setting ``interrupt`` (the worker is shutting down) ends a wait.
    """

    def __init__(
        self,
        limit_s: float,
        *,
        interrupt: Interrupt | None = None,
        first_delay_s: float = 0.2,
        max_delay_s: float = 5.0,
    ) -> None:
        self.limit_s = limit_s
        self.interrupt: Interrupt = interrupt or threading.Event()
        self.first_delay_s, self.max_delay_s = first_delay_s, max_delay_s
        self._since: float | None = None
        self._lock = threading.Lock()

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried while its errors are transient and the outage is within bounds.

        The outage is timed from this call's own first failure too, so another writer's
        success (a heartbeat getting through while bulk writes keep failing) cannot make it
        retry forever.
        """
        delay, first_failure = self.first_delay_s, None
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                first_failure = time.monotonic() if first_failure is None else first_failure
                self.failed(what, exc, first_failure)
                if self.interrupt.wait(delay):
                    stopped = f"{what}: stopped while waiting for the database"
                    raise DatabaseUnavailable(stopped) from exc
                delay = min(2 * delay, self.max_delay_s)
            else:
                self.recovered()
                return result

    def failed(self, what: str, exc: BaseException, first_failure: float | None = None) -> None:
        """Note a transient failure; raise ``DatabaseUnavailable`` once the outage (since the
        first failure after the last success, or since ``first_failure`` if earlier) is past
        the limit."""
        with self._lock:
            now = time.monotonic()
            if self._since is None:
                self._since = now
            began = self._since if first_failure is None else min(self._since, first_failure)
        lasted = now - began
        if lasted >= self.limit_s:
            raise DatabaseUnavailable(
                f"{what}: the database has been unreachable for {lasted:.0f} s "
                f"(limit {self.limit_s:g} s); last error {short(exc)}"
            ) from exc
        log.warning("%s: %s; retrying", what, short(exc))

    def recovered(self) -> None:
        with self._lock:
            self._since = None
