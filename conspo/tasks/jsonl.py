"""Your own problems: a JSON-lines file of {"prompt": ..., "answer": ...}, verified as math answers.

The completion's answer is its last \\boxed{...} or, failing that, its last number. It matches
the reference when both are equal numbers (fractions, decimals, integers) or when `math-verify`
finds them symbolically equivalent (1/2 vs 0.5 vs \\frac{1}{2}, x^2+2x vs 2x+x^2).
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
from fractions import Fraction
from typing import ClassVar

from pydantic import Field

from conspo.access import DataFiles
from conspo.registry import register_task
from conspo.tasks.base import HELD_OUT_FRACTION, Example, TaskParams, is_held_out

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


class JsonlParams(TaskParams):
    path: str = Field(
        min_length=1,
        description="The training file: a path inside the data roots (a worker reads only from"
        " them; relative paths are looked up in each root).",
    )
    eval_path: str | None = Field(
        None,
        description="The held-out file, likewise (default: a hashed split of `path`).",
    )

    data_paths: ClassVar[tuple[str, ...]] = ("path", "eval_path")


@register_task(
    "jsonl",
    params=JsonlParams,
    description="Your own file of {prompt, answer} lines, verified as math answers.",
)
class JsonlTask:
    name = "jsonl"

    def __init__(self, params: JsonlParams, files: DataFiles) -> None:
        rows = load_jsonl(files, params.path)
        if params.eval_path:
            self.train, self.held_out = rows, load_jsonl(files, params.eval_path)
        else:
            self.train, self.held_out = split_rows(rows)
        if not self.train:
            raise ValueError(f"{params.path}: no training rows")

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        return [rng.choice(self.train) for _ in range(n)]

    def eval_examples(self, n: int) -> list[Example]:
        return self.held_out[:n]

    def verify(self, completion: str, example: Example) -> float:
        predicted = extract_answer(completion)
        return float(predicted is not None and answers_match(example.answer, predicted))


def load_jsonl(files: DataFiles, name: str) -> list[Example]:
    """The {prompt, answer} rows of the file ``name``, read through ``files`` (roots, cap)."""
    rows = []
    for lineno, line in enumerate(files.read_text(name).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            rows.append(Example(str(obj["prompt"]), str(obj["answer"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{name}:{lineno}: expected {{prompt, answer}} ({exc})") from None
    return rows


def split_rows(rows: list[Example]) -> tuple[list[Example], list[Example]]:
    """Hash-based held-out split; a file too small to get one by hash gives up its last row."""
    held = [r for r in rows if is_held_out(r.prompt, HELD_OUT_FRACTION)]
    train = [r for r in rows if not is_held_out(r.prompt, HELD_OUT_FRACTION)]
    if not held and len(train) > 1:
        held = [train.pop()]
    return train, held


def extract_answer(text: str) -> str | None:
    """The content of the last \\boxed{...} (nested braces allowed), else the last number."""
    start = text.rfind("\\boxed{")
    if start >= 0:
        depth, i = 1, start + len("\\boxed{")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(gold: str, predicted: str) -> bool:
    a, b = _as_number(gold), _as_number(predicted)
    if a is not None and b is not None:
        return a == b
    return _math_verify(gold, predicted)


def _math_verify(gold: str, predicted: str) -> bool:
    from math_verify import parse, verify

    # math-verify's timeouts use SIGALRM, which only works on the main thread (a worker may
    # run us elsewhere); there we run without its timeout and keep its warning quiet.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        g = parse(f"${gold}$", parsing_timeout=timeout)
        p = parse(f"${predicted}$", parsing_timeout=timeout)
        return bool(g and p and verify(g, p, timeout_seconds=timeout))
    except Exception:  # a malformed answer is a wrong answer, never a crash
        return False
