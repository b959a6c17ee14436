"""Code: write a small Python function, verified by running hidden tests in the sandbox.

    task: {name: code, params: {difficulty: 2, tests: 10, examples: 2}}

A problem is one of the templates of ``conspo.tasks.code_templates`` at the chosen level with
its constants drawn (a threshold, a base, a set of coins, …): the prompt gives the function's
signature, what it must do and a few calls with their results; the hidden tests are calls on
arguments drawn from the problem's own rng, their expected results computed by the reference.
The reference, in a ```python block, is the example's answer (the SFT target).

Verification. The completion's code (``extract_code``: its last ```python block, else its last
fenced block, else its last ``def <name>(`` to the end) is run in the sandbox by a check program
(``conspo.tasks.code_checks``) that calls it on every hidden test's arguments, each call in its
own try, and reports the ``repr`` of what each returned. The expected results never enter the
sandbox: the reports are compared here, after ``ast.literal_eval``, so a completion that forges
a report, overrides builtins or returns an object equal to everything gains nothing. The outcome
(``verify``) is 1.0 when every test passes; ``process_reward`` is the fraction that pass (the
``process`` reward's partial credit). A program that loops, forks, crashes or exits early
reports nothing and scores 0.

Splits. The held-out split hashes a problem's identity (its signature and description, which
name every constant), not its prompt: the split is the same whatever ``examples`` and ``tests``
are, and only the problems kept are made.

Batches. ``prefetch(completions, examples)`` (the optional Task hook that ``score_rollouts`` and
evaluation call first) runs the batch's programs ``CHECK_WORKERS`` at a time and remembers their
reports by (completion, prompt); ``verify`` and ``process_reward`` then read them.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from conspo.registry import register_task
from conspo.tasks.base import EVAL_SAMPLING_SEED, Example, TaskParams, sample_split_by
from conspo.tasks.code_checks import SandboxChecks, check_program, extract_code
from conspo.tasks.code_templates import TEMPLATES, Spec

MAX_RESULT_CHARS = 4096  # a result's repr longer than this counts as wrong (and stays small)
INSTRUCTION = "Answer with the complete function in a ```python code block."


class CodeParams(TaskParams):
    difficulty: int = Field(
        1,
        ge=1,
        le=max(TEMPLATES),
        description="Level of the problems: 1, one-line transformations of lists, strings and"
        " numbers; 2, loops with a condition or an accumulator; 3, small algorithms (dynamic"
        " programming, stacks, searches).",
    )
    tests: int = Field(
        10, ge=1, le=50, description="Hidden tests per problem (calls on random arguments)."
    )
    examples: int = Field(
        2, ge=0, le=5, description="Calls shown in the prompt with their results."
    )


@register_task(
    "code",
    params=CodeParams,
    description="Write a small Python function (list, string and number problems at three"
    " levels), verified by running hidden tests in the sandbox; partial credit: the share of"
    " tests passed.",
)
class CodeTask:
    name = "code"
    runs_code = True  # RunConfig.code_execution: a run of it needs the sandbox

    def __init__(self, params: CodeParams) -> None:
        self.templates = TEMPLATES[params.difficulty]
        self.tests = params.tests
        self.examples = params.examples
        self.checks = SandboxChecks()

    def draw(self, rng: random.Random) -> Spec:
        """A template of the level, its constants drawn from ``rng``."""
        return rng.choice(self.templates)(rng)

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        specs = sample_split_by(self.draw, identity, rng, n, held_out=False)
        return [self.problem(spec) for spec in specs]

    def eval_examples(self, n: int) -> list[Example]:
        rng = random.Random(EVAL_SAMPLING_SEED)
        specs = sample_split_by(self.draw, identity, rng, n, held_out=True)
        return [self.problem(spec) for spec in specs]

    def problem(self, spec: Spec) -> Example:
        return make_problem(spec, self.examples, self.tests)

    def verify(self, completion: str, example: Example) -> float:
        """1.0 when the completion's function passes every hidden test."""
        passed, total = self.passed(completion, example)
        return float(passed == total)

    def process_reward(self, completion: str, example: Example) -> float:
        """Φ ∈ [0, 1]: the share of the hidden tests passed (RLVP partial credit)."""
        passed, total = self.passed(completion, example)
        return passed / total

    def prefetch(self, completions: Sequence[str], examples: Sequence[Example]) -> None:
        """Run the batch's check programs together (``SandboxChecks.prefetch``)."""
        pairs = zip(completions, examples, strict=True)
        self.checks.prefetch([((text, ex.prompt), program(text, ex)) for text, ex in pairs])

    def passed(self, completion: str, example: Example) -> tuple[int, int]:
        """(hidden tests passed, hidden tests)."""
        report = self.checks.report((completion, example.prompt), program(completion, example))
        expected = example.data["expected"]
        results = parse_results(report, len(expected))
        passed = sum(same(got, want) for got, want in zip(results, expected, strict=True))
        return passed, len(expected)


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------


def identity(spec: Spec) -> str:
    """What the held-out split hashes: the problem, not how many calls its prompt shows."""
    return spec.identity


def make_problem(spec: Spec, examples: int, tests: int) -> Example:
    """The problem of ``spec``: the calls it shows and its hidden tests come from the problem's
    own rng, seeded by its identity, so one problem always reads and checks the same."""
    reference = compile_reference(spec)
    rng = random.Random(spec.identity)
    shown = [spec.inputs(rng) for _ in range(examples)]
    calls = distinct_calls(spec, rng, tests)
    lines = [
        "Write a Python function:",
        "",
        spec.signature,
        "",
        spec.doc,
    ]
    if shown:
        lines += ["", "For example:"]
        lines += [f"{call_text(spec.name, args)} returns {reference(*args)!r}" for args in shown]
    lines += ["", INSTRUCTION]
    data = {
        "function": spec.name,
        "arguments": [repr(args) for args in calls],
        "expected": [reference(*args) for args in calls],
    }
    answer = f"```python\n{spec.source()}```"
    return Example(prompt="\n".join(lines), answer=answer, data=data)


def compile_reference(spec: Spec, body: str | None = None) -> Any:
    """The function of ``spec`` (its reference, or ``body``): our own template code, not the
    model's, so it runs here."""
    space: dict[str, Any] = {}
    exec(compile(spec.source(body), f"<{spec.name}>", "exec"), space)
    return space[spec.name]


def distinct_calls(spec: Spec, rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    """n calls' arguments, distinct where the template's space allows it."""
    calls: list[tuple[Any, ...]] = []
    for _ in range(20 * n):
        args = spec.inputs(rng)
        if args not in calls:
            calls.append(args)
        if len(calls) == n:
            return calls
    return calls + [spec.inputs(rng) for _ in range(n - len(calls))]


def call_text(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(map(repr, args))})"


# --------------------------------------------------------------------------------------------
# Checking a completion
# --------------------------------------------------------------------------------------------

# The candidate's calls, inside the sandbox. Arguments are rebuilt for every call (a function that
# mutates its list spoils no other test); each result comes back as its repr, or None.
CHECK = """
_CANDIDATE = {candidate!r}


def _conspo_arguments():
    return [{arguments}]


def _conspo_check(candidate=_CANDIDATE, name={name!r}, arguments=_conspo_arguments,
                  total={total}, limit={limit}, repr=repr, len=len, range=range, exec=exec,
                  compile=compile, BaseException=BaseException):
    space = {{"__name__": "__candidate__"}}
    results = [None] * total
    try:
        exec(compile(candidate, "<candidate>", "exec"), space)
        function = space[name]
    except BaseException:
        return repr(results)
    for i in range(total):
        try:
            text = repr(function(*arguments()[i]))
            results[i] = text if len(text) <= limit else None
        except BaseException:
            pass
    return repr(results)
"""


def program(completion: str, example: Example) -> str | None:
    """The check program of a completion, or None when it holds no code."""
    name = example.data["function"]
    candidate = extract_code(completion, name)
    if candidate is None:
        return None
    arguments = example.data["arguments"]
    source = CHECK.format(
        candidate=candidate,
        name=name,
        arguments=", ".join(arguments),
        total=len(arguments),
        limit=MAX_RESULT_CHARS,
    )
    return check_program(source)


def parse_results(report: str | None, total: int) -> list[Any]:
    """Each test's result as a value (``_MISSING`` where the call failed or the report is not
    one), ``total`` of them."""
    try:
        texts = ast.literal_eval(report) if report is not None else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        texts = None
    if not isinstance(texts, list) or len(texts) != total:
        return [_MISSING] * total
    return [_value(text) for text in texts]


_MISSING = object()


def _value(text: object) -> Any:
    if not isinstance(text, str):
        return _MISSING
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return _MISSING


def same(got: Any, want: Any) -> bool:
    """A test passes when the result equals the expected value, as ``==`` says it (both are
    plain literals here, so nothing the candidate defined decides it)."""
    return got is not _MISSING and bool(got == want)
