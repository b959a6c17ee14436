"""Code that runs: the code task's problems, their checks in the real sandbox, the batch hook,
and HumanEval as a benchmark.

Every check goes through bwrap, as a run's would. bwrap missing: the file skips, or fails when
CONSPO_REQUIRE_SERVICES=1 (CI), as tests/conspo/test_sandbox.py does. The only time bound is the
hostile programs': the sandbox's wall limit plus generous slack.
"""

from __future__ import annotations

import ast
import math
import os
import random
import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

import conspo.sandbox.runner as sandbox_runner
from conspo.access import DataFiles
from conspo.config import PromptConfig, RunConfig, TaskConfig
from conspo.evaluation import load_benchmarks
from conspo.rewards import RewardContext, build_rewards, score_rollouts
from conspo.sandbox import sandbox_available
from conspo.sink import MemorySink
from conspo.tasks import Example, make_task
from conspo.tasks.code import CodeTask, compile_reference, make_problem
from conspo.tasks.code_checks import CHECK_LIMITS, CHECK_WORKERS, MARKER, extract_code
from conspo.tasks.code_templates import TEMPLATES, Template
from conspo.tasks.humaneval import PROBLEM_COUNT, HumanEvalVerifier, humaneval_problems
from conspo.tasks.prompts import PromptRenderer, with_prompts
from conspo.training.trainer import train

REQUIRE = os.environ.get("CONSPO_REQUIRE_SERVICES") == "1"
PROBE = sandbox_available()
SLACK = 10.0  # seconds beyond the wall limit that a loaded machine may take


@pytest.fixture(autouse=True)
def _sandbox_here() -> None:
    if not PROBE:
        if REQUIRE:
            pytest.fail(f"CONSPO_REQUIRE_SERVICES=1 but the sandbox is unavailable: {PROBE.reason}")
        pytest.skip(f"sandbox unavailable: {PROBE.reason}")


def code_task(**params: object) -> CodeTask:
    task = make_task(TaskConfig(name="code", params=params))
    assert isinstance(task, CodeTask)
    return task


def fenced(code: str) -> str:
    return f"Here is the function.\n```python\n{code}```\n"


def all_templates() -> Iterator[tuple[int, Template]]:
    for level, templates in TEMPLATES.items():
        for template in templates:
            yield level, template


# ------------------------------------------------------------------------------------------------
# The problems
# ------------------------------------------------------------------------------------------------


def test_there_are_enough_templates_at_every_level() -> None:
    assert sum(len(t) for t in TEMPLATES.values()) >= 25
    assert all(len(t) >= 8 for t in TEMPLATES.values())


@pytest.mark.parametrize(
    "level, template", list(all_templates()), ids=[t.__name__ for _, t in all_templates()]
)
def test_every_templates_reference_passes_and_its_near_miss_fails(level, template) -> None:
    """Here, for 100 problems: the expected values are literals, and the template's plausible
    wrong body misses at least one hidden test. In the sandbox, for 3 problems: the reference
    passes every test and the wrong body scores 0 with partial credit below 1."""
    for seed in range(100):
        spec = template(random.Random(seed))
        example = make_problem(spec, 2, 10)
        arguments = [ast.literal_eval(a) for a in example.data["arguments"]]
        assert all(ast.literal_eval(repr(e)) == e for e in example.data["expected"])
        wrong = compile_reference(spec, spec.wrong)
        results = [wrong(*args) for args in arguments]
        assert results != example.data["expected"], (seed, spec.doc)
    task = code_task(difficulty=level)
    specs = [template(random.Random(seed)) for seed in (1000, 1001, 1002)]
    problems = [make_problem(spec, 2, 10) for spec in specs]
    wrongs = [fenced(spec.source(spec.wrong)) for spec in specs]
    task.prefetch([ex.answer for ex in problems] + wrongs, problems + problems)
    for example, wrong in zip(problems, wrongs, strict=True):
        assert task.verify(example.answer, example) == 1.0, example.prompt
        assert task.process_reward(example.answer, example) == 1.0
        assert task.verify(wrong, example) == 0.0, (example.prompt, wrong)
        assert task.process_reward(wrong, example) < 1.0


@pytest.mark.parametrize("difficulty", sorted(TEMPLATES))
def test_problems_are_deterministic_and_the_held_out_split_is_disjoint_and_large(difficulty):
    task = code_task(difficulty=difficulty)
    held_out = task.eval_examples(300)
    assert len({ex.prompt for ex in held_out}) == 300  # a few hundred distinct problems
    assert [ex.prompt for ex in task.eval_examples(300)] == [ex.prompt for ex in held_out]
    train_set = {ex.prompt for s in range(3) for ex in task.train_prompts(random.Random(s), 300)}
    assert not train_set & {ex.prompt for ex in held_out}
    a = task.train_prompts(random.Random(0), 20)
    assert a == task.train_prompts(random.Random(0), 20) != task.train_prompts(random.Random(1), 20)
    assert [ex.data for ex in a] == [ex.data for ex in task.train_prompts(random.Random(0), 20)]
    # The split is the problems', not the prompts': showing fewer calls holds out the same ones.
    terse = code_task(difficulty=difficulty, examples=0, tests=3).eval_examples(300)
    assert [ex.data["function"] for ex in terse] == [ex.data["function"] for ex in held_out]
    assert all(len(ex.data["expected"]) == 3 for ex in terse)


def test_the_prompt_shows_the_signature_and_calls_and_the_answer_is_the_reference() -> None:
    [example] = code_task(difficulty=2, examples=3).train_prompts(random.Random(4), 1)
    name = example.data["function"]
    assert f"def {name}(" in example.prompt and "```python" in example.prompt
    assert example.prompt.count(f"\n{name}(") == 3  # the calls shown, with their results
    assert example.answer.startswith(f"```python\ndef {name}(") and example.answer.endswith("```")


# ------------------------------------------------------------------------------------------------
# What the verifier reads and how it scores
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("```python\ndef f(x):\n    return 1\n```", "def f(x):\n    return 1\n"),
        (
            "```\ndef f(): pass\n```\n```py\ndef f(): return 2\n```\n```\nx\n```",
            "def f(): return 2\n",
        ),
        ("```text\nnot code\n```\nand then ```\ndef f(): return 3\n```", "def f(): return 3\n"),
        ("Sure:\ndef f(x):\n    return x\n", "def f(x):\n    return x\n"),
        ("def f(x):\n    return 0\ndef f(x):\n    return x", "def f(x):\n    return x"),
        ("    return x + 1\n", None),  # a bare body is not a function
        ("def g(x):\n    return x\n", None),  # nor is another function
        ("text only", None),
    ],
)
def test_the_code_read_out_of_a_completion(completion, expected) -> None:
    assert extract_code(completion, "f") == expected


def test_partial_credit_is_the_fraction_of_hidden_tests_passed() -> None:
    task = code_task(difficulty=1, tests=10)
    example = next(
        ex for ex in task.train_prompts(random.Random(0), 50)
        if len(set(ex.data["arguments"])) == 10
    )  # fmt: skip
    name = example.data["function"]
    reference = example.answer.removeprefix("```python\n").removesuffix("```")
    bad = [ast.literal_eval(a) for a in example.data["arguments"][:3]]
    raising = [ast.literal_eval(a) for a in example.data["arguments"][3:4]]
    # Right except on three tests (a wrong value) and one more (an exception): 6 of 10 pass.
    partly = (
        reference.replace(f"def {name}(", f"def _right_{name}(", 1) + f"\ndef {name}(*args):\n"
        f"    if args in {bad!r}:\n        return None\n"
        f"    if args in {raising!r}:\n        raise ValueError('no')\n"
        f"    return _right_{name}(*args)\n"
    )
    completion = fenced(partly)
    assert task.process_reward(completion, example) == pytest.approx(0.6)
    assert task.verify(completion, example) == 0.0
    assert task.process_reward(example.answer, example) == 1.0
    assert task.process_reward("no code at all", example) == 0.0


def test_the_process_reward_and_the_verifier_score_a_batch_through_score_rollouts() -> None:
    task = code_task(difficulty=1)
    examples = task.train_prompts(random.Random(2), 4)
    completions = [ex.answer for ex in examples] + ["def nothing(): pass"] * 4
    cfg = RunConfig.model_validate({"task": {"name": "code"}, "rewards": [{"name": "process"}]})
    scores = score_rollouts(
        build_rewards(cfg.rewards), completions, examples * 2, [10] * 8, RewardContext(task, 64)
    )
    assert scores.outcome == [1.0] * 4 + [0.0] * 4
    assert scores.parts["process"] == [1.0] * 4 + [0.0] * 4
    assert task.checks.runs == 4  # the four answers, once each; no code: no run


# ------------------------------------------------------------------------------------------------
# Hostile completions score 0, within the sandbox's limits
# ------------------------------------------------------------------------------------------------


def forged_report(example: Example, nonce: str) -> str:
    """Code that prints a report of exactly the expected results, as the check program would
    write it, under the nonce that the expression ``nonce`` finds."""
    results = repr([repr(value) for value in example.data["expected"]])
    return f"print({MARKER!r} + ' ' + {nonce} + ' ' + {results!r})\n"


# Each is followed by the reference when it defines no function of the problem's name: had it
# not spoiled the check, that function would pass. {forged} prints a forged report with every
# result right, under guessed nonces; {name} is the function's name.
HOSTILE = {
    "forged report, then exits": "{forged}import os\nos._exit(0)\n",
    "forged report, then a wrong function": "{forged}def {name}(*a):\n    return None\n",
    "reads the nonce back, forges": (
        "import os, sys\n"
        "nonce = (sys.stdin.read() + os.read(0, 100).decode()"
        " + open('/proc/self/fd/0').read()).strip()\n"
        "{forged_with_nonce}import os\nos._exit(0)\n"
    ),
    "sys.exit at import": "import sys\nsys.exit(0)\n",
    "os._exit at import": "import os\nos._exit(0)\n",
    "exits inside the call": "import os\ndef {name}(*a):\n    os._exit(0)\n",
    "overrides builtins": (
        "import builtins, os\n"
        "builtins.repr = lambda v: 'forged'\nbuiltins.len = lambda v: 0\n"
        "builtins.print = lambda *a, **k: None\nos.write = lambda fd, data: len(data)\n"
        "def {name}(*a):\n    return None\n"
    ),
    "equal to everything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return 'Anything()'\n"
        "def {name}(*a):\n    return Anything()\n"
    ),
    "loops forever": "while True:\n    pass\n",
    "sleeps in the call": "import time\ndef {name}(*a):\n    time.sleep(60)\n",
    "forks": "import os\nwhile True:\n    os.fork()\n",
    "segfaults": "import ctypes\nctypes.string_at(0)\n",
    "eats memory": "x = bytearray(1 << 30)\n",
    "floods stdout": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "returns its environment": "import os\ndef {name}(*a):\n    return dict(os.environ)\n",
}


def test_hostile_completions_score_zero_within_the_time_limit() -> None:
    task = code_task(difficulty=1)
    [example] = task.train_prompts(random.Random(7), 1)
    name = example.data["function"]
    reference = example.answer.removeprefix("```python\n").removesuffix("```")
    guesses = "".join(forged_report(example, repr(g)) for g in ["", "0" * 32, "nonce"])
    completions = {}
    for what, hostile in HOSTILE.items():
        hostile = (
            hostile.replace("{forged}", guesses)
            .replace("{forged_with_nonce}", forged_report(example, "nonce"))
            .replace("{name}", name)
        )
        completions[what] = fenced(hostile if f"def {name}(" in hostile else hostile + reference)
    started = time.monotonic()
    task.prefetch(list(completions.values()), [example] * len(completions))
    elapsed = time.monotonic() - started
    for what, completion in completions.items():
        assert task.verify(completion, example) == 0.0, what
        assert task.process_reward(completion, example) == 0.0, what
    rounds = math.ceil(len(completions) / CHECK_WORKERS)
    assert elapsed < rounds * (CHECK_LIMITS.wall_seconds + SLACK)
    # The same checks undisturbed: the reference passes, even beside overridden builtins.
    meddling = "import builtins, os, sys\nbuiltins.print = builtins.repr = None\n"
    meddling += "os.write = os._exit = None\nsys.stdout = None\n"
    assert task.verify(fenced(reference), example) == 1.0
    assert task.verify(fenced(meddling + reference), example) == 1.0


# ------------------------------------------------------------------------------------------------
# The batch hook: prefetch runs the batch in parallel, then verify reads the cache
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def counted_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every real sandbox run counted, and the most that ran at once."""
    counts = {"runs": 0, "running": 0, "most": 0}
    lock = threading.Lock()
    real_run = sandbox_runner.run

    def counted(*args: object, **kwargs: object) -> object:
        with lock:
            counts["runs"] += 1
            counts["running"] += 1
            counts["most"] = max(counts["most"], counts["running"])
        try:
            return real_run(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with lock:
                counts["running"] -= 1

    monkeypatch.setattr(sandbox_runner, "run", counted)
    return counts


def test_prefetch_runs_the_batch_in_parallel_and_verify_then_reads_the_cache(counted_runs):
    task = code_task(difficulty=1)
    examples = task.train_prompts(random.Random(3), 4)
    # Two completions per problem, each slow enough to overlap the others: 8 programs.
    slow = "import time\ntime.sleep(0.5)\n"
    completions = [fenced(slow + ex.answer.strip("`").removeprefix("python\n")) for ex in examples]
    completions += ["```python\nimport time\ntime.sleep(0.5)\n```"] * 4
    batch = examples * 2
    task.prefetch(completions, batch)
    assert counted_runs["runs"] == task.checks.runs == 8
    assert counted_runs["most"] == CHECK_WORKERS
    scores = [task.verify(c, ex) for c, ex in zip(completions, batch, strict=True)]
    partial = [task.process_reward(c, ex) for c, ex in zip(completions, batch, strict=True)]
    assert scores == partial == [1.0] * 4 + [0.0] * 4
    assert counted_runs["runs"] == 8  # all read from the cache
    task.prefetch(completions, batch)
    assert counted_runs["runs"] == 8
    # A completion it was not told about runs alone, once.
    assert task.verify(examples[0].answer, examples[0]) == 1.0
    assert task.process_reward(examples[0].answer, examples[0]) == 1.0
    assert counted_runs["runs"] == task.checks.runs == 9


def test_the_hook_passes_through_the_prompt_template(counted_runs) -> None:
    task = code_task(difficulty=1)
    wrapped = with_prompts(task, PromptRenderer(PromptConfig(template="boxed"), tokenizer=None))
    assert wrapped is not task
    examples = wrapped.train_prompts(random.Random(5), 3)
    answers = [ex.data["_original"].answer for ex in examples]
    wrapped.prefetch(answers, examples)
    assert counted_runs["runs"] == 3
    assert [wrapped.verify(a, ex) for a, ex in zip(answers, examples, strict=True)] == [1.0] * 3
    assert counted_runs["runs"] == 3


def test_the_cache_is_bounded() -> None:
    task = code_task(difficulty=1)
    task.checks.size = 2
    examples = task.train_prompts(random.Random(6), 3)
    task.prefetch([ex.answer for ex in examples], examples)
    assert task.checks.runs == 3
    assert task.verify(examples[2].answer, examples[2]) == 1.0
    assert task.checks.runs == 3  # the latest two are kept
    assert task.verify(examples[0].answer, examples[0]) == 1.0
    assert task.checks.runs == 4  # the oldest was dropped, so it ran again


# ------------------------------------------------------------------------------------------------
# HumanEval
# ------------------------------------------------------------------------------------------------


def test_all_164_humaneval_problems_load_and_their_canonical_solutions_pass() -> None:
    problems = humaneval_problems()
    assert len(problems) == PROBLEM_COUNT == 164
    assert len({ex.data["task_id"] for ex in problems}) == 164
    verifier = HumanEvalVerifier()
    verifier.prefetch([ex.answer for ex in problems], list(problems))
    failed = [ex.data["task_id"] for ex in problems if verifier.verify(ex.answer, ex) != 1.0]
    assert not failed
    assert verifier.checks.runs == 164


def test_humaneval_accepts_a_whole_function_or_a_body_and_refuses_wrong_ones() -> None:
    problems = list(humaneval_problems()[::11])  # 15 problems
    verifier = HumanEvalVerifier()
    right, wrong = [], []
    for ex in problems:
        entry = ex.data["entry_point"]
        whole = ex.data["prompt"] + ex.answer  # an instruct model's reply: the whole function
        right += [
            ex.answer + "\n\ndef unrelated():\n    pass\n",  # a body, then more (cut off)
            fenced(whole[whole.index(f"def {entry}(") :]),  # its imports come from the prompt
        ]
        wrong += [
            "    return None\n",
            fenced(f"def {entry}(*args):\n    return None\n"),
            "    import os\n    os._exit(0)\n",
            "    raise SystemExit(0)\n\ncheck = lambda f: None\n",
        ]
    verifier.prefetch(right + wrong, [ex for ex in problems for _ in range(2)]
                      + [ex for ex in problems for _ in range(4)])  # fmt: skip
    for i, ex in enumerate(problems):
        assert verifier.verify(right[2 * i], ex) == 1.0, ex.data["task_id"]
        assert verifier.verify(right[2 * i + 1], ex) == 1.0, ex.data["task_id"]
        for completion in wrong[4 * i : 4 * i + 4]:
            assert verifier.verify(completion, ex) == 0.0, (ex.data["task_id"], completion)


def test_a_humaneval_benchmark_in_the_config() -> None:
    cfg = RunConfig.model_validate({
        "task": {"name": "arith"},
        "eval": {"benchmarks": [{"name": "he", "source": "humaneval", "k": 3, "limit": 5}]},
    })  # fmt: skip
    assert cfg.code_execution() == ["benchmark 'he'"]
    assert "eval/he/pass@3" in cfg.eval.logged_keys()
    [benchmark] = load_benchmarks(cfg.eval.benchmarks, DataFiles())
    assert len(benchmark.examples) == 5 and isinstance(benchmark.verifier, HumanEvalVerifier)
    with pytest.raises(ValidationError) as missing:
        RunConfig.model_validate({"eval": {"benchmarks": [{"name": "file"}]}})
    assert [e["loc"] for e in missing.value.errors()] == [("eval", "benchmarks", 0, "path")]
    with pytest.raises(ValidationError) as extra:
        RunConfig.model_validate(
            {"eval": {"benchmarks": [{"name": "he", "source": "humaneval", "path": "x.jsonl"}]}}
        )
    assert [e["loc"] for e in extra.value.errors()] == [("eval", "benchmarks", 0, "path")]
    assert RunConfig.model_validate({"task": {"name": "code"}}).code_execution() == ["task 'code'"]


# ------------------------------------------------------------------------------------------------
# A run
# ------------------------------------------------------------------------------------------------


def test_two_rl_steps_on_code_with_a_humaneval_benchmark(model_store, tmp_path) -> None:
    cfg = RunConfig.model_validate({
        "steps": 2, "model": {"name": "tiny"},
        "task": {"name": "code", "eval_size": 2}, "rewards": [{"name": "process"}],
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
        "eval": {"every": 0, "at_start": False, "pass_k": 1,
                 "benchmarks": [{"name": "humaneval", "source": "humaneval", "k": 2, "limit": 2}]},
        "checkpoint": {"every": 0},
    })  # fmt: skip
    sink = MemorySink()
    assert train(cfg, sink, workdir=tmp_path, model_store=model_store).status == "succeeded"
    last = sink.steps[2].metrics
    assert 0.0 <= last["eval/humaneval/avg@2"] <= last["eval/humaneval/pass@2"] <= 1.0
    assert math.isfinite(last["reward/process"]) and math.isfinite(last["eval/accuracy"])
