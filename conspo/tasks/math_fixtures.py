"""Synthetic math problems in the formats of the usual datasets: the shipped fixtures
(examples/data/make_math_fixtures.py writes them) and the built-in tiny-chat models' corpus and
warm-start set (conspo/models/tiny_chat.py). Deterministic: each set has its own fixed seed.
"""

from __future__ import annotations

import random
from typing import Any

NAMES = ["Ava", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kim", "Leo"]
THINGS = ["apples", "books", "coins", "shells", "stamps", "marbles", "pens", "cards"]


def gsm8k_row(rng: random.Random) -> dict[str, Any]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    start, bought, price = rng.randint(5, 60), rng.randint(2, 30), rng.randint(2, 9)
    given = rng.randint(1, start)
    left = start + bought - given
    question = (
        f"{name} has {start} {thing}. {name} buys {bought} more and gives {given} away."
        f" Each of the {thing} is worth ${price}. How many dollars are {name}'s {thing} worth now?"
    )
    answer = (
        f"{name} has {start} + {bought} - {given} = <<{start}+{bought}-{given}={left}>>{left}"
        f" {thing}.\nThey are worth {left} * {price} = <<{left}*{price}={left * price}>>"
        f"{left * price} dollars.\n#### {left * price}"
    )
    return {"question": question, "answer": answer}


def math_row(rng: random.Random, i: int) -> dict[str, Any]:
    kind = i % 3
    if kind == 0:
        a, b = rng.randint(2, 12), rng.randint(1, 40)
        x = rng.randint(-10, 20)
        problem = f"Solve for $x$: ${a}x + {b} = {a * x + b}$."
        solution = f"Subtract {b} from both sides: ${a}x = {a * x}$, so $x = \\boxed{{{x}}}$."
        answer = str(x)
    elif kind == 1:
        p, q = rng.randint(1, 9), rng.randint(2, 12)
        problem = f"Simplify $\\frac{{{p * 2}}}{{{q * 2}}}$."
        solution = f"Divide top and bottom by 2: $\\boxed{{\\frac{{{p}}}{{{q}}}}}$."
        answer = f"\\frac{{{p}}}{{{q}}}"
    else:
        n = rng.randint(3, 30)
        problem = f"What is the sum of the integers from 1 to {n}?"
        solution = f"The sum is $\\frac{{{n}({n}+1)}}{{2}} = \\boxed{{{n * (n + 1) // 2}}}$."
        answer = str(n * (n + 1) // 2)
    return {"problem": problem, "solution": solution, "answer": answer}


def benchmark_row(rng: random.Random) -> dict[str, Any]:
    a, b, m = rng.randint(10, 99), rng.randint(10, 99), rng.choice([7, 9, 11, 13])
    return {
        "problem": f"Find the remainder when ${a} \\cdot {b}$ is divided by ${m}$.",
        "answer": str(a * b % m),
    }


def easy_row(rng: random.Random) -> dict[str, Any]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.5:
        question = f"{name} has {a} {thing} and gets {b} more. How many {thing} now?"
        return {"question": question, "answer": str(a + b)}
    a, b = max(a, b), min(a, b)
    question = f"{name} has {a} {thing} and gives away {b}. How many {thing} now?"
    return {"question": question, "answer": str(a - b)}


def fixture_sets() -> dict[str, list[dict[str, Any]]]:
    """Every fixture set by name, each drawn from its own seed (so each is stable alone)."""
    return {
        "gsm8k": [gsm8k_row(rng) for rng in [random.Random(1)] for _ in range(200)],
        "math": math_problems(),
        "benchmark": [benchmark_row(rng) for rng in [random.Random(3)] for _ in range(40)],
        "easy": easy_problems(),
    }


def easy_problems(n: int = 400) -> list[dict[str, Any]]:
    """One-step a+b / a-b word problems with answers 0..18 (tiny-chat-math's warm start)."""
    rng = random.Random(4)
    return [easy_row(rng) for _ in range(n)]


def math_problems(n: int = 150) -> list[dict[str, Any]]:
    """MATH-style problems, each problem text once (so no split shares a problem)."""
    rng = random.Random(2)
    by_problem: dict[str, dict[str, Any]] = {}
    i = 0
    while len(by_problem) < n:
        row = math_row(rng, i)
        by_problem.setdefault(row["problem"], row)
        i += 1
    return list(by_problem.values())
