"""Countdown: reach a target from given numbers. "3,5,7:22=" → "3*5+7".

Every number must be used exactly once, with + - * and parentheses. The target is the value of a
random expression over the numbers, so each problem has a known short solution (the SFT target).
"""

from __future__ import annotations

import random
import re
from collections import Counter

from pydantic import Field

from conspo.registry import register_task
from conspo.tasks.base import Example, ProceduralTask, TaskParams, safe_eval

_ALLOWED = re.compile(r"^[0-9+\-*() ]{1,64}$")


class CountdownParams(TaskParams):
    digits: int = Field(1, ge=1, le=6, description="Digits of each given number (1 to 10^d - 1).")
    num_operands: int = Field(2, ge=2, le=5, description="Numbers given, each used exactly once.")


@register_task(
    "countdown",
    params=CountdownParams,
    description="Countdown: reach a target from the given numbers, each used once, with + - *.",
)
class CountdownTask(ProceduralTask):
    name = "countdown"

    def __init__(self, params: CountdownParams) -> None:
        self.digits = params.digits
        self.num_operands = params.num_operands
        self.operators = "+-*"

    def sample(self, rng: random.Random) -> Example:
        """Numbers in [1, 10^digits); a random expression over them gives a target ≥ 0."""
        while True:
            numbers = [rng.randrange(1, 10**self.digits) for _ in range(self.num_operands)]
            order = rng.sample(numbers, len(numbers))
            expr = str(order[0])
            for x in order[1:]:
                expr += rng.choice(self.operators) + str(x)
            target = safe_eval(expr)
            if target is not None and target >= 0:
                break
        prompt = ",".join(map(str, numbers)) + f":{target}="
        return Example(prompt, expr, data={"numbers": numbers, "target": target})

    def verify(self, completion: str, example: Example) -> float:
        """1.0 iff the expression uses exactly the given numbers and evaluates to the target."""
        text = completion.strip()
        if not _ALLOWED.match(text):
            return 0.0
        used = [int(tok) for tok in re.findall(r"\d+", text)]
        if Counter(used) != Counter(example.data["numbers"]):
            return 0.0
        return float(safe_eval(text) == example.data["target"])
