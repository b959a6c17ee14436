"""What building a task costs, measured in a child process under a time and memory budget.

    prober = TaskProber(slots=2)
    probe = prober.probe(task_config, eval_size=200)   # raises TaskRefused, ProberBusy
    probe.held_out     # distinct held-out problems found (≤ 200); None: not counted in time

A procedural task's parameters set how big its problems are and how long drawing one takes
(reasoning-gym's chain_sum at 10^7 terms: a minute and a gigabyte for one question), and
whether its held-out split has as many distinct problems as a run asks for. Both can only be
known by building the task and drawing from it: third-party code, at a cost the config sets.
So it never runs in the caller's process. Each of ``slots`` helper processes
(``python -m conspo.tasks.probe``) imports the task modules once, then for every request forks
a child that caps its own address space (``RLIMIT_AS``), builds the task and draws; the helper
kills the child at the deadline. A probe starts in milliseconds (no import), a slow or
allocating config costs its own child, and the helpers are a bounded pool: a caller waits
``wait_s`` at most for a free one, then gets ``ProberBusy``.

What it refuses (``TaskRefused``): a task that cannot be built or drawn from within the budget,
or whose problems are longer than ``max_prompt_chars``. What it counts: the distinct held-out
problems, up to ``eval_size``, if the count finishes in time (a task whose problems are slow to
draw is not refused for that: its count is then None, and the run says how many it scored).
Tasks that read dataset files are not probed (``probed``): the data roots judge those files.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

from conspo.config import TaskConfig

# Modules each helper imports once, so that a probe forks with them loaded.
PRELOAD = ("conspo.tasks", "conspo.tasks.reasoning_gym", "reasoning_gym")
# A helper's reply may come this long after the probe's own deadline (fork, kill, reap).
REPLY_MARGIN_S = 5.0
# A new helper says it is ready (its imports done: seconds, more on a busy machine) within this.
START_TIMEOUT_S = 120.0
READY = "ready"
# A build that failed under the memory cap in a way that is not plainly a MemoryError is tried
# again with at least this much more room (``_draw``).
RETRY_ROOM_BYTES = 256 << 20


@dataclass(frozen=True)
class ProbeBudget:
    seconds: float = 10.0
    memory_bytes: int = 1 << 30  # above what the forked child starts with
    max_prompt_chars: int = 20_000  # a problem's text: ~6,000 tokens, a small model's context


@dataclass(frozen=True)
class TaskProbe:
    asked: int  # eval_size
    held_out: int | None  # distinct held-out problems found, ≤ asked; None: not counted in time
    longest_prompt: int  # characters, of the problems drawn
    seconds: float  # building the task and drawing its first problems


class TaskRefused(ValueError):
    """A task config that cannot be built or drawn from within the budget. ``lasting``: the
    same config would be refused again (an error, a size); not a deadline missed on a busy
    machine, nor a helper that died."""

    def __init__(self, message: str, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


class ProberBusy(RuntimeError):
    """Every helper stayed busy for the caller's whole wait, or the one taken could not start
    or stopped answering (the machine's trouble, not the config's)."""


def probed(task: TaskConfig) -> bool:
    """Whether a prober judges this task: procedural ones (no dataset files to read)."""
    return not getattr(task.task_params(), "data_paths", ())


class TaskProber:
    """A bounded pool of probe helpers; thread-safe. Helpers start on first use."""

    def __init__(self, slots: int = 2, wait_s: float = 2.0) -> None:
        self.wait_s = wait_s
        self._free: queue.Queue[_Helper] = queue.Queue()
        for _ in range(max(1, slots)):
            self._free.put(_Helper())

    def probe(
        self, task: TaskConfig, eval_size: int, budget: ProbeBudget | None = None
    ) -> TaskProbe:
        budget = budget or ProbeBudget()
        try:
            helper = self._free.get(timeout=self.wait_s)
        except queue.Empty:
            raise ProberBusy(f"every task check is busy (waited {self.wait_s:g} s)") from None
        try:  # a helper that cannot start or stops answering raises ProberBusy
            reply = helper.ask(
                {"task": task.model_dump(mode="json"), "eval_size": eval_size, **asdict(budget)},
                budget.seconds + REPLY_MARGIN_S,
            )
        finally:
            self._free.put(helper)
        return _judge(reply, eval_size, budget)

    def close(self) -> None:
        """Stop the helpers (a later probe starts them again)."""
        for helper in list(self._free.queue):
            helper.close()


def _judge(reply: dict[str, Any], eval_size: int, budget: ProbeBudget) -> TaskProbe:
    """The helper's account of one probe as a result or a refusal."""
    built, counted, failure = reply.get("built"), reply.get("held_out"), reply.get("failure")
    if built is None:
        kind, detail = failure or ["died", ""]
        raise TaskRefused(_failure(kind, detail, budget), lasting=kind in ("error", "memory"))
    longest, seconds = built
    if counted is not None:
        longest = max(longest, counted[1])
    if longest > budget.max_prompt_chars:
        raise TaskRefused(
            f"its problems are too long: one is {longest:,} characters, at most"
            f" {budget.max_prompt_chars:,} here; make them smaller"
        )
    return TaskProbe(eval_size, None if counted is None else counted[0], longest, seconds)


def _failure(kind: str, detail: str, budget: ProbeBudget) -> str:
    if kind == "memory":
        return (
            "building this task and drawing a problem needs over"
            f" {budget.memory_bytes / 2**30:g} GiB; make its problems smaller"
        )
    if kind == "timeout":
        return (
            f"building this task and drawing a problem took over {budget.seconds:g} s; make"
            " its problems smaller"
        )
    if kind == "died":
        return f"building this task killed its process ({detail or 'no reason given'})"
    return f"drawing a problem failed: {detail}"


class _Helper:
    """One helper process, started on first use and again after it dies or stops answering."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._said_ready = False  # the current process has written READY
        self._lock = threading.Lock()

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The helper's reply; raises ``ProberBusy`` when it cannot start or stops answering
        (the next request starts a new one)."""
        with self._lock:
            proc = self._ready()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                line = _read_line(proc.stdout, timeout_s)
            except (OSError, ValueError):
                line = None
            if line is None:
                self._stop()
                raise ProberBusy("the task check's helper stopped answering")
            return dict(json.loads(line))

    def _ready(self) -> subprocess.Popen[str]:
        """The running helper, its imports done (a new one is waited for)."""
        proc = self._started()
        if not self._said_ready:
            assert proc.stdout is not None
            try:
                line = _read_line(proc.stdout, START_TIMEOUT_S)
            except (OSError, ValueError):
                line = None
            if line is None or line.strip() != READY:
                self._stop()
                raise ProberBusy(f"the task check's helper did not start in {START_TIMEOUT_S:g} s")
            self._said_ready = True
        return proc

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._said_ready = False
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "conspo.tasks.probe"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


def _read_line(stream: IO[str], timeout_s: float) -> str | None:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        return None
    line = stream.readline()
    return line or None


# --------------------------------------------------------------------------------------------
# The helper process: one probe at a time, each in a forked child it kills at the deadline
# --------------------------------------------------------------------------------------------


def serve() -> None:
    # Replies go to the original stdout alone: whatever a module or a task prints goes to
    # stderr, so it can never be read as a reply.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for module in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(module)
    replies.write(READY + "\n")
    replies.flush()
    for line in sys.stdin:
        reply = _probe_in_child(json.loads(line), replies.fileno())
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _probe_in_child(request: dict[str, Any], replies_fd: int) -> dict[str, Any]:
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        # It must not outlive the helper (the helper enforces its deadline), nor hold the
        # helper's reply pipe open (the server would wait its whole timeout for an EOF from a
        # helper already dead).
        _die_with_parent()
        os.close(replies_fd)
        os.close(readable)
        _draw(writable, request)
        os._exit(0)
    os.close(writable)
    deadline = time.monotonic() + request["seconds"]
    reply: dict[str, Any] = {}
    buffer = b""
    with os.fdopen(readable, "rb") as messages:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([messages], [], [], left)
            if not ready:
                break
            chunk = os.read(messages.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for message in lines:
                kind, *rest = json.loads(message)
                reply[kind] = rest[0] if kind == "failure" else rest
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if "built" not in reply and "failure" not in reply:
        if time.monotonic() >= deadline:
            reply["failure"] = ["timeout", ""]
        elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT:
            # Under the address-space limit an allocation in C code that fails aborts the
            # process (a C++ bad_alloc's terminate, a malloc check) instead of raising
            # MemoryError: the budget's refusal, as a MemoryError would give.
            reply["failure"] = ["memory", "signal 6 (an allocation failed)"]
        elif os.WIFSIGNALED(status):
            reply["failure"] = ["died", f"signal {os.WTERMSIG(status)}"]
        else:
            reply["failure"] = ["died", f"exit status {os.WEXITSTATUS(status)}"]
    return reply


def _draw(fd: int, request: dict[str, Any]) -> None:
    """The child: build the task, report its first problems' length, then count held-out.

    A failure under the memory cap may surface as any exception at all (an allocation failed in
    the parser, in C code that set no error, ...), so a failure that is not plainly a
    MemoryError is tried once more with more room (``RETRY_ROOM_BYTES`` over the cap): what
    then succeeds failed for want of memory, and is the budget's refusal."""

    def send(*message: Any) -> None:
        os.write(fd, (json.dumps(message) + "\n").encode())

    try:
        limit = _cap_memory(request["memory_bytes"])
        try:
            _build_and_count(request, send)
        except Exception as first:
            if _ran_out_of_memory(first):
                raise
            _raise_soft_limit(limit + max(request["memory_bytes"], RETRY_ROOM_BYTES))
            _build_and_count(request, lambda *message: None)  # the retry only tells apart
            send("failure", ["memory", ""])  # it needed the room the cap did not leave
    except BaseException as exc:  # whatever the task raises is what is wrong with it
        with contextlib.suppress(Exception):
            if _ran_out_of_memory(exc):
                send("failure", ["memory", ""])
            else:
                send("failure", ["error", f"{type(exc).__name__}: {exc}"[:500]])


def _build_and_count(request: dict[str, Any], send: Callable[..., None]) -> None:
    started = time.monotonic()
    from conspo.tasks import make_task

    task = make_task(TaskConfig.model_validate(request["task"]))
    prompts = task.train_prompts(random.Random(0), 4)
    longest = max((len(p.prompt) for p in prompts), default=0)
    send("built", longest, time.monotonic() - started)
    if longest > request["max_prompt_chars"]:
        return
    held_out = task.eval_examples(request["eval_size"])
    send("held_out", len(held_out), max((len(p.prompt) for p in held_out), default=0))


def _ran_out_of_memory(exc: BaseException) -> bool:
    """Whether a MemoryError is anywhere in the chain: generators wrap what they hit (word_ladder
    raises ``RuntimeError("Error processing words.csv content: ")`` from the MemoryError). Under
    the address-space cap a C extension whose allocation failed may return without setting any
    error, which Python reports as the SystemError below: that is the cap too."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, MemoryError):
            return True
        if isinstance(current, SystemError) and "without exception set" in str(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the request took
        os._exit(1)


def _cap_memory(extra_bytes: int) -> int:
    """Cap the address space at what it is now plus ``extra_bytes`` (an allocation past it
    raises MemoryError); the cap in bytes."""
    with open("/proc/self/statm") as f:
        virtual = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = virtual + extra_bytes
    _raise_soft_limit(limit)
    return limit


def _raise_soft_limit(limit: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


if __name__ == "__main__":
    serve()
