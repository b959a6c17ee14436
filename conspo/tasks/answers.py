"""Math answers: what a completion answers, what a dataset's reference answer is, and whether
they match; ``FileProblems``, what the jsonl and math tasks share. Used by both and by benchmarks.

The completion's answer is its last \\boxed{...} or, failing that, its last number. It matches
the reference when both are equal numbers (fractions, decimals, integers) or when `math-verify`
finds them symbolically equivalent (1/2 vs 0.5 vs \\frac{1}{2}, x^2+2x vs 2x+x^2).
"""

from __future__ import annotations

import logging
import random
import re
import threading
from fractions import Fraction

from conspo.tasks.base import Example

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
# What may follow a reply's final number: no operator or comparison (an expression still going,
# "(1 * 6) *" cut off mid-way, reads no answer), markdown's ** and __ set aside.
_STILL_GOING = re.compile(r"[+*/×÷=^<>]|-\s*$")
_EMPHASIS = re.compile(r"\*\*|__")
_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (nested braces allowed); None without one."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The content of the last \\boxed{...} (nested braces allowed), else the last number
    when it ends the reply: None when an operator follows it (the reply stopped inside an
    expression, its last number an operand, not an answer)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    plain = text.replace(",", "")
    numbers = list(_NUMBER.finditer(plain))
    if not numbers:
        return None
    last = numbers[-1]
    if _STILL_GOING.search(_EMPHASIS.sub("", plain[last.end() :])):
        return None
    return last.group()


def reference_answer(text: str) -> str:
    """A dataset's answer as the verifier compares it: GSM8K's "...#### 42" gives "42" (commas
    dropped), a worked solution its last \\boxed{}; anything else as it is, stripped."""
    gsm8k = _GSM8K_ANSWER.search(text)
    if gsm8k:
        return gsm8k.group(1).replace(",", "").strip()
    boxed = last_boxed(text)
    return text.strip() if boxed is None else boxed


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


def verify_math(completion: str, example: Example) -> float:
    """1.0 when the completion's answer (``extract_answer``) matches ``example.answer``."""
    predicted = extract_answer(completion)
    return float(predicted is not None and answers_match(example.answer, predicted))


class FileProblems:
    """What the file-backed tasks share: a training list and a held-out list of problems, both
    in memory, and the math check. A subclass's ``__init__`` fills ``train`` and ``held_out``."""

    train: list[Example]
    held_out: list[Example]

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        return [rng.choice(self.train) for _ in range(n)]

    def eval_examples(self, n: int) -> list[Example]:
        return self.held_out[:n]

    def verify(self, completion: str, example: Example) -> float:
        return verify_math(completion, example)
