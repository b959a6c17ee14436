"""The worker's Celery app (settings from CONSPO_* env vars) and its reaper thread.

Start it with ``conspo-lab worker`` (concurrency 1, prefetch 1, the queues of every capacity
class this machine can hold: ``gpu``, ``gpu-2`` … ``gpu-N``, ``gpu-ray``; see
``backend.runs.scheduling``) or ``celery -A worker.celery_app worker -Q gpu -c 1 -P solo``.

Stale runs are recovered by a thread in every worker instead of celery beat: there is no extra
process to deploy (embedded mode has exactly one worker), a restarted worker recovers the runs
of the worker it replaces as soon as their heartbeats are stale, and the conditional updates in
``worker.reaper`` make several workers reaping at once harmless. The same thread renews the
worker's row in ``workers`` (``backend.liveness``), which ``/api/health`` counts; the row also
holds the GPUs and optional packages the worker found at start (``worker.capabilities``).

Model-written code runs only in the sandbox here: the library's opt-out
(``CONSPO_UNSAFE_LOCAL_CODE``) is removed from the environment when this module loads.

A warm shutdown (SIGTERM) stops the run in progress at its next step boundary and hands it back
to the queue (``worker.shutdown``).

Importing this module registers the lifecycle's hooks (``backend.pipelines.stages.install_hooks``:
a succeeded stage releases its pipeline's next stage), so every process that runs tasks has them.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from backend.config import get_settings
from backend.db import Database
from backend.pipelines.stages import install_hooks
from backend.runs.queue import JobQueue, make_celery
from conspo.sandbox import UNSAFE_LOCAL_ENV
from worker import shutdown  # noqa: F401  (connects the SIGTERM handling: see its docstring)

log = logging.getLogger(__name__)


def refuse_unsandboxed_code() -> None:
    """Forget ``CONSPO_UNSAFE_LOCAL_CODE``: a library caller's opt-in to run model-written code
    without a sandbox, which a platform worker never honours (its runs' code is anyone's
    model's). Cleared before anything runs, so no training process it starts inherits it."""
    if os.environ.pop(UNSAFE_LOCAL_ENV, None) is not None:
        log.warning(
            "%s was set; a worker never runs model-written code without its sandbox: ignored"
            " (runs that need one fail where bubblewrap does not work)",
            UNSAFE_LOCAL_ENV,
        )


refuse_unsandboxed_code()
settings = get_settings()
celery_app = make_celery(settings)
celery_app.conf.include = ["worker.tasks"]
app = celery_app  # `celery -A worker.celery_app` looks for `app` or `celery`
install_hooks()  # lifecycle.finish (in worker.tasks) releases a pipeline's next stage

_reaper: Any = None


@lru_cache(maxsize=1)
def database() -> Database:
    """This process's database (its engine and pool), shared by the tasks and the reaper."""
    return Database(get_settings())


@worker_ready.connect
def _start_reaper(**_: Any) -> None:
    global _reaper
    from backend.liveness import WorkerIdentity
    from worker.capabilities import probe
    from worker.reaper import ReaperThread

    gpus, capabilities = probe(settings)
    log.info("worker capabilities: gpus=%s %s", gpus or "none", capabilities)
    me = WorkerIdentity(gpus=gpus, capabilities=capabilities)
    _reaper = ReaperThread(database(), JobQueue(celery_app, settings.queue), settings, me)
    _reaper.reap_once()  # recover what a dead predecessor left behind, before taking work
    _reaper.start()


@worker_shutdown.connect
def _stop_reaper(**_: Any) -> None:
    if _reaper is not None:
        _reaper.stop()
