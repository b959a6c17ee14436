"""A process beside each attempt that stops the attempt when the attempt's own threads cannot.

The heartbeat (``worker.tasks.Heartbeat``) is a thread of the training process: it beats and
reads cancel requests as long as the interpreter lets it run. C code that holds the GIL for long
(a regular expression in Python's ``re``, a tokenizer on a huge string) stops it too: the
run's heartbeat goes stale, a cancel is never acted on, and the reaper hands the same poison to
the next worker while this one keeps burning a core. The watchdog is a separate process, so
nothing the training process does can block it. Every ``interval`` it reads the run's row:

* the training process is gone: the watchdog exits;
* the attempt no longer owns the run (re-queued by a reaper, deleted) and the process still
  runs it ``cancel_grace_s`` later: the process is killed (it should have stopped at its next
  step boundary);
* a cancel was requested and the run is still running ``cancel_grace_s`` later (the trainer
  stops at its next step boundary, normally within seconds): the run is recorded cancelled
  (``lifecycle.finish``) and the training process killed;
* the heartbeat is older than ``heartbeat_timeout_s + cancel_grace_s`` (the reapers re-queue
  the run after the first, unless the stuck process holds its worker's reaper too) while the
  watchdog itself has reached the database for that long (so it is the process that is stuck,
  not the database): the process is killed and the run recovered as the reaper recovers a dead
  worker's (re-queued, or failed at ``max_attempts``), the death recorded as a stall.

Each case gives the process ``cancel_grace_s`` to act before it is killed. Started by
``worker.tasks.execute_run`` (``start``), stopped when the attempt ends (before its outcome is
recorded, so a normal end is never taken for a lost attempt).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

from sqlalchemy import select

from backend.config import Settings
from backend.db import Database
from backend.models import Run, RunStatus, utcnow
from backend.pipelines.stages import install_hooks
from backend.runs import lifecycle

log = logging.getLogger(__name__)


def start(settings: Settings, run_id: int, attempt: int) -> subprocess.Popen[bytes]:
    """The watchdog of this process's attempt at ``run_id``, as a child process."""
    env = {**os.environ, "CONSPO_WATCHDOG_SETTINGS": settings.model_dump_json()}
    args = ["--run", str(run_id), "--attempt", str(attempt), "--pid", str(os.getpid())]
    return subprocess.Popen([sys.executable, "-m", "worker.watchdog", *args], env=env)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def watch(settings: Settings, run_id: int, attempt: int, pid: int) -> str:
    """Watch until the attempt ends or the process is killed; returns what happened."""
    db = Database(settings)
    grace = settings.cancel_grace_s
    stall_s = stall_limit(settings)
    reached_since: float | None = None  # start of the current run of successful reads
    told: dict[str, float] = {}  # "cancel" / "lost" → when the watchdog first saw it
    try:
        while _alive(pid):
            time.sleep(settings.heartbeat_interval_s)
            try:
                with db.session() as session:
                    row = session.execute(
                        select(
                            Run.status, Run.attempt, Run.cancel_requested, Run.heartbeat_at
                        ).where(Run.id == run_id)
                    ).first()
            except Exception as exc:  # the database is away: nothing to judge by
                log.info("run %s: watchdog read failed (%s)", run_id, type(exc).__name__)
                reached_since = None
                continue
            now = time.monotonic()
            reached_since = reached_since if reached_since is not None else now
            if row is None or row.status != RunStatus.running or row.attempt != attempt:
                # deleted, or re-queued by a reaper: the trainer stops at its next step
                if now - told.setdefault("lost", now) >= grace:
                    log.error("run %s: attempt %s lost, still going %ss on", run_id, attempt, grace)
                    _kill(pid)
                    return "killed: lost"
                continue
            if row.cancel_requested and now - told.setdefault("cancel", now) >= grace:
                return _cancel(db, run_id, attempt, pid, grace)
            stale = utcnow() - timedelta(seconds=stall_s)
            if row.heartbeat_at < stale and now - reached_since >= stall_s:
                return _stalled(db, settings, run_id, pid)
        return "process gone"
    finally:
        db.dispose()


def stall_limit(settings: Settings) -> float:
    """Seconds without a heartbeat after which a live process is stuck: the reapers' limit
    (they re-queue the run then) plus the grace a process has to act on what it is told."""
    return settings.heartbeat_timeout_s + settings.cancel_grace_s


def _stalled(db: Database, settings: Settings, run_id: int, pid: int) -> str:
    """Kill the stuck process, then recover the run as the reaper would, saying why."""
    why = (
        f"was killed by its watchdog: no heartbeat for over {stall_limit(settings):g} s"
        " while its process lived (the training thread held the interpreter)"
    )
    log.error("run %s: %s; killing process %s", run_id, why, pid)
    _kill(pid)
    stale_before = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)
    with db.session() as session:
        lifecycle.recover_stalled(session, run_id, stale_before, settings.max_attempts, why)
    return "killed: stalled"


def _cancel(db: Database, run_id: int, attempt: int, pid: int, grace: float) -> str:
    with db.session() as session:
        cancelled = lifecycle.finish(session, run_id, attempt, RunStatus.cancelled)
    if cancelled:
        log.error(
            "run %s: cancel not honoured within %ss; recorded cancelled, killing process %s",
            run_id, grace, pid,
        )  # fmt: skip
        _kill(pid)
        return "killed: cancelled"
    return "ended"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, as another user
        return True
    return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watchdog %(message)s")
    settings = Settings.model_validate_json(os.environ["CONSPO_WATCHDOG_SETTINGS"])
    install_hooks()  # it finishes runs too (cancelled), like every process that does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info("run %s attempt %s: %s", args.run, args.attempt, watch(settings, **_ids(args)))


def _ids(args: argparse.Namespace) -> dict[str, int]:
    return {"run_id": args.run, "attempt": args.attempt, "pid": args.pid}


if __name__ == "__main__":
    main()
