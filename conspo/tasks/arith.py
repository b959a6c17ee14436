"""Procedural arithmetic: "12+7=" → "19". Difficulty knobs: digits, operators, num_operands."""

from __future__ import annotations

import random

from conspo.config import TaskConfig
from conspo.tasks.base import Example, ProceduralTask, safe_eval


class ArithTask(ProceduralTask):
    name = "arith"

    def __init__(self, cfg: TaskConfig) -> None:
        self.digits = cfg.digits
        self.operators = cfg.operators
        self.num_operands = cfg.num_operands

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
