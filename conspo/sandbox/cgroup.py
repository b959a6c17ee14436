"""A pids cgroup per snippet: the one bound on a fork bomb that holds when the worker is root.

RLIMIT_NPROC counts the processes of a real uid and is not enforced for root; a sandbox started
by root maps its user to root outside, so the rlimit alone would let a fork bomb exhaust the
host's PIDs. A cgroup's ``pids.max`` counts the snippet's processes and threads only, whoever
runs them, and lets every process left in it be found and killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

V1_PIDS = Path("/sys/fs/cgroup/pids")
PREFIX = "conspo-sandbox-"
REMOVE_WAIT_S = 2.0
STALE_AFTER_S = 60.0  # far past the moment between a cgroup's mkdir and its child joining
V2_ROOT = Path("/sys/fs/cgroup")


def _own_pids_cgroup() -> Path | None:
    """The directory of this process's pids cgroup (v1 pids hierarchy, or v2 with pids on)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") and V1_PIDS.is_dir():
            return V1_PIDS / path.lstrip("/")
        if controllers == "" and (V2_ROOT / "cgroup.controllers").exists():
            own = V2_ROOT / path.lstrip("/")
            enabled = (own / "cgroup.subtree_control").read_text().split()
            return own if "pids" in enabled else None
    return None


class PidsCgroup:
    """A fresh cgroup with ``pids.max``; ``join_fd`` is written by the child before it execs."""

    def __init__(self, parent: Path, max_pids: int) -> None:
        self.path = parent / f"{PREFIX}{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(max_pids))
            # Opened here, written in the child: the child's preexec_fn then makes no allocation
            # heavier than a small write.
            self.join_fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
        except OSError:
            self.path.rmdir()
            raise

    def join(self) -> None:
        """Runs in the child between fork and exec: move it (and all it will start) in here."""
        os.write(self.join_fd, str(os.getpid()).encode())

    def kill_all_and_remove(self) -> None:
        """Kill whatever is left (a process that escaped the process group) and remove it. A
        killed process keeps its cgroup busy until the kernel has reaped it, so removal is
        retried for up to ``REMOVE_WAIT_S``; what still stands then is swept by a later
        snippet (``sweep_stale``)."""
        os.close(self.join_fd)
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            with contextlib.suppress(OSError):
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)


def sweep_stale(parent: Path) -> None:
    """Remove the empty ``conspo-sandbox-*`` cgroups earlier snippets could not. rmdir fails on
    one that holds a process; one made a moment ago by a snippet in another thread may still be
    empty, waiting for its child to join, so only those older than ``STALE_AFTER_S`` go."""
    now = time.time()
    for stale in parent.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            if now - stale.stat().st_mtime > STALE_AFTER_S:
                stale.rmdir()


def make_pids_cgroup(max_pids: int) -> PidsCgroup | None:
    """A cgroup bounding ``max_pids``, or None where cgroups are not ours to write."""
    parent = _own_pids_cgroup()
    if parent is None:
        return None
    sweep_stale(parent)
    try:
        return PidsCgroup(parent, max_pids)
    except OSError:
        return None
