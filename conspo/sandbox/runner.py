"""Run a Python snippet in a fresh bubblewrap sandbox, or many through a bounded pool.

Each snippet gets its own process tree inside ``bwrap``: its own user (uid 65534, no
capabilities), network (loopback only: nothing on the host is reachable), PID, IPC and UTS
namespaces; a read-only view of /usr, /lib, /bin, the few /etc files the loader needs, the
interpreter's own directories and /proc/sys; a private size-capped tmpfs as ``/tmp`` and cwd,
another as ``/dev/shm``, a read-only ``/dev`` (see ``Limits`` for all the snippet can hold); an
empty environment but for PATH, HOME, LANG and the PYTHON* settings below. The bwrap process is
started in a new session with rlimits set before exec (CPU, address space, processes, file size,
open files, no core), which everything inside inherits, and in a pids and a memory cgroup of its
own when they can be made (``cgroup``). The snippet is the sandbox's PID 1 (``--as-pid-1``), so
bwrap reaps it itself and its CPU time (and that of the children it waited for) reaches
``os.wait4``; when it exits or is killed every process left in its PID namespace dies with it.
At the wall-clock limit the whole session is killed, then whatever is left in the cgroup.

``unsafe_local=True`` runs the snippet as a plain subprocess with the same rlimits, timeout,
output caps and empty environment, but with the caller's network, file system and user: only
for code the caller already trusts (tests of the tools themselves on a machine without bwrap).
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO

from conspo.sandbox.base import Limits, SandboxResult, SandboxUnavailable, Snippet
from conspo.sandbox.cgroup import SnippetCgroup, make_snippet_cgroup
from conspo.system import host_memory_bytes

SANDBOX_UID = 65534  # nobody: owns nothing on the read-only system
SYSTEM_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")
# The loader's cache and the targets of /usr/bin/* symlinks; nothing with a host secret.
ETC_BINDS = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)
SNIPPET_PATH = "/sandbox/main.py"  # outside /tmp, so the snippet cannot rewrite itself
TRUNCATION_NOTE = "\n[conspo sandbox: {stream} cut at {cap} bytes; {dropped} more bytes dropped]\n"
KILL_GRACE_SECONDS = 2.0  # after the kill, how long the pipes may still drain


def _sandbox_env(python: str) -> dict[str, str]:
    bin_dir = os.path.dirname(python)
    return {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # the system view is read-only anyway; no noise
        "PYTHONUNBUFFERED": "1",  # what was printed before a kill still comes back
        "PYTHONIOENCODING": "utf-8",
    }


@lru_cache(maxsize=8)
def interpreter_dirs(python: str) -> tuple[str, ...]:
    """The directories ``python`` needs to start: its venv, its base installation, its own
    directory (each as named and resolved), less what the system binds already show."""
    if python == sys.executable:
        prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        asked = subprocess.run(
            [
                python,
                "-c",
                "import sys; print(sys.prefix, sys.base_prefix, sys.exec_prefix,"
                " sys.base_exec_prefix, sep='\\n')",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={},
        )
        prefixes = asked.stdout.split()
    found: list[str] = []
    for path in [*prefixes, os.path.dirname(python), os.path.dirname(os.path.realpath(python))]:
        for each in (os.path.abspath(path), os.path.realpath(path)):
            shown = each == "/" or any(_under(each, system) for system in SYSTEM_BINDS)
            if not shown and os.path.isdir(each) and each not in found:
                found.append(each)
    # A directory inside another is shown by the outer bind.
    return tuple(d for d in found if not any(o != d and _under(d, o) for o in found))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def bwrap_argv(python: str, snippet_file: str, limits: Limits) -> list[str]:
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
    ]
    # The tmpfs first: a bind below /tmp (an interpreter in a venv under /tmp) made after it
    # lands inside it, where one made before would be hidden by it.
    argv += [
        "--size",
        str(limits.tmpfs_bytes),
        "--tmpfs",
        "/tmp",
        "--proc",
        "/proc",
        # The kernel lets the host's uid 0 write any sysctl with no capability, and a worker
        # run as root maps the sandbox's user to it: core_pattern (a command run as root on the
        # next crash), the pipe and shared-memory limits. bwrap covers /proc/sys only where the
        # directory is writable, which it never is; a read-only bind covers it always.
        "--ro-bind",
        "/proc/sys",
        "/proc/sys",
        "--dev",
        "/dev",
        # bwrap's /dev is an uncapped tmpfs the sandbox's user owns, with /dev/shm a plain
        # directory in it: a capped tmpfs of its own goes on /dev/shm, and /dev turns read-only
        # (not recursively: /dev/shm and the device nodes keep their own mounts' flags).
        "--size",
        str(limits.shm_bytes),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
    ]
    for path in SYSTEM_BINDS + ETC_BINDS:
        argv += ["--ro-bind-try", path, path]
    for path in interpreter_dirs(python):
        argv += ["--ro-bind", path, path]
    argv += [
        "--ro-bind",
        snippet_file,
        SNIPPET_PATH,
        "--chdir",
        "/tmp",
        # The root bwrap builds the view in (and /etc, /sandbox in it) is writable otherwise.
        "--remount-ro",
        "/",
        "--clearenv",
    ]
    for name, value in _sandbox_env(python).items():
        argv += ["--setenv", name, value]
    return [*argv, "--", python, "-B", SNIPPET_PATH]


def _set_rlimits(limits: Limits, cgroup: SnippetCgroup | None) -> None:
    """The child's preexec_fn: runs between fork and exec, so it only sets limits."""
    if cgroup is not None:
        cgroup.join()
    cpu = limits.cpu_seconds
    for which, value in (
        # The soft CPU limit sends SIGXCPU; the hard one a second later, SIGKILL.
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits.address_space_bytes,) * 2),
        (resource.RLIMIT_NPROC, (limits.processes,) * 2),
        (resource.RLIMIT_FSIZE, (limits.file_size_bytes,) * 2),
        (resource.RLIMIT_NOFILE, (limits.open_files,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)


@dataclass
class _Stream:
    name: str
    cap: int
    kept: bytearray
    dropped: int = 0

    def take(self, chunk: bytes) -> None:
        room = self.cap - len(self.kept)
        self.kept += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += TRUNCATION_NOTE.format(stream=self.name, cap=self.cap, dropped=self.dropped)
        return text


def _drain(
    proc: subprocess.Popen[bytes], limits: Limits, started: float
) -> tuple[_Stream, _Stream, bool]:
    """Read both pipes as they fill, keeping at most the cap of each (the rest is read and
    dropped, so a snippet printing 100 MB neither blocks nor sits in memory), and kill the
    session at the wall-clock limit. Returns (stdout, stderr, timed_out)."""
    assert proc.stdout is not None and proc.stderr is not None
    streams = {
        proc.stdout.fileno(): _Stream("stdout", limits.output_bytes, bytearray()),
        proc.stderr.fileno(): _Stream("stderr", limits.output_bytes, bytearray()),
    }
    out, err = streams.values()
    deadline = started + limits.wall_seconds
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:
                    break  # killed, and a pipe is still held open: stop waiting for it
                timed_out = True
                _kill_session(proc)
                deadline = time.monotonic() + KILL_GRACE_SECONDS
                continue
            for key, _ in selector.select(timeout=left):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    streams[key.fd].take(chunk)
                else:
                    selector.unregister(key.fd)
    return out, err, timed_out


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _exit_code(status: int, through_bwrap: bool) -> int:
    code = os.waitstatus_to_exitcode(status)
    # bwrap reports a child killed by signal N as exit 128 + N, as a shell does; give it back
    # the way subprocess reports signals (a snippet that itself exits 129..192 reads the same).
    if through_bwrap and 128 < code <= 128 + signal.NSIG:
        return -(code - 128)
    return code


class MemoryGate:
    """Snippets at once in this process, bounded by what their memory budgets add up to.

    Each snippet is bounded (``Limits.memory_budget_bytes``), but a run's tools.parallel calls,
    of every rollout, run at the same time: at 64 calls of the defaults that is 37 GiB of a
    host whose trainer needs its memory too. A snippet waits here until its budget fits beside
    those already running; one larger than the whole gate runs alone. Per process: each of a
    distributed run's ranks has its own.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._held = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, budget_bytes: int) -> Iterator[None]:
        need = min(budget_bytes, self.capacity_bytes)
        with self._changed:
            self._changed.wait_for(lambda: self._held + need <= self.capacity_bytes)
            self._held += need
        try:
            yield
        finally:
            with self._changed:
                self._held -= need
                self._changed.notify_all()


# Half the host's memory (or its container's limit) for the snippets of one process at once.
MEMORY_GATE = MemoryGate(host_memory_bytes() // 2)


def run(
    snippet: Snippet | str,
    limits: Limits = Limits(),
    *,
    python: str | None = None,
    unsafe_local: bool = False,
) -> SandboxResult:
    """Run one snippet and return what it printed, how it ended and what it cost.

    Waits first, while the snippets already running in this process hold ``MEMORY_GATE``.
    Raises ``SandboxUnavailable`` (saying why) where bwrap does not work here, unless
    ``unsafe_local`` asks for a plain subprocess instead (see the module docstring)."""
    snippet = Snippet(snippet) if isinstance(snippet, str) else snippet
    with MEMORY_GATE.hold(limits.memory_budget_bytes):
        return _run(snippet, limits, python, unsafe_local)


def _run(snippet: Snippet, limits: Limits, python: str | None, unsafe_local: bool) -> SandboxResult:
    python = python or sys.executable
    through_bwrap = not unsafe_local
    if through_bwrap:
        probe = sandbox_available(python)
        if not probe:
            raise SandboxUnavailable(f"cannot sandbox code: {probe.reason}")
    cgroup = make_snippet_cgroup(limits.processes, limits.memory_budget_bytes)
    if cgroup is None and through_bwrap and os.geteuid() == 0:
        raise SandboxUnavailable(
            "cannot bound the number of processes: running as root (RLIMIT_NPROC does not apply)"
            " and no pids cgroup can be created"
        )
    with tempfile.TemporaryDirectory(prefix="conspo-snippet-") as scratch:
        os.chmod(scratch, 0o755)  # the sandbox's user must read the snippet it is given
        source_file = Path(scratch, "main.py")
        source_file.write_text(snippet.source)
        stdin_file = Path(scratch, "stdin")
        stdin_file.write_text(snippet.stdin)
        if through_bwrap:
            argv, cwd = bwrap_argv(python, str(source_file), limits), None
        else:
            argv, cwd = [python, "-B", str(source_file)], Path(scratch, "cwd")
            cwd.mkdir()
        try:
            with stdin_file.open("rb") as stdin:
                return _run_process(argv, cwd, stdin, python, limits, cgroup, through_bwrap)
        finally:
            if cgroup is not None:
                cgroup.kill_all_and_remove()


def _run_process(
    argv: list[str],
    cwd: Path | None,
    stdin: IO[bytes],
    python: str,
    limits: Limits,
    cgroup: SnippetCgroup | None,
    through_bwrap: bool,
) -> SandboxResult:
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=_sandbox_env(python),  # bwrap's own environment is /proc/1/environ inside
        start_new_session=True,
        preexec_fn=lambda: _set_rlimits(limits, cgroup),  # noqa: PLW1509 (nothing but rlimits)
        pass_fds=(),
    )
    try:
        out, err, timed_out = _drain(proc, limits, started)
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        _kill_session(proc)  # whatever stayed in the session (a snippet detached from bwrap)
    proc.returncode = os.waitstatus_to_exitcode(status)  # wait4 reaped it, not Popen
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return SandboxResult(
        stdout=out.text(),
        stderr=err.text(),
        exit_code=_exit_code(status, through_bwrap),
        timed_out=timed_out,
        stdout_truncated=out.dropped > 0,
        stderr_truncated=err.dropped > 0,
        wall_seconds=time.monotonic() - started,
        cpu_seconds=usage.ru_utime + usage.ru_stime,
    )


def run_many(
    snippets: Sequence[Snippet | str],
    limits: Limits = Limits(),
    *,
    max_workers: int = 4,
    python: str | None = None,
    unsafe_local: bool = False,
) -> list[SandboxResult]:
    """Run the snippets, at most ``max_workers`` at once; results in the snippets' order."""
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox") as pool:
        futures = [
            pool.submit(run, each, limits, python=python, unsafe_local=unsafe_local)
            for each in snippets
        ]
        return [future.result() for future in futures]


# A library caller on a machine without a sandbox may run model-written code unsandboxed by
# setting this to 1 in its environment: an explicit opt-in, never a config field (a config can
# come from anyone). The platform's worker clears it at start.
UNSAFE_LOCAL_ENV = "CONSPO_UNSAFE_LOCAL_CODE"


def unsafe_local_opt_in() -> bool:
    return os.environ.get(UNSAFE_LOCAL_ENV) == "1"


def require_sandbox(needs: Sequence[str]) -> bool:
    """Check that what ``needs`` names (``RunConfig.code_execution``: the tools and tasks that
    run model-written code) can run here: True when it must run unsandboxed (the caller opted
    in), False when the sandbox works or nothing needs it. Raises ``SandboxUnavailable``,
    naming what needs it and why the sandbox does not work, otherwise."""
    if not needs:
        return False
    probe = sandbox_available()
    if probe:
        return False
    if unsafe_local_opt_in():
        return True
    raise SandboxUnavailable(
        f"{', '.join(needs)} runs model-written code, and this machine cannot sandbox it:"
        f" {probe.reason}. Install bubblewrap, or (only for models you trust) set"
        f" {UNSAFE_LOCAL_ENV}=1 to run it without a sandbox"
    )


@dataclass(frozen=True)
class Probe:
    available: bool
    reason: str  # what was found, or why not

    def __bool__(self) -> bool:
        return self.available


@lru_cache(maxsize=8)
def sandbox_available(python: str | None = None) -> Probe:
    """Whether a trivial snippet really runs through bwrap here, tried once per interpreter."""
    python = python or sys.executable
    if shutil.which("bwrap") is None:
        return Probe(False, "bwrap is not installed (apt-get install bubblewrap)")
    cgroup = make_snippet_cgroup(Limits().processes, Limits().memory_budget_bytes)
    if cgroup is None and os.geteuid() == 0:
        return Probe(False, "running as root with no writable pids cgroup: processes unbounded")
    try:
        with tempfile.TemporaryDirectory(prefix="conspo-probe-") as scratch:
            os.chmod(scratch, 0o755)
            source = Path(scratch, "main.py")
            source.write_text("print('ok')")
            with open(os.devnull, "rb") as stdin:
                result = _run_process(
                    bwrap_argv(python, str(source), Limits()),
                    None,
                    stdin,
                    python,
                    Limits(wall_seconds=30),
                    cgroup,
                    True,
                )
    except OSError as exc:
        return Probe(False, f"bwrap could not start: {exc}")
    finally:
        if cgroup is not None:
            cgroup.kill_all_and_remove()
    if result.stdout.strip() != "ok" or result.exit_code != 0:
        return Probe(
            False, f"bwrap failed (exit {result.exit_code}): {result.stderr.strip()[-300:]}"
        )
    pids = "a pids cgroup" if cgroup is not None else "RLIMIT_NPROC"
    memory = "a memory cgroup" if cgroup is not None and cgroup.bounds_memory else "rlimits only"
    return Probe(True, f"bwrap works; processes bounded by {pids}, memory by {memory}")
