"""Checking model-written code by running it: what the code tasks and the HumanEval benchmark
share. The code is read out of the completion (``extract_code``), put into a check program
(``check_program``), run in the sandbox, and the program's last report line is its outcome.

    checks = SandboxChecks()
    checks.prefetch([(key, program) for ...])      # the batch at once, ``CHECK_WORKERS`` at a time
    report = checks.report(key, program)           # from the cache, else one run

A check program runs the candidate in the same interpreter as the checking code (one process
start per check, ~0.1 s), so the program is written to make the candidate's interference fail
rather than pass:

- the program's report line carries a nonce drawn per run and fed on stdin: read before any
  candidate code runs, stdin then pointed at /dev/null, so a completion cannot write it in
  advance, and only the last line bearing it counts;
- the candidate is exec'd from a string in a namespace of its own, after the program has bound
  what it reports with (``os.write``, ``os._exit``, ``repr``, …) as default arguments, so
  replacing ``print``, builtins or module attributes does not reach the report;
- the program ends with ``os._exit`` right after writing its line: nothing the candidate left
  behind (an atexit hook, a thread, a buffered print) runs after it;
- ``sys.exit`` from the candidate is an exception like any other (a failed check); ``os._exit``,
  a crash, a timeout or a killed sandbox leave no report line, which reads as failed.

In-process code can still dig a secret out of its own interpreter (frames, ``gc``), so a check
never relies on the nonce alone: the code task keeps the expected values outside the sandbox
altogether (the program reports what the function returned; ``conspo.tasks.code`` compares).
"""

from __future__ import annotations

import re
import secrets
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from conspo.sandbox import Limits, Snippet, run_many, unsafe_local_opt_in
from conspo.sandbox.base import KIB, MIB

# One check: a small function and its tests, or a HumanEval problem's asserts. Tight, so a
# hostile completion costs the step little.
CHECK_LIMITS = Limits(
    wall_seconds=5.0,
    cpu_seconds=5,
    address_space_bytes=256 * MIB,
    processes=16,
    file_size_bytes=1 * MIB,
    open_files=32,
    output_bytes=64 * KIB,
    tmpfs_bytes=16 * MIB,
)
CHECK_WORKERS = 4  # checks running at once (sandboxes of a batch)
CACHE_SIZE = 4096  # reports remembered: a few steps of rollouts
MARKER = "@@conspo-check"

FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_FENCES = {"python", "py", "python3"}


def extract_code(completion: str, function: str) -> str | None:
    """The code of a completion: its last ```python fenced block, else its last fenced block,
    else the text from its last line that starts with ``def <function>(`` to the end. None when
    there is none of these: a bare function body is not code to run."""
    blocks = FENCE.findall(completion)
    python = [code for language, code in blocks if language.lower() in PYTHON_FENCES]
    if python or blocks:
        return (python or [code for _, code in blocks])[-1]
    starts = [m.start() for m in re.finditer(rf"^def {re.escape(function)}\(", completion, re.M)]
    return completion[starts[-1] :] if starts else None


# The frame every check program shares. ``_conspo_check`` (the program's own, defined above
# this text) runs the candidate and returns the report, a string. What the frame itself calls is
# bound as default arguments when it is defined, before any candidate code runs. ``{marker}`` is
# filled in when a program is made; the nonce arrives on stdin when it runs.
_REPORT = """

import os as _conspo_os
import sys as _conspo_sys


def _conspo_main(check=_conspo_check, write=_conspo_os.write, exit=_conspo_os._exit,
                 stdin=_conspo_sys.stdin, dup2=_conspo_os.dup2, open_fd=_conspo_os.open,
                 devnull=_conspo_os.devnull, read_only=_conspo_os.O_RDONLY,
                 isinstance=isinstance, BaseException=BaseException):
    nonce = stdin.readline().strip()
    dup2(open_fd(devnull, read_only), 0)  # the nonce is not there to be read again
    try:
        report = check()
    except BaseException:
        report = None
    if isinstance(report, str):
        write(1, ("\\n{marker} " + nonce + " " + report + "\\n").encode())
    exit(0)


_conspo_main()
"""


def check_program(check_source: str) -> str:
    """A whole check program: ``check_source`` defines ``_conspo_check() -> str`` (and what it
    reads), which runs the candidate and returns the report; the frame around it reads the
    nonce, writes the report line and exits."""
    return check_source + _REPORT.format(marker=MARKER)


def report_line(stdout: str, nonce: str) -> str | None:
    """What the last line bearing this run's nonce reports, or None when there is none."""
    prefix = f"{MARKER} {nonce} "
    found = [line[len(prefix) :] for line in stdout.splitlines() if line.startswith(prefix)]
    return found[-1] if found else None


class SandboxChecks:
    """Check programs run in the sandbox, a batch at a time, their reports remembered by key
    (least recently used first out). ``runs`` counts the programs it has run."""

    def __init__(
        self,
        limits: Limits = CHECK_LIMITS,
        workers: int = CHECK_WORKERS,
        size: int = CACHE_SIZE,
    ) -> None:
        self.limits = limits
        self.workers = workers
        self.size = size
        self.runs = 0
        self._reports: OrderedDict[Hashable, str | None] = OrderedDict()

    def prefetch(self, programs: Sequence[tuple[Hashable, str | None]]) -> None:
        """Run every program whose key is not remembered yet, ``workers`` at once. A program
        of None (no code to run) reports None without a run."""
        pending: dict[Hashable, str] = {}
        for key, program in programs:
            if key in self._reports or key in pending:
                continue
            if program is None:
                self._remember(key, None)
            else:
                pending[key] = program
        if not pending:
            return
        nonces = [secrets.token_hex(16) for _ in pending]
        snippets = [
            Snippet(program, stdin=nonce + "\n")
            for program, nonce in zip(pending.values(), nonces, strict=True)
        ]
        results = run_many(
            snippets,
            self.limits,
            max_workers=min(self.workers, len(snippets)),
            unsafe_local=unsafe_local_opt_in(),
        )
        self.runs += len(snippets)
        for key, nonce, result in zip(pending, nonces, results, strict=True):
            self._remember(key, report_line(result.stdout, nonce))

    def report(self, key: Hashable, program: str | None) -> str | None:
        """The program's report: remembered, else run now."""
        if key not in self._reports:
            self.prefetch([(key, program)])
        self._reports.move_to_end(key)
        return self._reports[key]

    def _remember(self, key: Hashable, report: str | None) -> None:
        self._reports[key] = report
        self._reports.move_to_end(key)
        while len(self._reports) > self.size:
            self._reports.popitem(last=False)
