"""The suite's waits are conditions with generous limits, never timings tuned to an idle machine.

CI may run while the box is loaded (issue 9, class 10: a 60 s wait for two training steps failed
on a busy machine). Every call of the suite's wait helpers must give a limit of at least
MIN_WAIT_S seconds; a wait that is met early costs nothing more.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MIN_WAIT_S = 60
# helper name -> (index of its limit among the positional arguments, its keyword name)
WAIT_HELPERS = {
    "wait_for": (1, "timeout"),
    "wait_until": (2, "timeout"),
    "finished": (2, "timeout"),
}


def short_waits(source: str) -> list[tuple[int, float]]:
    """(line, limit) of each wait-helper call in ``source`` whose literal limit is too short."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in WAIT_HELPERS:  # its default limit
            args = node.args.args[len(node.args.args) - len(node.args.defaults) :]
            for arg, default in zip(args, node.args.defaults, strict=True):
                if _too_short(default) and arg.arg == "timeout":
                    found.append((node.lineno, float(default.value)))
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        spec = WAIT_HELPERS.get(node.func.id)
        if spec is None:
            continue
        position, keyword = spec
        limit = next((k.value for k in node.keywords if k.arg == keyword), None)
        if limit is None and len(node.args) > position:
            limit = node.args[position]
        if limit is not None and _too_short(limit):
            found.append((node.lineno, float(limit.value)))
    return found


def _too_short(limit: ast.expr) -> bool:
    return (
        isinstance(limit, ast.Constant)
        and isinstance(limit.value, int | float)
        and limit.value < MIN_WAIT_S
    )


def test_every_wait_in_the_suite_is_generous() -> None:
    offenders = [
        f"{path.relative_to(TESTS)}:{line}: waits {limit:g} s"
        for path in sorted(TESTS.rglob("*.py"))
        for line, limit in short_waits(path.read_text())
    ]
    assert not offenders, f"waits under {MIN_WAIT_S} s:\n" + "\n".join(offenders)


def test_the_check_sees_a_short_wait() -> None:
    assert short_waits('wait_for(lambda: x, 15, "two steps")') == [(1, 15.0)]
    assert short_waits("wait_until(page, check, timeout=20)") == [(1, 20.0)]
    assert short_waits('wait_for(lambda: x, 300, "two steps")') == []
    assert short_waits("def wait_until(page, check, timeout=20.0): pass") == [(1, 20.0)]
