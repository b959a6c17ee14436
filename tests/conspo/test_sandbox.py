"""The sandbox holds: each test runs a real snippet through bwrap and checks what it could not do.

bwrap missing: the file skips, or fails when CONSPO_REQUIRE_SERVICES=1 (CI), as the services
of tests/api/conftest.py do. Time bounds are generous (the limit plus 10 s): these tests run
beside a loaded CI machine, and only prove that a limit holds, not how fast.
"""

from __future__ import annotations

import ast
import os
import resource
import socket
import threading
import time
from dataclasses import fields
from pathlib import Path

import psutil
import pytest

import conspo.sandbox.runner as sandbox_runner
from conspo.sandbox import Limits, SandboxUnavailable, Snippet, run, run_many, sandbox_available
from conspo.sandbox.base import MIB
from conspo.sandbox.cgroup import make_snippet_cgroup

REQUIRE = os.environ.get("CONSPO_REQUIRE_SERVICES") == "1"
PROBE = sandbox_available()
SLACK = 10.0  # seconds beyond a limit that a loaded machine may take


@pytest.fixture(autouse=True)
def _sandbox_here() -> None:
    if not PROBE:
        if REQUIRE:
            pytest.fail(f"CONSPO_REQUIRE_SERVICES=1 but the sandbox is unavailable: {PROBE.reason}")
        pytest.skip(f"sandbox unavailable: {PROBE.reason}")


def _host_accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("port", [5432, 6379], ids=["postgresql", "redis"])
def test_no_network(port: int) -> None:
    if not _host_accepts(port):
        if REQUIRE:
            pytest.fail(f"nothing listens on 127.0.0.1:{port} on the host")
        pytest.skip(f"nothing listens on 127.0.0.1:{port}: the test would prove nothing")
    result = run(
        "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        f"print(s.connect_ex(('127.0.0.1', {port})))\n"
    )
    assert result.exit_code == 0, result.stderr
    assert int(result.stdout) != 0  # refused: the sandbox's loopback has nobody listening


def test_worker_environment_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSPO_DATABASE_URL", "postgresql://secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    result = run(
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(open('/proc/1/environ', 'rb').read())\n"
        "print(os.listdir('/proc'))\n"
    )
    assert result.exit_code == 0, result.stderr
    assert "secret" not in result.stdout
    assert "CONSPO_DATABASE_URL" not in result.stdout
    # Its /proc shows its own PID namespace only: no host process to read the environ of.
    pids = [entry for entry in ast.literal_eval(result.stdout.splitlines()[2]) if entry.isdigit()]
    assert len(pids) <= 3, pids


@pytest.mark.parametrize(
    "target", [str(Path(__file__).resolve().parent), "/usr", "/etc", "/", "/dev"]
)
def test_cannot_write_outside_its_tmpfs(target: str) -> None:
    result = run(f"open({target!r} + '/conspo-probe', 'w').write('x')")
    assert result.exit_code != 0
    assert "Error" in result.stderr
    assert not Path(target, "conspo-probe").exists()


@pytest.mark.parametrize(
    "setting", ["kernel/core_pattern", "fs/pipe-max-size", "kernel/shmall", "vm/overcommit_memory"]
)
def test_kernel_settings_are_read_only(setting: str) -> None:
    # Opened for writing, never written: were the sandbox to fail, the host stays as it was.
    result = run(f"import os\nos.open('/proc/sys/{setting}', os.O_WRONLY)\n")
    assert result.exit_code != 0
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr


def test_can_write_its_tmpfs_up_to_the_file_size_limit() -> None:
    result = run(
        "open('small', 'w').write('x' * 1000)\n"
        "print(open('small').read() == 'x' * 1000)\n"
        "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))\n",
        Limits(file_size_bytes=1024 * 1024),
    )
    assert result.stdout.startswith("True")
    assert result.exit_code != 0  # SIGXFSZ (or EFBIG) at the second megabyte


# Fills ``{where}`` with files of 1 MiB (the file-size limit) until refused, and reports what it
# wrote and how much the host's shared memory (every tmpfs page, /proc/meminfo's Shmem) grew while
# it still holds those files.
FILL_RAM_FILES = """
import sys
def shmem():
    for line in open('/proc/meminfo'):
        if line.startswith('Shmem:'):
            return int(line.split()[1]) * 1024
before, written, chunk = shmem(), 0, b'x' * (1024 * 1024)
try:
    for i in range({mib}):
        with open(f'{where}/fill{{i}}', 'wb') as f:
            f.write(chunk)
        written += len(chunk)
except OSError as exc:
    print('refused:', exc, file=sys.stderr)
print(written, shmem() - before)
"""


@pytest.mark.parametrize(
    ("where", "cap"), [("/dev/shm", "shm_bytes"), ("/tmp", "tmpfs_bytes")], ids=["shm", "tmp"]
)
def test_ram_file_systems_are_capped_and_spare_the_host(where: str, cap: str) -> None:
    limits = Limits(wall_seconds=60, cpu_seconds=60)
    result = run(FILL_RAM_FILES.format(where=where, mib=200), limits)
    assert result.exit_code == 0, result.stderr
    assert "No space left on device" in result.stderr
    written, shmem_grown = map(int, result.stdout.split())
    assert written <= getattr(limits, cap) <= limits.files_in_memory_bytes
    # The 200 MiB tried would show; other processes of a shared machine come and go.
    assert shmem_grown < 100 * MIB


def _memory_cgroup_here() -> bool:
    cgroup = make_snippet_cgroup(Limits().processes, Limits().memory_budget_bytes)
    if cgroup is None:
        return False
    cgroup.kill_all_and_remove()
    return cgroup.bounds_memory


# Each holds memory by one route outside the address space rlimit, UNIT MiB at a time up to
# TARGET, printing the MiB it holds so far: its last line is what it held when it was stopped
# (killed at the memory budget, or refused more).
HOLD_PRELUDE = "import ctypes, os, socket, time\nUNIT, TARGET = 32, 640\n"
HOLD = {
    # Detached segments belong to no process: only the cgroup sees them.
    "sysv_shm": """
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
for held in range(UNIT, TARGET + 1, UNIT):
    address = libc.shmat(libc.shmget(0, UNIT << 20, 0o600), None, 0)  # IPC_PRIVATE
    ctypes.memset(address, 1, UNIT << 20)
    libc.shmdt(ctypes.c_void_p(address))
    print(held, flush=True)
""",
    # Each process within its address space; together past it. At the budget the kernel kills
    # one of them: only those still alive hold anything.
    "processes": """
alive = set()
for _ in range(TARGET // UNIT):
    r, w = os.pipe()
    if (pid := os.fork()) == 0:
        hog = b'x' * (UNIT << 20)
        os.write(w, b'1')
        time.sleep(60)
    alive.add(pid)
    os.read(r, 1)  # it holds its share, or was killed (end of file)
    alive -= {k for k in alive if os.waitpid(k, os.WNOHANG)[0] == k}
    print(len(alive) * UNIT, flush=True)
""",
    # What one end sent and the other has not read waits in the kernel.
    "unix_sockets": """
held, pairs = 0, []
while held < TARGET << 20 and len(pairs) < 400:
    a, b = socket.socketpair()
    pairs.append((a, b))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
    a.setblocking(False)
    try:
        while True:
            held += a.send(bytes(65536))
    except BlockingIOError:
        print(held >> 20, flush=True)
""",
    "tcp_loopback": """
held, pairs = 0, []
server = socket.create_server(('127.0.0.1', 0), backlog=64)
while held < TARGET << 20 and len(pairs) < 400:
    a = socket.create_connection(server.getsockname())
    pairs.append((a, server.accept()[0]))
    a.setblocking(False)
    try:
        while True:
            held += a.send(bytes(65536))
    except BlockingIOError:
        print(held >> 20, flush=True)
""",
}


@pytest.mark.parametrize("route", list(HOLD))
def test_memory_held_outside_the_address_space_counts_against_the_budget(route: str) -> None:
    if not _memory_cgroup_here():
        if REQUIRE:
            pytest.fail("CONSPO_REQUIRE_SERVICES=1 but no memory cgroup can be made here")
        pytest.skip("no memory cgroup can be made here: memory is bounded per process only")
    limits = Limits(address_space_bytes=128 * MIB, open_files=1024, wall_seconds=60, cpu_seconds=60)
    result = run(HOLD_PRELUDE + HOLD[route], limits)
    assert not result.timed_out, result
    held_mib = int(result.stdout.split()[-1])
    # Slack: a unit whose process is being killed, or TCP's accounting letting a few buffers
    # past the limit before it refuses more.
    assert held_mib * MIB <= limits.memory_budget_bytes + 64 * MIB, result
    assert held_mib < 400, result  # well short of the 640 MiB it tried


@pytest.mark.parametrize("name", [f.name for f in fields(Limits)])
def test_limits_refuse_a_bound_that_is_no_bound(name: str) -> None:
    with pytest.raises(ValueError, match=f"Limits.{name} must be positive"):
        Limits(**{name: 0})  # a tmpfs of size 0 would be uncapped


def test_host_data_is_not_readable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret.txt").write_text("the secret")
    assert (data / "secret.txt").read_text() == "the secret"
    result = run(
        "import os\n"
        f"print(os.path.exists({str(data)!r}))\n"
        f"open({str(data / 'secret.txt')!r}).read()\n"
    )
    assert result.stdout.strip() == "False"
    assert "FileNotFoundError" in result.stderr
    assert "the secret" not in result.stdout + result.stderr


def _own_descendants(besides: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """This process's descendants, but for ``besides`` (pids alive before the test: a helper an
    earlier test of the same process left to wind down is not the sandbox's)."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in besides]


def _descendant_pids() -> frozenset[int]:
    return frozenset(p.pid for p in psutil.Process().children(recursive=True))


def test_fork_bomb_is_contained() -> None:
    earlier = _descendant_pids()
    before = len(psutil.pids())
    limits = Limits(wall_seconds=5, processes=32)
    started = time.monotonic()
    result = run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        limits,
    )
    assert time.monotonic() - started < limits.wall_seconds + SLACK
    assert result.timed_out or result.exit_code != 0
    left = _own_descendants(earlier)
    assert not left, [(p.pid, p.cmdline()) for p in left]
    # Other processes come and go on a shared machine; a bomb's thousands would show.
    assert len(psutil.pids()) < before + 50


def test_fork_bomb_hits_the_process_bound() -> None:
    earlier = _descendant_pids()
    result = run(
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('refused after', n, exc.errno)\n",
        Limits(processes=16, wall_seconds=10),
    )
    assert "refused after" in result.stdout, result
    assert int(result.stdout.split()[2]) < 16
    assert not _own_descendants(earlier)


def test_memory_bomb_is_contained() -> None:
    result = run(
        "try:\n    hog = bytearray(2 * 1024 ** 3)\nexcept MemoryError:\n    print('MemoryError')\n",
        Limits(address_space_bytes=256 * 1024 * 1024),
    )
    assert result.stdout.strip() == "MemoryError" or result.exit_code < 0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mib < 2048


def test_infinite_loop_is_killed_at_the_cpu_limit() -> None:
    limits = Limits(cpu_seconds=1, wall_seconds=60)
    started = time.monotonic()
    result = run("while True:\n    pass\n", limits)
    assert time.monotonic() - started < 2 + SLACK + 20  # CPU seconds, on a shared machine
    assert not result.timed_out
    assert result.exit_code < 0  # SIGKILL at the hard CPU limit (the snippet is its PID 1)
    assert result.cpu_seconds >= 0.9


def test_sleep_is_killed_at_the_wall_timeout_and_nothing_is_left() -> None:
    earlier = _descendant_pids()
    limits = Limits(wall_seconds=2)
    started = time.monotonic()
    result = run(
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "time.sleep(60)\n",
        limits,
    )
    assert time.monotonic() - started < limits.wall_seconds + SLACK
    assert result.timed_out
    assert result.exit_code < 0
    assert not _own_descendants(earlier)
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "60"]]


def test_100_mb_printed_comes_back_cut() -> None:
    limits = Limits(output_bytes=64 * 1024, wall_seconds=60)
    rss_before = psutil.Process().memory_info().rss
    started = time.monotonic()
    result = run(
        "import sys\n"
        "line = 'x' * 1023 + '\\n'\n"
        "for _ in range(100 * 1024):\n"
        "    sys.stdout.write(line)\n",
        limits,
    )
    assert time.monotonic() - started < 30 + SLACK
    assert result.exit_code == 0
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("x" * 1023)
    assert "stdout cut at 65536 bytes" in result.stdout
    assert len(result.stdout) < 65536 + 200
    assert psutil.Process().memory_info().rss - rss_before < 50 * 1024 * 1024


def test_segfault_is_a_signal_exit() -> None:
    result = run("import ctypes\nctypes.string_at(0)\n")
    assert result.exit_code == -11
    assert not result.ok


def test_killing_its_parent_does_not_kill_the_caller() -> None:
    result = run("import os\nos.kill(os.getppid(), 9)\nprint('alive')\n")
    assert result.exit_code in (0, -9)  # getppid is 0 there: it may only kill its own group
    assert os.getpid() == psutil.Process().pid  # we are still here to check


def test_stdin_and_exit_code() -> None:
    result = run(Snippet("import sys\nprint(input()[::-1])\nsys.exit(3)\n", stdin="olleh\n"))
    assert result.stdout == "hello\n"
    assert result.exit_code == 3


class AtOnce:
    """Wraps the runner's function ``name`` to count the calls in it at once (``most``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.running = self.most = 0
        self._lock = threading.Lock()
        self._real = getattr(sandbox_runner, name)
        monkeypatch.setattr(sandbox_runner, name, self._counted)

    def _counted(self, *args: object, **kwargs: object) -> object:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            return self._real(*args, **kwargs)
        finally:
            with self._lock:
                self.running -= 1


def test_pool_keeps_order_and_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    at_once = AtOnce(monkeypatch, "run")
    snippets = [f"import time\ntime.sleep(0.2)\nprint({i} * {i})" for i in range(12)]
    results = run_many(snippets, max_workers=3)
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]
    assert at_once.most == 3


@pytest.mark.parametrize("budgets_fitting", [2, 0])
def test_snippets_at_once_are_bounded_by_the_memory_their_budgets_add_up_to(
    monkeypatch: pytest.MonkeyPatch, budgets_fitting: int
) -> None:
    """tools.parallel calls of many rollouts at once must not add up past the host's memory:
    a gate of two budgets runs two at a time however many the pool allows; one smaller than a
    single budget runs them one at a time (never none)."""
    limits = Limits()
    capacity = max(budgets_fitting * limits.memory_budget_bytes, limits.memory_budget_bytes // 2)
    monkeypatch.setattr(sandbox_runner, "MEMORY_GATE", sandbox_runner.MemoryGate(capacity))
    at_once = AtOnce(monkeypatch, "_run")
    snippets = [f"import time\ntime.sleep(0.3)\nprint({i} * {i})" for i in range(8)]
    results = run_many(snippets, limits, max_workers=8)
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]
    assert 1 <= at_once.most <= max(budgets_fitting, 1)


def test_unavailable_without_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = sandbox_runner.Probe(False, "bwrap is not installed")
    monkeypatch.setattr(sandbox_runner, "sandbox_available", lambda python=None: refused)
    with pytest.raises(SandboxUnavailable, match="bwrap is not installed"):
        run("print(1)")
    assert run("print(1)", unsafe_local=True).stdout == "1\n"
