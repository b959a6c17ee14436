"""The ``calculator`` tool: ``<calc>expression</calc>`` evaluated in this process by walking
its syntax tree (numbers, + - * / // % **, parentheses), nothing else: no names, calls or
attributes, so it needs no sandbox. The cheapest tool there is, for tasks where a model only
needs arithmetic it cannot do in its head.
"""

from __future__ import annotations

import ast
import operator
import time
from collections.abc import Callable
from typing import Any, cast

from pydantic import Field

from conspo.registry import register_tool
from conspo.tools.base import ToolCall, ToolLimits, ToolParams, ToolResult, cut_output

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorParams(ToolParams):
    max_digits: int = Field(
        60,
        ge=1,
        le=1000,
        description="Largest result, in digits; a bigger one (9**9**9) is an error, not a hang.",
    )
    max_chars: int = Field(
        500, ge=1, le=10_000, description="Longest expression the calculator reads."
    )


@register_tool(
    "calculator",
    params=CalculatorParams,
    tag="calc",
    sandboxed=False,
    description="Arithmetic: the model writes <calc>expression</calc> (numbers, + - * / // %"
    " ** and parentheses) and reads the value back as <interpreter>…</interpreter>. Runs no"
    " code, so needs no sandbox.",
)
class CalculatorTool:
    name = "calculator"

    def __init__(self, params: CalculatorParams, limits: ToolLimits) -> None:
        self.params = params
        self.limits = limits

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        return [self._one(call.source) for call in calls]

    def _one(self, source: str) -> ToolResult:
        started = time.perf_counter()
        try:
            value = self.evaluate(source)
            text, status = _format(value), "ok"
        except (ValueError, ZeroDivisionError, OverflowError, SyntaxError, RecursionError) as exc:
            text, status = f"{type(exc).__name__}: {exc}", "error"
        shown = cut_output(text, self.limits.max_output_chars)
        return ToolResult(shown, status, time.perf_counter() - started)  # type: ignore[arg-type]

    def evaluate(self, source: str) -> int | float:
        source = source.strip()
        if len(source) > self.params.max_chars:
            raise ValueError(f"expression longer than {self.params.max_chars} characters")
        tree = ast.parse(source, mode="eval")
        return self._walk(tree.body)

    def _walk(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(cast(int | float, node.value))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self._bounded(_UNARY[type(node.op)](self._walk(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._walk(node.left), self._walk(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            return self._bounded(_BINARY[type(node.op)](left, right))
        raise ValueError(f"not arithmetic: {ast.unparse(node)[:60]}")

    def _check_power(self, base: int | float, exponent: int | float) -> None:
        """Refuse a power whose result would exceed the digit cap before computing it."""
        import math

        if isinstance(exponent, int) and abs(exponent) > 10_000:
            raise ValueError("exponent too large")
        magnitude = abs(base)
        if magnitude > 1 and exponent > 0:
            digits = exponent * math.log10(magnitude)
            if digits > self.params.max_digits:
                raise ValueError(f"result has more than {self.params.max_digits} digits")

    def _bounded(self, value: int | float) -> int | float:
        if isinstance(value, complex):
            raise ValueError("complex result")
        if isinstance(value, int) and abs(value) >= 10**self.params.max_digits:
            raise ValueError(f"result has more than {self.params.max_digits} digits")
        return value


def _format(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
