import json
import random
from pathlib import Path
from typing import Any

import pytest

from conspo.config import TaskConfig
from conspo.registry import get_task, register_task, task_names
from conspo.tasks import Example, extract_answer, make_task
from conspo.tasks.base import distinct_prompts


def task_config(name: str, **params: Any) -> TaskConfig:
    return TaskConfig(name=name, params=params)


def test_arith_verifier():
    task = make_task(task_config("arith", digits=2))
    ex = Example("12+7=", "19", {"value": 19})
    assert task.verify("19", ex) == 1.0
    assert task.verify(" 19 ", ex) == 1.0
    assert task.verify("20", ex) == 0.0
    for malformed in ["", "19a", "1 9", "--19", "19=19", "+19", "nineteen"]:
        assert task.verify(malformed, ex) == 0.0, malformed
    neg = Example("3-7=", "-4", {"value": -4})
    assert task.verify("-4", neg) == 1.0 and task.verify("4", neg) == 0.0


def test_arith_problems_follow_the_knobs():
    task = make_task(task_config("arith", digits=2, operators="*", num_operands=3))
    for ex in task.train_prompts(random.Random(0), 50):
        operands = ex.prompt[:-1].split("*")
        assert len(operands) == 3 and all(0 <= int(x) < 100 for x in operands)
        assert task.verify(ex.answer, ex) == 1.0


def test_countdown_verifier():
    task = make_task(task_config("countdown", num_operands=3))
    ex = Example("3,5,7:22=", "3*5+7", {"numbers": [3, 5, 7], "target": 22})
    assert task.verify("3*5+7", ex) == 1.0
    assert task.verify("7+5*3", ex) == 1.0  # any order, usual precedence
    assert task.verify("(7+5)*3", ex) == 0.0  # 36
    assert task.verify("3*5+7+0", ex) == 0.0  # an extra number
    assert task.verify("5*5-3", ex) == 0.0  # 5 twice, 7 unused
    for malformed in ["", "3*5+", "__import__('os')", "3**5+7", "3*5+7;", "3/5+7"]:
        assert task.verify(malformed, ex) == 0.0, malformed


def test_countdown_reference_answers_verify():
    task = make_task(task_config("countdown", num_operands=3))
    for ex in task.train_prompts(random.Random(1), 50) + task.eval_examples(20):
        assert task.verify(ex.answer, ex) == 1.0, ex


@pytest.mark.parametrize(
    "cfg",
    [
        task_config("arith", digits=2),
        task_config("arith", digits=1, num_operands=3),
        task_config("countdown", num_operands=3),
    ],
)
def test_train_and_held_out_splits_are_disjoint(cfg):
    task = make_task(cfg)
    held_out = task.eval_examples(64)
    assert len(held_out) == 64 and len({ex.prompt for ex in held_out}) == 64
    assert [ex.prompt for ex in task.eval_examples(64)] == [ex.prompt for ex in held_out]
    train = {ex.prompt for seed in range(3) for ex in task.train_prompts(random.Random(seed), 500)}
    assert not train & {ex.prompt for ex in held_out}
    a = task.train_prompts(random.Random(0), 20)
    assert a == task.train_prompts(random.Random(0), 20) != task.train_prompts(random.Random(1), 20)


def test_small_problem_space_gives_a_smaller_held_out_set():
    task = make_task(task_config("arith", digits=1, operators="+", num_operands=2))
    held_out = task.eval_examples(64)
    assert 0 < len(held_out) < 64  # 100 problems in all, ~10% held out


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} no wait \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first 3 then 4, finally 5.5", "5.5"),
        ("the total is 1,234", "1234"),
        ("no number here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_jsonl_task_math_verification(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": "1/2"} for i in range(40)]
    rows.append({"prompt": "poly", "answer": "x^2+2x"})
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = make_task(task_config("jsonl", path=str(path)))
    half = Example("q", "1/2")
    assert task.verify("\\boxed{0.5}", half) == 1.0
    assert task.verify("I get 0.5", half) == 1.0  # last number
    assert task.verify("\\boxed{\\frac{1}{2}}", half) == 1.0  # symbolic
    assert task.verify("\\boxed{0.6}", half) == 0.0
    assert task.verify("no idea", half) == 0.0
    assert task.verify("\\boxed{\\frac{1}{", half) == 0.0  # malformed, never a crash
    assert task.verify("\\boxed{2x+x^2}", Example("poly", "x^2+2x")) == 1.0
    assert task.verify("\\boxed{x^2+3x}", Example("poly", "x^2+2x")) == 0.0
    held = {ex.prompt for ex in task.eval_examples(100)}
    train = {ex.prompt for ex in task.train_prompts(random.Random(0), 500)}
    assert held and not held & train and held | train == {r["prompt"] for r in rows}


def test_jsonl_with_an_eval_file_and_a_bad_line(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    b.write_text('{"prompt": "2+2=", "answer": "4"}\n')
    task = make_task(task_config("jsonl", path=str(a), eval_path=str(b)))
    assert [ex.prompt for ex in task.eval_examples(10)] == ["2+2="]
    (tmp_path / "c.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="c.jsonl:1"):
        make_task(task_config("jsonl", path=str(tmp_path / "c.jsonl")))


# ------------------------------------------------------------------------------------------------
# The registry (every task building from its defaults and verifying its own references, every
# parameter described: tests/conspo/test_registries.py)
# ------------------------------------------------------------------------------------------------


FIXTURES = Path(__file__).parents[2] / "examples" / "data" / "math"


def test_a_task_name_cannot_be_registered_twice_with_different_code():
    arith = get_task("arith")
    with pytest.raises(ValueError, match="task 'arith' is already registered to ArithTask"):

        @register_task("arith", params=arith.params, description="another arith")
        class OtherArith:  # pragma: no cover - never built
            name = "arith"

    # the same class again (a module imported twice) is not a conflict
    register_task("arith", params=arith.params, description=arith.description)(arith.cls)
    assert get_task("arith") == arith


def test_an_unknown_task_lists_the_valid_ones():
    with pytest.raises(KeyError, match="unknown task 'sudoku'; valid tasks: ") as info:
        get_task("sudoku")
    for name in task_names():
        assert name in str(info.value)


@pytest.mark.parametrize(
    "params",
    [
        {"path": "gsm8k.jsonl"},
        {"path": "gsm8k.parquet"},
        {"path": "math.parquet"},
        {"path": "math_disk", "eval_path": "math_disk"},
        {"path": "easy.jsonl"},
        {"path": "benchmark.jsonl"},
    ],
)
def test_the_math_task_verifies_each_fixtures_reference_and_refuses_a_wrong_one(params):
    resolved = {k: str(FIXTURES / v) for k, v in params.items()}
    task = make_task(TaskConfig(name="math", params=resolved))
    examples = task.train_prompts(random.Random(0), 40) + task.eval_examples(40)
    for ex in examples:
        assert task.verify(f"So the answer is \\boxed{{{ex.answer}}}.", ex) == 1.0, ex
        assert task.verify(f"\\boxed{{{ex.answer}+1}}", ex) == 0.0, ex
    assert not {ex.prompt for ex in task.train_prompts(random.Random(0), 40)} & {
        ex.prompt for ex in task.eval_examples(40)
    }


def test_the_math_task_reads_a_datasetdicts_test_split_for_eval():
    path = str(FIXTURES / "math_disk")
    task = make_task(TaskConfig(name="math", params={"path": path, "eval_path": path}))
    assert len(task.eval_examples(1000)) == 30  # the test split; train has 120


def test_a_steps_prompts_are_distinct_while_the_task_has_problems_enough():
    """Issue 37: a batch drew one problem twice (two groups of it, merged in the per-prompt
    statistics). ``distinct_prompts`` draws repeats again."""
    task = make_task(task_config("arith", digits=1, operators="+", num_operands=2))
    repeated = 0
    for seed in range(20):
        plain = task.train_prompts(random.Random(seed), 16)
        drawn = distinct_prompts(task, random.Random(seed), 16)
        assert len(drawn) == 16 and len({ex.prompt for ex in drawn}) == 16
        if len({ex.prompt for ex in plain}) == 16:
            assert drawn == plain  # a batch without repeats is what train_prompts drew
        else:
            repeated += 1
    assert repeated > 0  # ~90 training problems: 16 draws repeat one most of the time
    # fewer problems than asked: the repeats stay, and the draw ends
    drawn = distinct_prompts(task, random.Random(0), 120)
    assert len(drawn) == 120 and 80 < len({ex.prompt for ex in drawn}) <= 90
