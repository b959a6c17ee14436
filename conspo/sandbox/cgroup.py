"""A snippet's cgroups: pids, the one bound on a fork bomb that holds when the worker is root, and
memory, the one bound on what all of a snippet's processes hold in the host's memory together.

RLIMIT_NPROC counts the processes of a real uid and is not enforced for root; a sandbox started
by root maps its user to root outside, so the rlimit alone would let a fork bomb exhaust the
host's PIDs. A cgroup's ``pids.max`` counts the snippet's processes and threads only, whoever
runs them, and lets every process left in it be found and killed at the end.

RLIMIT_AS bounds one process's address space, and nothing the kernel holds for a snippet outside
it: the sum over its processes, SysV shared memory segments it detached (its IPC namespace has no
size limit: a snippet held 1 GiB that way under a 512 MiB address space), its files in tmpfs, its
pipes' and sockets' buffers. A memory cgroup's limit (``Limits.memory_budget_bytes``) charges all
of these to the snippet, and at the limit its own processes are killed, not the worker. Where no
memory cgroup can be made, only the rlimits, the tmpfs caps and the kernel's own per-pipe and
per-socket caps bound it (``Limits``); ``sandbox_available`` says which holds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

PREFIX = "conspo-sandbox-"
REMOVE_WAIT_S = 2.0
STALE_AFTER_S = 60.0  # far past the moment between a cgroup's mkdir and its child joining
V1_ROOT = V2_ROOT = Path("/sys/fs/cgroup")
# Swap is disk, and TCP buffers are bounded host-wide by net.ipv4.tcp_mem: a kernel that refuses
# these limits (v1's are deprecated) still gets the memory cgroup's main one.
BEST_EFFORT = {"memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes", "memory.swap.max"}


def own_cgroup(controller: str) -> Path | None:
    """The directory of this process's cgroup in ``controller``'s hierarchy (v1, or v2 with the
    controller on for its children), or None where there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") and (V1_ROOT / controller).is_dir():
            return V1_ROOT / controller / path.lstrip("/")
        if controllers == "" and (V2_ROOT / "cgroup.controllers").exists():
            own = V2_ROOT / path.lstrip("/")
            with contextlib.suppress(OSError):
                if controller in (own / "cgroup.subtree_control").read_text().split():
                    return own
    return None


def _memory_settings(parent: Path, max_bytes: int) -> list[tuple[str, str]]:
    """The files that cap memory at ``max_bytes``, swap included, in the order they are set."""
    if (parent / "memory.limit_in_bytes").exists():  # v1
        settings = [("memory.limit_in_bytes", str(max_bytes))]
        # Swap only where it is accounted; TCP buffers only where a limit of their own is set
        # (v2 charges both to memory.max).
        for file in ("memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"):
            if (parent / file).exists():
                settings.append((file, str(max_bytes)))
        return settings
    settings = [("memory.max", str(max_bytes))]
    if (parent / "memory.swap.max").exists():
        settings.append(("memory.swap.max", "0"))
    return settings


class SnippetCgroup:
    """A fresh cgroup in each hierarchy asked for; ``join`` runs in the child before it execs.

    ``limits`` maps each hierarchy's parent directory to the files to write in the new cgroup
    (one directory holds both controllers under cgroup v2)."""

    def __init__(self, limits: dict[Path, list[tuple[str, str]]], bounds_memory: bool) -> None:
        name = f"{PREFIX}{uuid.uuid4().hex[:12]}"
        self.bounds_memory = bounds_memory
        self.paths: list[Path] = []
        self.join_fds: list[int] = []
        try:
            for parent, settings in limits.items():
                path = parent / name
                path.mkdir()
                self.paths.append(path)
                for file, value in settings:
                    try:
                        (path / file).write_text(value)
                    except OSError:
                        if file not in BEST_EFFORT:
                            raise
                # Opened here, written in the child: the child's preexec_fn then makes no
                # allocation heavier than a small write.
                self.join_fds.append(os.open(path / "cgroup.procs", os.O_WRONLY))
        except OSError:
            self.kill_all_and_remove()
            raise

    def join(self) -> None:
        """Runs in the child between fork and exec: move it (and all it will start) in here."""
        pid = str(os.getpid()).encode()
        for fd in self.join_fds:
            os.write(fd, pid)

    def kill_all_and_remove(self) -> None:
        """Kill whatever is left (a process that escaped the process group) and remove the
        cgroups. A killed process keeps its cgroup busy until the kernel has reaped it, so
        removal is retried for up to ``REMOVE_WAIT_S``; what still stands then is swept by a
        later snippet (``sweep_stale``)."""
        for fd in self.join_fds:
            os.close(fd)
        self.join_fds = []
        deadline = time.monotonic() + REMOVE_WAIT_S
        for path in self.paths:
            while True:
                with contextlib.suppress(OSError):
                    for pid in [int(p) for p in (path / "cgroup.procs").read_text().split()]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
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


def make_snippet_cgroup(max_pids: int, max_memory_bytes: int) -> SnippetCgroup | None:
    """Cgroups bounding ``max_pids`` and, where a memory cgroup can be made too,
    ``max_memory_bytes``; None where no pids cgroup is ours to write."""
    pids_parent = own_cgroup("pids")
    if pids_parent is None:
        return None
    pids = [("pids.max", str(max_pids))]
    memory_parent = own_cgroup("memory")
    sweep_stale(pids_parent)
    if memory_parent is not None:
        sweep_stale(memory_parent)
        memory = _memory_settings(memory_parent, max_memory_bytes)
        both = (
            {pids_parent: pids + memory}
            if memory_parent == pids_parent  # cgroup v2: one directory
            else {pids_parent: pids, memory_parent: memory}
        )
        with contextlib.suppress(OSError):  # the memory controller is not ours to write
            return SnippetCgroup(both, bounds_memory=True)
    try:
        return SnippetCgroup({pids_parent: pids}, bounds_memory=False)
    except OSError:
        return None
