"""What every task provides, plus the pieces tasks share (held-out hashing, safe arithmetic)."""

from __future__ import annotations

import ast
import hashlib
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

# Held-out membership is a hash of the problem text under a fixed salt: the same problems are
# held out for every seed, so no run (and no SFT warm start) ever trains on an evaluation problem
# and runs with different seeds are scored on one axis.
HELD_OUT_SALT = "conspo-held-out-v1"
HELD_OUT_FRACTION = 0.1
EVAL_SAMPLING_SEED = 20_260_512


@dataclass(frozen=True)
class Example:
    prompt: str  # text the policy continues, e.g. "12+7="
    answer: str  # a reference answer (SFT target), e.g. "19"
    data: dict[str, Any] = field(default_factory=dict, compare=False)  # what verify needs


class TaskParams(BaseModel):
    """Base of every task's parameter model: unknown keys are errors, as everywhere in a config."""

    model_config = ConfigDict(extra="forbid")
    # The fields that name files the task reads. Such a task is built as ``cls(params, files)``
    # and reads them through ``files`` (a ``conspo.access.DataFiles``: a worker's data roots and
    # size cap); the platform's API checks these fields at submit time.
    data_paths: ClassVar[tuple[str, ...]] = ()
    # Whether those may name a dataset directory (a save_to_disk dataset, parquet shards) as well
    # as a file: ``DataFiles.check_path`` rather than ``DataFiles.check``.
    dataset_dirs: ClassVar[bool] = False


class Task(Protocol):
    name: str

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        """n training problems (repeats allowed), never from the held-out split."""
        ...

    def eval_examples(self, n: int) -> list[Example]:
        """Up to n distinct held-out problems; the same list on every call."""
        ...

    def verify(self, completion: str, example: Example) -> float:
        """1.0 when the completion (decoded text after the prompt, EOS removed) is correct."""
        ...

    # Optional: ``process_reward(completion, example) -> float``, a process signal Φ ∈ [0, 1]
    # (partial credit) for the ``process`` reward (conspo.rewards.process.ProcessSignalTask).
    #
    # Optional: ``tool_solution(example) -> str | None``, an arithmetic expression in Python
    # syntax (numbers, + - * // and parentheses: what the python and calculator tools both read)
    # whose value is the example's reference answer, or None when the problem has none; the
    # ``sft`` kind's tool traces call a tool with it (conspo.training.traces). A task with the
    # hook may add the classmethod ``tool_solutions_missing(params) -> str | None``: why none of
    # its problems has one under ``params`` (a config check), None when some do.


def is_held_out(key: str, fraction: float = HELD_OUT_FRACTION) -> bool:
    digest = hashlib.sha1(f"{HELD_OUT_SALT}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def sample_split(
    sample: Callable[[random.Random], Example], rng: random.Random, n: int, held_out: bool
) -> list[Example]:
    """Rejection-sample n problems from one side of the split (train: repeats allowed)."""
    out: list[Example] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 2000 * n:
        tries += 1
        ex = sample(rng)
        if is_held_out(ex.prompt) != held_out or (held_out and ex.prompt in seen):
            continue
        seen.add(ex.prompt)
        out.append(ex)
    if not held_out and len(out) < n:
        raise ValueError("the training split of this task is empty; widen the task settings")
    return out


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


_WITH_FLOOR_DIVISION = {**_BINOPS, ast.FloorDiv: operator.floordiv}


def safe_eval(expr: str, *, max_chars: int = 64, floor_division: bool = False) -> int | None:
    """Evaluate an integer expression of + - * and parentheses (and // with
    ``floor_division``); None if it is anything else, longer than ``max_chars``, or divides by
    zero."""
    if len(expr) > max_chars:
        return None
    ops = _WITH_FLOOR_DIVISION if floor_division else _BINOPS
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError("unsupported expression")

    try:
        return walk(tree.body)
    except (ValueError, RecursionError, ZeroDivisionError):
        return None


class ProceduralTask:
    """A task whose problems are drawn by ``sample(rng)``; the held-out split is a fixed hashed
    subset of the problem space (``is_held_out``), so train and eval never share a problem."""

    name: str

    def sample(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        return sample_split(self.sample, rng, n, held_out=False)

    def eval_examples(self, n: int) -> list[Example]:
        return sample_split(self.sample, random.Random(EVAL_SAMPLING_SEED), n, held_out=True)
