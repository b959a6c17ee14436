"""Tool-use traces for a cold start: SFT targets that show the model calling a tool, reading the
interpreter's real output, then answering (ReTool, arXiv:2504.11536, whose RL starts from such
an SFT so that the policy already writes calls in the rollout's format).

    traces = tool_traces(task, [(example, target), ...], box, "python", rng, batch_size)
    # [(example, "<code>\\nprint(1663 * 5242)\\n</code>\\n<interpreter>\\n8717446\\n"
    #             "</interpreter>\\n8717446"), ...]

A trace is the call with the task's ``tool_solution`` (an expression whose value is the answer;
``CALL_SOURCES``: python prints it, the calculator reads it), the block a rollout appends after
that call (``observation_text`` of the tool's real result: the python tool runs the code in the
sandbox, the calls of a step as one batch), then the target the plain SFT would teach, so the
verifier, which reads the text after the last observation, accepts it. The SFT and DPO losses
leave the observation out (``conspo.training.sft.answer_rows``): the model never wrote it.

A problem without a solution is skipped, and so is one whose call did not run cleanly (an error,
a timeout): a trace must not teach that a failed call is followed by the right answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from conspo.registry import get_tool
from conspo.tasks import Example, Task
from conspo.tools import ToolBox, observation_text
from conspo.tools.base import close_tag, open_tag

# The tools a trace can call, and what it writes between a tool's tags to compute an expression:
# python's code on lines of its own, as a model writes a block (the rollout reads the code
# between the newlines).
TraceTool = Literal["python", "calculator"]
CALL_SOURCES: dict[str, str] = {"python": "\nprint({expression})\n", "calculator": "{expression}"}
# Draws of the training split a step may take to find its problems with solutions.
MAX_DRAWS = 20


def call_text(tool: str, expression: str) -> str:
    """The model's text of a call of ``tool`` computing ``expression``."""
    tag = get_tool(tool).tag
    return open_tag(tag) + CALL_SOURCES[tool].format(expression=expression) + close_tag(tag)


def tool_traces(
    task: Task,
    draw: Callable[[random.Random, int], list[tuple[Example, str]]],
    box: ToolBox,
    tool: str,
    rng: random.Random,
    n: int,
) -> list[tuple[Example, str]]:
    """(example, trace) of ``n`` training problems with a tool solution: ``draw(rng, k)`` gives
    k (example, target) pairs of the training split, drawn again (up to ``MAX_DRAWS`` times)
    while fewer than ``n`` have a solution; their calls then run as one batch, and a problem
    whose call failed is left out (so a step may train on fewer than ``n``)."""
    solved: list[tuple[Example, str, str]] = []
    for _ in range(MAX_DRAWS):
        for example, target in draw(rng, n - len(solved)):
            expression = task.tool_solution(example)  # type: ignore[attr-defined]
            if expression is not None:
                solved.append((example, target, call_text(tool, expression)))
        if len(solved) == n:
            break
    if not solved:
        raise ValueError(
            f"none of {MAX_DRAWS * n} training problems of task {task.name!r} has a tool"
            " solution (its tool_solution returned None for each): there is nothing to trace"
        )
    calls = [box.call_in(call) for _, _, call in solved]
    assert all(c is not None for c in calls), "a trace's call is not one the rollout would read"
    results = box.run([c for c in calls if c is not None])
    return [
        (example, call + observation_text(result) + target)
        for (example, target, call), result in zip(solved, results, strict=True)
        if result.status == "ok"
    ]
