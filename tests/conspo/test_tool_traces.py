"""Tool-use traces, the cold start of a run with tools (conspo.training.traces; the sft kind's
kind_params.tool): a trace holds the tool's real output and an answer the verifier accepts; the
tasks' tool_solution computes the reference answer of every problem it solves; the config
refuses traces that cannot be built or evaluated, at kind_params.tool; a short SFT on traces
evaluates with the tool.

The python tool's tests run the sandbox: without bwrap they skip, or fail when
CONSPO_REQUIRE_SERVICES=1 (CI), as tests/conspo/test_sandbox.py does.
"""

from __future__ import annotations

import math
import os
import random
import re
from typing import Any

import pytest
from pydantic import ValidationError

from conspo import metrics as M
from conspo.config import RunConfig, TaskConfig, ToolsConfig
from conspo.jobs import train_job
from conspo.sandbox import sandbox_available
from conspo.sink import MemorySink
from conspo.tasks import Example, make_task
from conspo.tasks.arith import ArithParams, ArithTask
from conspo.tasks.reasoning_gym import WRITTEN
from conspo.tools import ToolCall, final_answer, make_toolbox, split_turns
from conspo.training.traces import CALL_SOURCES, MAX_DRAWS, TraceTool, tool_traces

REQUIRE = os.environ.get("CONSPO_REQUIRE_SERVICES") == "1"
PROBE = sandbox_available()


@pytest.fixture
def sandbox() -> None:
    if not PROBE:
        if REQUIRE:
            pytest.fail(f"CONSPO_REQUIRE_SERVICES=1 but the sandbox is unavailable: {PROBE.reason}")
        pytest.skip(f"sandbox unavailable: {PROBE.reason}")


def task_of(name: str, params: dict[str, Any]) -> Any:
    return make_task(TaskConfig.model_validate({"name": name, "params": params}))


def draws(task: Any) -> Any:
    """The sft kind's draw: training problems, each with its plain target (the answer)."""
    return lambda rng, n: [(ex, ex.answer) for ex in task.train_prompts(rng, n)]


ARITH_PRODUCTS = ("arith", {"digits": 3, "operators": "*"})
RG_PRODUCTS = ("reasoning_gym", {"dataset": "products", "config": {"min_digits": 3,
                                                                   "max_digits": 4}})  # fmt: skip


# ------------------------------------------------------------------------------------------------
# A trace: the call, the tool's real output, an answer the verifier accepts
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, params", [ARITH_PRODUCTS, RG_PRODUCTS], ids=["arith", "rg"])
def test_a_python_trace_holds_the_sandboxs_product_and_its_answer_verifies(
    sandbox: None, name: str, params: dict[str, Any]
) -> None:
    task = task_of(name, params)
    box = make_toolbox(ToolsConfig(names=["python"]))
    traces = tool_traces(task, draws(task), box, "python", random.Random(0), 6)
    assert len(traces) == 6
    for example, text in traces:
        # the product, computed here from the question's two numbers
        product = math.prod(int(n) for n in re.findall(r"\d+", example.prompt))
        call, observation, answer = split_turns(text)
        assert (call.kind, observation.kind, answer.kind) == ("model", "observation", "model")
        assert re.fullmatch(r"<code>\nprint\(\d+ ?\* ?\d+\)\n</code>", call.text), call.text
        # the call a rollout would read in it: the print, without the newlines around it
        assert box.call_in(call.text) == ToolCall("python", call.text[len("<code>\n") : -8])
        assert observation.text == f"\n<interpreter>\n{product}\n</interpreter>\n"
        assert answer.text == example.answer
        assert final_answer(text) == example.answer
        assert task.verify(final_answer(text), example) == 1.0
        # the verifier reads the text after the interpreter: the printed product alone is no answer
        assert task.verify(final_answer(call.text + observation.text), example) == 0.0


def test_the_observation_is_what_the_sandbox_printed_not_the_reference(sandbox: None) -> None:
    class TenfoldCode(ArithTask):
        """arith whose tool code computes ten times the answer."""

        def tool_solution(self, example: Example) -> str:
            return f"({super().tool_solution(example)}) * 10"

    task = TenfoldCode(ArithParams(digits=3, operators="*"))
    box = make_toolbox(ToolsConfig(names=["python"]))
    for example, text in tool_traces(task, draws(task), box, "python", random.Random(2), 4):
        _, observation, answer = split_turns(text)
        value = example.data["value"]
        assert observation.text == f"\n<interpreter>\n{value * 10}\n</interpreter>\n"
        assert answer.text == str(value)


def test_a_calculator_trace_and_a_call_that_fails_is_left_out() -> None:
    class HalfSolved(ArithTask):
        """arith whose odd answers get an expression the calculator refuses."""

        def tool_solution(self, example: Example) -> str:
            odd = example.data["value"] % 2
            return "1 // 0" if odd else super().tool_solution(example)

    task = HalfSolved(ArithParams(digits=2, operators="+"))
    box = make_toolbox(ToolsConfig(names=["calculator"]))
    traces = tool_traces(task, draws(task), box, "calculator", random.Random(1), 16)
    assert 0 < len(traces) < 16
    for example, text in traces:
        assert example.data["value"] % 2 == 0
        expression = example.prompt.removesuffix("=")
        value = example.data["value"]
        assert text == f"<calc>{expression}</calc>\n<interpreter>\n{value}\n</interpreter>\n{value}"


def test_a_task_without_solutions_for_its_problems_has_nothing_to_trace() -> None:
    task = task_of("reasoning_gym", {"dataset": "leg_counting"})
    box = make_toolbox(ToolsConfig(names=["calculator"]))
    with pytest.raises(ValueError, match=f"none of {MAX_DRAWS * 2} training problems"):
        tool_traces(task, draws(task), box, "calculator", random.Random(0), 2)


def test_every_trace_tool_is_a_registered_tool_with_a_call_source() -> None:
    from typing import get_args

    from conspo.registry import tool_names

    assert set(get_args(TraceTool)) == set(CALL_SOURCES) <= set(tool_names())


# ------------------------------------------------------------------------------------------------
# tool_solution: the value of its expression is the reference answer
# ------------------------------------------------------------------------------------------------

SOLVED = [
    ("arith", {"digits": 3, "operators": "+-*", "num_operands": 4}),
    ("arith", {"digits": 4, "operators": "*"}),
    ("arith", {"digits": 1, "operators": "-"}),
    ("reasoning_gym", {"dataset": "basic_arithmetic"}),
    ("reasoning_gym", {"dataset": "basic_arithmetic",
                       "config": {"whitespace": "no_space", "format_style": "natural"}}),
    ("reasoning_gym", {"dataset": "chain_sum"}),
    ("reasoning_gym", {"dataset": "products", "config": {"min_digits": 1, "max_digits": 5}}),
    ("reasoning_gym", {"dataset": "basic_arithmetic", "answer_format": "boxed"}),
]  # fmt: skip


def reference_number(task_name: str, example: Example) -> int:
    if task_name == "arith":
        return int(example.data["value"])
    return int(example.data["entry"]["answer"])


def solved_by_calculator(task: Any, examples: list[Example]) -> list[tuple[Example, str]]:
    """(example, the calculator's output for its tool_solution) of the examples with one."""
    box = make_toolbox(ToolsConfig(names=["calculator"]))
    solved = [(ex, task.tool_solution(ex)) for ex in examples]
    solved = [(ex, expression) for ex, expression in solved if expression is not None]
    results = box.run([ToolCall("calculator", expression) for _, expression in solved])
    assert all(r.status == "ok" for r in results), [r.output for r in results]
    return [(ex, r.output) for (ex, _), r in zip(solved, results, strict=True)]


@pytest.mark.parametrize("name, params", SOLVED, ids=lambda v: str(v))
def test_the_solution_of_every_drawn_problem_computes_its_reference_answer(
    name: str, params: dict[str, Any]
) -> None:
    task = task_of(name, params)
    examples = task.train_prompts(random.Random(3), 300) + task.eval_examples(50)
    solved = solved_by_calculator(task, examples)
    assert len(solved) == len(examples)  # every problem of these has one
    answer_format = params.get("answer_format", "answer_tag")
    for example, output in solved:
        assert int(output) == reference_number(name, example), example.prompt
        # the task's own verifier (reasoning-gym's score_answer) takes the tool's output
        written = output if name == "arith" else WRITTEN[answer_format].format(output)
        assert task.verify(written, example) == 1.0


def test_basic_arithmetic_without_parentheses_is_solved_where_its_question_is_right() -> None:
    """Without parentheses basic_arithmetic computes left to right, and where it cannot divide
    it multiplies by another number than the one it wrote: such a question's expression has no
    value that is the answer, and the problem is skipped."""
    task = task_of("reasoning_gym", {"dataset": "basic_arithmetic",
                                     "config": {"allow_parentheses": False}})  # fmt: skip
    examples = task.train_prompts(random.Random(0), 300)
    solved = solved_by_calculator(task, examples)
    assert len(examples) // 3 < len(solved) < len(examples)
    for example, output in solved:
        assert int(output) == reference_number("reasoning_gym", example)


def test_python_prints_what_the_calculator_computes(sandbox: None) -> None:
    """Floor division of negatives, unary minus, long sums: the python tool's printed value of
    a solution is the calculator's."""
    task = task_of("reasoning_gym", {"dataset": "basic_arithmetic"})
    examples = task.train_prompts(random.Random(5), 24)
    box = make_toolbox(ToolsConfig(names=["python"]))
    expressions = [task.tool_solution(ex) for ex in examples]
    printed = box.run([ToolCall("python", f"print({e})") for e in expressions])
    computed = solved_by_calculator(task, examples)
    assert [r.output.strip() for r in printed] == [output for _, output in computed]


def test_a_generator_without_solutions_gives_none() -> None:
    mixed = task_of("reasoning_gym", {"mixture": [{"name": "products"},
                                                  {"name": "leg_counting"}]})  # fmt: skip
    examples = mixed.train_prompts(random.Random(0), 60)
    by_generator = {
        ex.data["entry"]["metadata"]["source_dataset"]: mixed.tool_solution(ex) for ex in examples
    }
    assert by_generator["leg_counting"] is None and by_generator["products"] is not None


# ------------------------------------------------------------------------------------------------
# The config refuses traces it cannot build or evaluate, at kind_params.tool
# ------------------------------------------------------------------------------------------------


def sft_config(**overrides: Any) -> dict[str, Any]:
    return {"kind": "sft", "kind_params": {"tool": "calculator"}, "tools": ["calculator"],
            **overrides}  # fmt: skip


@pytest.mark.parametrize(
    "overrides, loc, says",
    [
        ({"tools": []}, ("kind_params", "tool"), "must be listed in tools.names (now: none)"),
        ({"tools": ["python"]}, ("kind_params", "tool"), "'calculator' must be listed"),
        ({"task": {"name": "countdown"}}, ("kind_params", "tool"), "provides no tool_solution"),
        (
            {"task": {"name": "reasoning_gym", "params": {"dataset": "leg_counting"}}},
            ("kind_params", "tool"),
            "no generator of this task (leg_counting) has tool solutions",
        ),
        ({"kind_params": {"tool": "sql"}}, ("kind_params", "tool"), "'python' or 'calculator'"),
        (
            {"kind_params": {"tool": "calculator", "path": "data/x.jsonl"}},
            ("kind_params",),
            "built from the task's own problems",
        ),
    ],
    ids=["no tools", "another tool", "no hook", "no solvable generator", "unknown", "path"],
)
def test_the_config_refuses_traces_it_cannot_build_at_the_field(
    overrides: dict[str, Any], loc: tuple[str, ...], says: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        RunConfig.model_validate(sft_config(**overrides))
    errors = refused.value.errors()
    assert [e["loc"] for e in errors] == [loc], errors
    assert says in errors[0]["msg"]


def test_the_config_takes_traces_of_a_listed_tool_for_a_task_with_solutions() -> None:
    RunConfig.model_validate(sft_config())
    mixed = {"name": "reasoning_gym", "params": {"mixture": [{"name": "leg_counting"},
                                                             {"name": "chain_sum"}]}}  # fmt: skip
    RunConfig.model_validate(sft_config(task=mixed))
    # without traces, the tools and the task are the run's own business
    RunConfig.model_validate({"kind": "sft", "task": {"name": "countdown"}})


# ------------------------------------------------------------------------------------------------
# A short SFT on traces trains and evaluates with the tool
# ------------------------------------------------------------------------------------------------


def test_a_short_sft_on_calculator_traces_evaluates_with_the_tool(model_store, tmp_path) -> None:
    config = RunConfig.model_validate({
        "kind": "sft", "kind_params": {"batch_size": 4, "tool": "calculator"},
        "tools": ["calculator"], "steps": 2, "model": {"name": "tiny"},
        "task": {"name": "arith", "eval_size": 2}, "sampling": {"max_new_tokens": 48},
        "eval": {"every": 0, "pass_k": 1}, "checkpoint": {"every": 0},
    })  # fmt: skip
    sink = MemorySink()
    result = train_job(config, sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded"
    last = sink.steps[2].metrics
    assert 0.0 <= last[M.EVAL_TOOL_CALL_RATE] <= 1.0
    # each trace of a 1-digit sum is ~16 characters of the model's ("<calc>3+5</calc>8") and EOS,
    # and 30 of the interpreter's, which the count leaves out (one token per character)
    assert 4 * 17 <= sink.steps[1].metrics[M.SFT_TOKENS] <= 4 * 20
    assert math.isfinite(sink.steps[1].metrics[M.LOSS])
