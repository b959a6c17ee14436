"""Procedural arithmetic: "12+7=" → "19". Difficulty knobs: digits, operators, num_operands.

Its process signal Φ (the ``process`` reward, RLVP-style partial credit) is the share of the
problem's intermediate results the completion writes: "3*4+7=" has 12 then 19.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable

from pydantic import Field, field_validator

from conspo.registry import register_task
from conspo.tasks.base import Example, ProceduralTask, TaskParams, safe_eval

OPERATORS = "+-*"


class ArithParams(TaskParams):
    digits: int = Field(1, ge=1, le=6, description="Digits per operand.")
    operators: str = Field(
        "+-", min_length=1, description=f"Operators to draw from (any of {OPERATORS})."
    )
    num_operands: int = Field(2, ge=2, le=5, title="Operands", description="Operands per problem.")

    @field_validator("operators")
    @classmethod
    def _known_operators(cls, value: str) -> str:
        bad = set(value) - set(OPERATORS)
        if bad:
            raise ValueError(f"unsupported operator(s) {''.join(sorted(bad))!r}; use {OPERATORS}")
        return value


@register_task(
    "arith",
    params=ArithParams,
    description="Procedural arithmetic: a±b, a*b±c, … with configurable digits and operands.",
)
class ArithTask(ProceduralTask):
    name = "arith"

    def __init__(self, params: ArithParams) -> None:
        self.digits = params.digits
        self.operators = params.operators
        self.num_operands = params.num_operands

    def sample(self, rng: random.Random) -> Example:
        """One problem: operands uniform in [0, 10^digits), operators uniform, usual precedence."""
        expr = str(rng.randrange(10**self.digits))
        for _ in range(self.num_operands - 1):
            expr += rng.choice(self.operators) + str(rng.randrange(10**self.digits))
        value = safe_eval(expr)
        assert value is not None
        data = {"value": value, "steps": intermediate_results(expr)}
        return Example(prompt=expr + "=", answer=str(value), data=data)

    def verify(self, completion: str, example: Example) -> float:
        """Exact integer match; anything but an optional sign and digits scores 0."""
        text = completion.strip()
        body = text[1:] if text.startswith("-") else text
        if not body.isdigit() or len(body) > 12:
            return 0.0
        return float(int(text) == example.data["value"])

    def tool_solution(self, example: Example) -> str:
        """The problem's own expression ("12+7*3"): Python and the calculator read it with the
        task's precedence, so its value is the reference answer."""
        return example.prompt.removesuffix("=")

    def process_reward(self, completion: str, example: Example) -> float:
        """Φ ∈ [0, 1]: the intermediate results (``intermediate_results``) found among the
        integers the completion writes, over the larger of their count and the integers written,
        so writing many numbers earns nothing. A bare final answer earns 1/steps when right."""
        written = [int(n) for n in INTEGER.findall(completion)]
        steps = example.data["steps"]
        left = list(written)
        found = 0
        for value in steps:
            if value in left:
                left.remove(value)
                found += 1
        return found / max(len(steps), len(written))


INTEGER = re.compile(r"-?\d{1,12}")


def intermediate_results(expr: str) -> list[int]:
    """The value of each operation of ``expr`` in evaluation order (usual precedence), the
    answer last: "3*4+7" → [12, 19]."""
    results: list[int] = []

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp):
            value = OPS[type(node.op)](walk(node.left), walk(node.right))
            results.append(value)
            return value
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return node.value

    walk(ast.parse(expr, mode="eval").body)
    return results


OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}
