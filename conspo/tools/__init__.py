"""Tools a rollout may call between its turns (ReTool-style tool-integrated RL).

    box = make_toolbox(cfg.tools)                  # the run's tools, with its limits
    box.closing_tags                               # ["</code>"]: where generation pauses
    box.call_in(segment)                           # the ToolCall a segment ends with, or None
    box.run([call, ...])                           # one ToolResult per call, run at once

Each tool is one module of this package: a parameter model and a class registered with
``@register_tool(name, params=..., tag=..., sandboxed=..., description=...)`` (see
calculator.py). Every module here is imported on the first registry lookup, so a new tool
needs no edit anywhere else. ``conspo.tools.base`` holds the call and observation format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from conspo.registry import get_tool
from conspo.tools.base import (
    OBSERVATION_CLOSE,
    OBSERVATION_OPEN,
    Segment,
    Tool,
    ToolCall,
    ToolLimits,
    ToolResult,
    call_in,
    close_tag,
    final_answer,
    observation_spans,
    observation_text,
    split_turns,
)

if TYPE_CHECKING:
    from conspo.config import ToolsConfig

__all__ = [
    "OBSERVATION_CLOSE",
    "OBSERVATION_OPEN",
    "Segment",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolLimits",
    "ToolResult",
    "final_answer",
    "make_toolbox",
    "observation_spans",
    "observation_text",
    "split_turns",
]


class ToolBox:
    """The tools one run may call, by tag: finds the call a segment of model text ends with and
    runs a turn's calls, each batch of a tool's calls at once."""

    def __init__(
        self, tools: dict[str, Tool], tags: dict[str, str], max_turns: int, parallel: int = 4
    ) -> None:
        self.tools = tools  # name → tool
        self.tags = tags  # name → tag
        self.max_turns = max_turns
        self.parallel = parallel  # calls that may run at once

    @property
    def closing_tags(self) -> list[str]:
        return [close_tag(tag) for tag in self.tags.values()]

    def call_in(self, segment: str) -> ToolCall | None:
        """The call ``segment`` (model text) ends with: the tool whose closing tag ends it, and
        the text since that tag was opened. None when it ends with no complete call."""
        stripped = segment.rstrip()
        for name, tag in self.tags.items():
            if stripped.endswith(close_tag(tag)):
                source = call_in(stripped, tag)
                return None if source is None else ToolCall(name, source)
        return None

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order: each tool runs its share of the calls as one batch."""
        results: list[ToolResult | None] = [None] * len(calls)
        for name, tool in self.tools.items():
            mine = [i for i, c in enumerate(calls) if c.tool == name]
            for i, result in zip(mine, tool.run([calls[i] for i in mine]), strict=True):
                results[i] = result
        assert all(r is not None for r in results), "a call named no tool of this box"
        return [r for r in results if r is not None]

    def run_one(self, call: ToolCall) -> ToolResult:
        """One call's result (what a pool runs for a rollout that made it)."""
        (result,) = self.tools[call.tool].run([call])
        return result


def make_toolbox(cfg: ToolsConfig, *, unsafe_local: bool = False) -> ToolBox:
    """The run's tools (``cfg.names``) built with their parameters (``cfg.params``) and its
    limits. ``unsafe_local``: run code tools
    without the sandbox, for a library caller on a machine without one that trusts the model
    (never a run of the platform: conspo.sandbox refuses, and so does the worker)."""
    limits = ToolLimits(
        timeout_s=cfg.timeout_s,
        memory_mb=cfg.memory_mb,
        max_output_chars=cfg.max_output_chars,
        parallel=cfg.parallel,
        unsafe_local=unsafe_local,
    )
    tools: dict[str, Tool] = {}
    tags: dict[str, str] = {}
    for name in cfg.names:
        registered = get_tool(name)
        tools[name] = registered.cls(cfg.tool_params(name), limits)
        tags[name] = registered.tag
    return ToolBox(tools, tags, cfg.max_turns, cfg.parallel)
