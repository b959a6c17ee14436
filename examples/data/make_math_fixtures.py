"""Write the math fixtures under examples/data/math/ (deterministic: the same files every run).

    PYTHONPATH=. python examples/data/make_math_fixtures.py

Small synthetic stand-ins for the real datasets' formats, written here rather than downloaded:

* gsm8k.jsonl, gsm8k.parquet: GSM8K-style word problems, {question, answer: "...#### n"};
* math.parquet, math_disk/ (a ``save_to_disk`` DatasetDict, splits train and test): MATH-style
  {problem, solution ending in \\boxed{n}, answer};
* benchmark.jsonl: an AIME / MATH500-style benchmark, {problem, answer};
* easy.jsonl: one-step arithmetic word problems with small answers, {question, answer}: what the
  built-in tiny-chat-math is warm-started on (conspo/model_catalog.py).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "math"
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


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    from datasets import Dataset, DatasetDict

    rng = random.Random(20_261_130)
    OUT.mkdir(parents=True, exist_ok=True)
    gsm8k = [gsm8k_row(rng) for _ in range(200)]
    write_jsonl(OUT / "gsm8k.jsonl", gsm8k)
    Dataset.from_list(gsm8k).to_parquet(OUT / "gsm8k.parquet")
    math = [math_row(rng, i) for i in range(150)]
    Dataset.from_list(math).to_parquet(OUT / "math.parquet")
    shutil.rmtree(OUT / "math_disk", ignore_errors=True)
    splits = {"train": Dataset.from_list(math[:120]), "test": Dataset.from_list(math[120:])}
    DatasetDict(splits).save_to_disk(OUT / "math_disk")
    write_jsonl(OUT / "benchmark.jsonl", [benchmark_row(rng) for _ in range(40)])
    write_jsonl(OUT / "easy.jsonl", [easy_row(rng) for _ in range(400)])


if __name__ == "__main__":
    main()
