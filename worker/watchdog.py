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
* the process has sent no pulse for ``heartbeat_timeout_s + cancel_grace_s`` and its heartbeat
  is that old too, while the watchdog itself has reached the database for that long (so it is
  the process that is stuck, not the database): the process is killed and the run recovered as
  the reaper recovers a dead worker's (re-queued, or failed at ``max_attempts``), the death
  recorded as a stall.

The pulse is the liveness signal nothing but the interpreter itself can block: a thread of the
training process (``Pulse``) writes a byte into a pipe every ``heartbeat_interval_s``, no database
and no lock in the way. The database heartbeat alone cannot tell a wedged process from a live one
whose writes wait (a SQLite writer's lock, a slow commit, a pool checkout): a live SmolLM2 worker
was killed that way mid-run (issue 37). So while pulses arrive and the heartbeat runs late, the
watchdog writes the heartbeat for the attempt itself (the same conditional update: only while
the attempt owns the run), and the reapers never see a live run stale.

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
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select

from backend.config import Settings
from backend.db import Database
from backend.models import Run, RunStatus, utcnow
from backend.pipelines.stages import install_hooks
from backend.runs import lifecycle

log = logging.getLogger(__name__)


class Pulse(threading.Thread):
    """Writes a byte into the watchdog's pipe every ``interval``: proof that this process's
    interpreter runs, whatever its database writes are waiting for."""

    def __init__(self, fd: int, interval: float) -> None:
        super().__init__(name="watchdog-pulse", daemon=True)
        self.fd, self.interval = fd, interval
        self._done = threading.Event()
        os.set_blocking(fd, False)

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                os.write(self.fd, b".")
            except BlockingIOError:  # the watchdog is behind on reading: it has pulses enough
                continue
            except OSError:  # the watchdog is gone
                return

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass
class Guard:
    """An attempt's watchdog process and the pulse this process sends it."""

    proc: subprocess.Popen[bytes]
    pulse: Pulse


def start(settings: Settings, run_id: int, attempt: int) -> Guard:
    """The watchdog of this process's attempt at ``run_id``, as a child process, and its pulse."""
    env = {**os.environ, "CONSPO_WATCHDOG_SETTINGS": settings.model_dump_json()}
    readable, writable = os.pipe()
    args = ["--run", str(run_id), "--attempt", str(attempt), "--pid", str(os.getpid())]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.watchdog", *args, "--pulse-fd", str(readable)],
            env=env,
            pass_fds=(readable,),
        )
    except BaseException:
        os.close(writable)
        raise
    finally:
        os.close(readable)
    pulse = Pulse(writable, settings.heartbeat_interval_s)
    pulse.start()
    return Guard(proc, pulse)


def stop(guard: Guard) -> None:
    guard.pulse.stop()
    proc = guard.proc
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


class PulseReader:
    """The watchdog's end of the pipe: when the last pulse came (the start counts as one)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.last = time.monotonic()
        if fd is not None:
            os.set_blocking(fd, False)

    def silent_for(self) -> float | None:
        """Seconds since the last pulse; None without a pipe (judged by the heartbeat alone)."""
        if self.fd is None:
            return None
        try:
            while os.read(self.fd, 4096):  # b"" (EOF): the process closed it, ended or died
                self.last = time.monotonic()
        except BlockingIOError:
            pass
        return time.monotonic() - self.last


def watch(
    settings: Settings, run_id: int, attempt: int, pid: int, pulse_fd: int | None = None
) -> str:
    """Watch until the attempt ends or the process is killed; returns what happened.

    ``pulse_fd``: the read end of the process's pulse pipe; without one, a stale heartbeat alone
    marks the process stuck."""
    db = Database(settings)
    grace = settings.cancel_grace_s
    stall_s = stall_limit(settings)
    pulses = PulseReader(pulse_fd)
    late_s = late_limit(settings)
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
            silent = pulses.silent_for()
            beat_age = (utcnow() - row.heartbeat_at).total_seconds() if row.heartbeat_at else 0.0
            if silent is not None and silent < stall_s:
                if beat_age >= late_s:  # alive, its own beats held up: beat for it
                    _beat_for(db, run_id, attempt, beat_age, told)
                continue
            if beat_age >= stall_s and now - reached_since >= stall_s:
                return _stalled(db, settings, run_id, pid, silent)
        return "process gone"
    finally:
        db.dispose()


def late_limit(settings: Settings) -> float:
    """Heartbeat age past which the watchdog beats for a process whose pulses still arrive:
    well before the reapers' limit, well after the process's own beats are due."""
    return min(settings.heartbeat_timeout_s / 3, max(3 * settings.heartbeat_interval_s, 1.0))


def _beat_for(db: Database, run_id: int, attempt: int, age: float, told: dict[str, float]) -> None:
    try:
        with db.session() as session:
            beat = lifecycle.heartbeat(session, run_id, attempt)
    except Exception as exc:  # the database is away or locked: the next round tries again
        log.info("run %s: watchdog beat failed (%s)", run_id, type(exc).__name__)
        return
    if beat is not lifecycle.Beat.LOST and "beat" not in told:
        told["beat"] = time.monotonic()
        log.warning(
            "run %s: its heartbeat was %.0f s old while its process pulsed; the watchdog beats"
            " for it until its own beats come through",
            run_id, age,
        )  # fmt: skip


def stall_limit(settings: Settings) -> float:
    """Seconds without a heartbeat after which a live process is stuck: the reapers' limit
    (they re-queue the run then) plus the grace a process has to act on what it is told."""
    return settings.heartbeat_timeout_s + settings.cancel_grace_s


def _stalled(db: Database, settings: Settings, run_id: int, pid: int, silent: float | None) -> str:
    """Kill the stuck process, then recover the run as the reaper would, saying why."""
    why = (
        f"was killed by its watchdog: no heartbeat for over {stall_limit(settings):g} s"
        " while its process lived (the training thread held the interpreter"
        + ("" if silent is None else f"; no pulse for {silent:.0f} s")
        + ")"
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
    parser.add_argument("--pulse-fd", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watchdog %(message)s")
    settings = Settings.model_validate_json(os.environ["CONSPO_WATCHDOG_SETTINGS"])
    install_hooks()  # it finishes runs too (cancelled), like every process that does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info(
        "run %s attempt %s: %s",
        args.run,
        args.attempt,
        watch(settings, args.run, args.attempt, args.pid, args.pulse_fd),
    )


if __name__ == "__main__":
    main()
