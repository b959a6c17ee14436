"""What every task provides, plus the pieces tasks share (held-out hashing, safe arithmetic)."""

from __future__ import annotations

import ast
import hashlib
import operator
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from conspo import stopping

# Held-out membership is a hash of the problem text under a fixed salt: the same problems are
# held out for every seed, so no run (and no SFT warm start) ever trains on an evaluation problem
# and runs with different seeds are scored on one axis.
HELD_OUT_SALT = "conspo-held-out-v1"
HELD_OUT_FRACTION = 0.1
EVAL_SAMPLING_SEED = 20_260_512
# Draws in a row that found no new problem for a split before it is taken as exhausted: at the
# held-out fraction a split still far from exhausted finds one every ~10 draws, so 2,000 misses
# in a row happen by chance about once in e^-200 while problems remain common; a split whose
# last problems are rare stops short of them (its count is then a lower bound).
MAX_FRUITLESS_DRAWS = 2_000
# Draws in a row that find no new problem before a step's batch keeps a repeat (a task with
# fewer problems than a step asks for); each is one ``train_prompts`` call, on every step.
MAX_REDRAWS = 100


P = TypeVar("P")  # a drawn problem: an Example, or what a task makes one from


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


class Verifier(Protocol):
    """What scoring completions needs: a task, or a benchmark's checker (conspo.evaluation)."""

    name: str

    def verify(self, completion: str, example: Example) -> float:
        """1.0 when the completion (decoded text after the prompt, EOS removed) is correct."""
        ...

    # Optional: ``prefetch(completions, examples) -> None``, told the whole batch before its
    # completions are verified one by one (``prefetch`` below: ``score_rollouts`` and evaluation
    # call it first), so that a verifier with a cost per call can pay it once for the batch:
    # the code task runs the batch's sandboxes in parallel and remembers their results, which
    # its ``verify`` and ``process_reward`` then read. It must not change what they return.


class Task(Verifier, Protocol):
    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        """n training problems (repeats allowed), never from the held-out split."""
        ...

    def eval_examples(self, n: int) -> list[Example]:
        """Up to n distinct held-out problems; the same list on every call."""
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
    #
    # Optional: ``runs_code = True`` (a class attribute), when verifying runs model-written code:
    # a run of the task then needs the sandbox (``RunConfig.code_execution``).


def distinct_prompts(task: Task, rng: random.Random, n: int) -> list[Example]:
    """``task.train_prompts(rng, n)`` with a repeat drawn again (one problem at a time, from the
    same ``rng``) until the n prompts differ: a step whose batch holds one problem twice trains
    it as two groups, and its per-prompt statistics merge them. A task with too few problems
    keeps its repeats after ``MAX_REDRAWS`` draws in a row found nothing new. A batch with no
    repeat is exactly what ``train_prompts`` drew."""
    drawn = task.train_prompts(rng, n)
    seen: set[str] = set()
    kept: list[Example] = []
    repeats: list[Example] = []
    for example in drawn:
        (repeats if example.prompt in seen else kept).append(example)
        seen.add(example.prompt)
    misses = 0
    while repeats and misses < MAX_REDRAWS:
        (candidate,) = task.train_prompts(rng, 1)
        if candidate.prompt in seen:
            misses += 1
            continue
        misses = 0
        seen.add(candidate.prompt)
        kept.append(candidate)
        repeats.pop()
    return kept + repeats


def prefetch(verifier: Verifier, completions: Sequence[str], examples: Sequence[Example]) -> None:
    """Hand the batch to the verifier's optional ``prefetch`` hook, if it has one."""
    hook = getattr(verifier, "prefetch", None)
    if hook is not None:
        hook(completions, examples)


def is_held_out(key: str, fraction: float = HELD_OUT_FRACTION) -> bool:
    digest = hashlib.sha1(f"{HELD_OUT_SALT}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def sample_split(
    sample: Callable[[random.Random], Example], rng: random.Random, n: int, held_out: bool
) -> list[Example]:
    """Rejection-sample n problems from one side of the split (train: repeats allowed)."""
    return sample_split_by(sample, lambda ex: ex.prompt, rng, n, held_out)


def sample_split_by(
    sample: Callable[[random.Random], P],
    key: Callable[[P], str],
    rng: random.Random,
    n: int,
    held_out: bool,
) -> list[P]:
    """``sample_split`` of anything a task draws, its side the hash of ``key(problem)``: a task
    whose prompt is made from a smaller description draws that, hashes it, and makes only the
    problems it keeps (``conspo.tasks.code``).

    The held-out side keeps distinct problems, so a task with fewer than n of them has fewer to
    give: the search stops after ``MAX_FRUITLESS_DRAWS`` draws in a row that found nothing new
    (the side's problems exhausted, or too rare to find) and returns what it has. A run scores
    the problems found and says how many of those asked (its ``started`` event)."""
    out: list[P] = []
    seen: set[str] = set()
    fruitless = 0
    while len(out) < n and fruitless < MAX_FRUITLESS_DRAWS:
        stopping.check()  # a slow generator drawing many problems: a cancel ends it
        problem = sample(rng)
        text = key(problem)
        if is_held_out(text) != held_out or (held_out and text in seen):
            fruitless += 1
            continue
        fruitless = 0
        seen.add(text)
        out.append(problem)
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
