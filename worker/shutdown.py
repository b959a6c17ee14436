"""A warm shutdown (SIGTERM) stops the run in progress at its next step boundary.

Celery's own warm shutdown waits for the running task to end, which for a training run can be
hours: a redeploy would cost minutes per run, or kill it mid-step at the end of the grace
period. Instead ``SHUTDOWN`` is set, the trainer's ``should_stop`` sees it, the trainer saves a
checkpoint, and the worker hands the run back to the queue (``lifecycle.release``) before it
exits. The next worker resumes it from that checkpoint.

Celery's ``worker_shutting_down`` signal fires in the main process, but with the ``prefork``
pool the task runs in a child, which SIGTERM does not reach when it is sent to the main process
only (``docker stop``), and whose signal handlers billiard owns. So the flag is a byte of shared
memory made before the pool forks: the main process sets it, every pool child reads it, and
setting it from a signal handler takes no lock.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from typing import Any, Protocol

from celery.signals import worker_shutting_down


class Interrupt(Protocol):
    """What a wait can be interrupted by (``threading.Event`` is one)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class SharedFlag:
    """A flag set in one process and seen by the processes it forks afterwards."""

    def __init__(self) -> None:
        self._value = multiprocessing.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self._value.value = True

    def clear(self) -> None:
        self._value.value = False

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` seconds pass first (polls every 0.1 s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(0.1 if left is None else min(0.1, left))
        return True


SHUTDOWN = SharedFlag()  # set: stop the run at the next step boundary and hand it back


@worker_shutting_down.connect
def _stop_the_run(**_: Any) -> None:
    SHUTDOWN.set()
