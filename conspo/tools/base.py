"""What every tool shares: the call a model writes, the result the environment hands back, the
text format of both inside a rollout, and the ``Tool`` a registration provides.

A rollout that may use tools is a sequence of segments: the model's own text, in which it opens
a call with a tool's tag (``<code>…</code>`` for ``python``, ``<calc>…</calc>`` for
``calculator``), and after each call the environment's observation, ``\\n<interpreter>\\n…\\n
</interpreter>\\n``, which the generation engine appends as tokens the model did not write
(``conspo.generation.tool_rollout``). Those tokens are masked out of every loss and score.

    tool = make_tool("python", limits)
    [result] = tool.run([ToolCall("python", "print(6 * 7)")])
    result.output            # "42\\n"
    observation_text(result) # "\\n<interpreter>\\n42\\n</interpreter>\\n"

Pure Python: no torch, no web. The sandbox (``conspo.sandbox``) is the one place code runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

OBSERVATION_OPEN = "<interpreter>"
OBSERVATION_CLOSE = "</interpreter>"
# Around the observation: the model's text ends right after its closing tag, and continues on a
# new line after the interpreter's block.
OBSERVATION_TEMPLATE = "\n" + OBSERVATION_OPEN + "\n{output}\n" + OBSERVATION_CLOSE + "\n"
# Said inside the block when a call produced nothing at all (an empty block reads as a bug).
NO_OUTPUT = "(no output)"
ELIDED = "\n…[{dropped} characters cut]…\n"

Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class ToolCall:
    tool: str  # the registered tool's name
    source: str  # what the model wrote between the tool's tags


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the model is shown (already cut to the tool's output cap)
    status: Status  # ok; error: the call failed (exception, non-zero exit); timeout: killed
    seconds: float = 0.0  # wall time the call took (sandbox start included)


class ToolParams(BaseModel):
    """Base of every tool's parameter model: unknown keys are errors, as in the whole config."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ToolLimits:
    """What one call may use: from the run's ``tools`` section (``conspo.config.ToolsConfig``)."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 1024  # the observation text kept per call (head and tail)
    parallel: int = 4  # calls running at once
    unsafe_local: bool = False  # run code without the sandbox (library callers only, never a run)


class Tool(Protocol):
    name: str

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """One result per call, in order; many calls may run at once."""
        ...


def tool_columns(budget: int) -> int:
    """Response columns a rollout that calls tools holds while it samples (its KV cache, for a
    response ``budget`` of max_new_tokens): the budget, plus room for the columns a row leaves
    empty while its call runs; when they fill, each row's tokens are realigned and the empty
    columns dropped (``conspo.generation.tool_rollout``). The memory estimate counts these."""
    return budget + max(64, budget // 2)


def open_tag(tag: str) -> str:
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    return f"</{tag}>"


def call_in(segment: str, tag: str) -> str | None:
    """The source of the call that ``segment`` (model text ending at a closing tag) makes with
    ``tag``: the text between the last opening tag and the closing one. None if the closing tag
    is not there or was never opened. A Markdown fence around the code is dropped."""
    end = segment.rfind(close_tag(tag))
    if end < 0:
        return None
    start = segment.rfind(open_tag(tag), 0, end)
    if start < 0:
        return None
    source = segment[start + len(open_tag(tag)) : end]
    fenced = re.fullmatch(r"\s*```[\w+-]*\n(.*?)\n?```\s*", source, flags=re.DOTALL)
    return fenced.group(1) if fenced else source.strip("\n")


def cut_output(text: str, cap: int) -> str:
    """``text`` within ``cap`` characters: its head and tail kept, the middle said to be cut
    (a traceback's last line, the one that names the error, survives)."""
    if len(text) <= cap:
        return text
    note_room = len(ELIDED.format(dropped=len(text)))
    keep = max(0, cap - note_room)
    head, tail = keep // 2, keep - keep // 2
    dropped = len(text) - head - tail
    return text[:head] + ELIDED.format(dropped=dropped) + (text[-tail:] if tail else "")


def observation_text(result: ToolResult) -> str:
    """The block appended to the rollout after a call: what the model reads next."""
    output = result.output.strip("\n") or NO_OUTPUT
    # The model must not be able to make the interpreter's block look closed early.
    output = output.replace(OBSERVATION_CLOSE, "<\\/interpreter>")
    return OBSERVATION_TEMPLATE.format(output=output)


@dataclass(frozen=True)
class Segment:
    kind: Literal["model", "observation"]
    text: str


_OBSERVATION = re.compile(
    re.escape(OBSERVATION_TEMPLATE.split("{output}")[0])
    + r"(.*?)"
    + re.escape(OBSERVATION_TEMPLATE.split("{output}")[1]),
    flags=re.DOTALL,
)


def split_turns(text: str) -> list[Segment]:
    """A rollout's text as alternating model and observation segments (the rollout viewer, the
    SFT and DPO masks read the same format). Text with no observation is one model segment."""
    segments: list[Segment] = []
    at = 0
    for match in _OBSERVATION.finditer(text):
        if match.start() > at:
            segments.append(Segment("model", text[at : match.start()]))
        segments.append(Segment("observation", match.group(0)))
        at = match.end()
    if at < len(text) or not segments:
        segments.append(Segment("model", text[at:]))
    return segments


def observation_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the observation blocks in ``text``: what a supervised
    loss over a tool-use trace masks (the model never wrote them)."""
    return [(m.start(), m.end()) for m in _OBSERVATION.finditer(text)]


def final_answer(text: str) -> str:
    """What a verifier reads of a rollout that used tools: the model's text after the last
    observation (the answer it gives once it has seen the interpreter), or all of it when no
    tool was called. Numbers the interpreter printed never count as the model's answer."""
    segments = split_turns(text)
    last = segments[-1]
    return last.text if last.kind == "model" else ""
