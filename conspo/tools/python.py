"""The ``python`` tool: the model's ``<code>…</code>`` run as a script in the sandbox
(``conspo.sandbox``: its own network, PID and user namespaces, a read-only system, a capped
tmpfs, rlimits and a wall-clock timeout), its stdout and stderr shown back to it.

What the model sees is what a notebook cell would show: what the code printed, then on failure
the traceback's last lines (the host paths in it are the sandbox's own), or a line saying that the
call was stopped at its time limit. Calls of one turn run at once through the sandbox's bounded
pool (``ToolLimits.parallel``).
"""

from __future__ import annotations

from conspo.registry import register_tool
from conspo.sandbox import Limits, run_many
from conspo.sandbox.base import MIB, SandboxResult
from conspo.tools.base import ToolCall, ToolLimits, ToolParams, ToolResult, cut_output

# A traceback's frames in the sandbox's script are all the model needs of it.
TRACEBACK_LINES = 6


class PythonParams(ToolParams):
    """The python tool has no parameters of its own; its limits are the run's ``tools``."""


@register_tool(
    "python",
    params=PythonParams,
    tag="code",
    sandboxed=True,
    description="A Python interpreter: the model writes <code>…</code>, the code runs in the"
    " sandbox (no network, read-only system, time and memory limits) and what it prints comes"
    " back as <interpreter>…</interpreter>.",
)
class PythonTool:
    name = "python"

    def __init__(self, params: PythonParams, limits: ToolLimits) -> None:
        self.limits = limits
        self.sandbox = Limits(
            wall_seconds=limits.timeout_s,
            cpu_seconds=max(1, int(limits.timeout_s + 0.999)),
            address_space_bytes=limits.memory_mb * MIB,
            # The model is shown at most max_output_chars; a little more is read so the cut
            # keeps the traceback's tail.
            output_bytes=max(4096, 4 * limits.max_output_chars),
        )

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        # A call is written to a file to run; text no file can hold (a lone surrogate, which a
        # caller's string may carry though no tokenizer decodes to one) is that call's error,
        # never an exception that would end the whole rollout.
        why_not = [_unencodable(c.source) for c in calls]
        sources = [c.source for c, why in zip(calls, why_not, strict=True) if why is None]
        ran = iter(
            run_many(
                sources,
                self.sandbox,
                max_workers=self.limits.parallel,
                unsafe_local=self.limits.unsafe_local,
            )
        )
        return [self._shown(next(ran)) if why is None else self._refused(why) for why in why_not]

    def _refused(self, why: str) -> ToolResult:
        return ToolResult(cut_output(f"SyntaxError: {why}", self.limits.max_output_chars), "error")

    def _shown(self, result: SandboxResult) -> ToolResult:
        out = result.stdout
        if result.timed_out:
            text = out + f"\nTimeoutError: the code ran past {self.limits.timeout_s:g} s"
            return ToolResult(cut_output(text, self.limits.max_output_chars), "timeout",
                              result.wall_seconds)  # fmt: skip
        if result.exit_code != 0:
            err = result.stderr.strip().splitlines()[-TRACEBACK_LINES:]
            if not err:
                err = [_death(result.exit_code)]
            text = out + ("\n" if out and not out.endswith("\n") else "") + "\n".join(err)
            return ToolResult(cut_output(text, self.limits.max_output_chars), "error",
                              result.wall_seconds)  # fmt: skip
        return ToolResult(cut_output(out, self.limits.max_output_chars), "ok", result.wall_seconds)


def _unencodable(source: str) -> str | None:
    """Why ``source`` cannot be written as UTF-8 (the character and where), or None."""
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"the code holds {source[exc.start]!r} at character {exc.start}, not valid Unicode"
    return None


def _death(code: int) -> str:
    """A line for a process that died without a traceback (a signal, the memory limit)."""
    if code < 0:
        return f"the process was killed by signal {-code}"
    return f"the process exited with status {code}"
