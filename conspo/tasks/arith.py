"""Procedural arithmetic: "12+7=" → "19". Difficulty knobs: digits, operators, num_operands."""

from __future__ import annotations

import random

from pydantic import Field, field_validator

from conspo.registry import register_task
from conspo.tasks.base import Example, ProceduralTask, TaskParams, safe_eval

OPERATORS = "+-*"


class ArithParams(TaskParams):
    digits: int = Field(1, ge=1, le=6, description="Digits per operand.")
    operators: str = Field(
        "+-", min_length=1, description=f"Operators to draw from (any of {OPERATORS})."
    )
    num_operands: int = Field(2, ge=2, le=5, description="Operands per problem.")

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
        return Example(prompt=expr + "=", answer=str(value), data={"value": value})

    def verify(self, completion: str, example: Example) -> float:
        """Exact integer match; anything but an optional sign and digits scores 0."""
        text = completion.strip()
        body = text[1:] if text.startswith("-") else text
        if not body.isdigit() or len(body) > 12:
            return 0.0
        return float(int(text) == example.data["value"])
