"""The reasoning_gym task: reasoning-gym's generators and verifiers behind the Task interface."""

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from conspo.config import RunConfig, TaskConfig
from conspo.rewards import RewardContext, build_rewards, score_rollouts
from conspo.tasks import make_task
from conspo.tasks.base import is_held_out
from conspo.tasks.reasoning_gym import (
    HELD_OUT_SEED,
    POOL_SIZE,
    TRAIN_SEED,
    extract_answer,
    generator_names,
)

CHAIN = {"dataset": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}


def task_of(params):
    return make_task(TaskConfig(name="reasoning_gym", params=params))


def errors_of(params):
    with pytest.raises(ValidationError) as caught:
        TaskConfig(name="reasoning_gym", params=params)
    return [(e["loc"], e["msg"]) for e in caught.value.errors()]


def test_generators_are_deterministic():
    a, b = task_of(CHAIN), task_of(CHAIN)
    draw = [ex.prompt for ex in a.train_prompts(random.Random(7), 20)]
    assert draw == [ex.prompt for ex in b.train_prompts(random.Random(7), 20)]
    assert draw != [ex.prompt for ex in b.train_prompts(random.Random(8), 20)]
    assert a.eval_examples(30) == b.eval_examples(30) == a.eval_examples(30)


def test_train_and_held_out_never_share_a_problem():
    """1-digit a+b: a small problem space, which both seeds draw from; still disjoint."""
    task = task_of(CHAIN)
    held_out = {ex.prompt for ex in task.eval_examples(12)}
    train = {ex.prompt for ex in task.train_prompts(random.Random(0), 3000)}
    assert held_out and train and not held_out & train
    assert all(is_held_out(p) for p in held_out) and not any(is_held_out(p) for p in train)
    # and they come from disjoint seed ranges: item i of a split seeded s draws Random(s + i)
    assert task.train.seed == TRAIN_SEED and task.held_out.seed == HELD_OUT_SEED
    assert TRAIN_SEED + POOL_SIZE + len(task.train.datasets) < HELD_OUT_SEED
    assert len(held_out) == 12  # distinct problems


def test_prompt_asks_for_the_format_the_verifier_reads():
    tag = task_of(CHAIN).eval_examples(1)[0]
    boxed = task_of({**CHAIN, "answer_format": "boxed"}).eval_examples(1)[0]
    assert tag.prompt.endswith("between <answer> and </answer>.")
    assert boxed.prompt.endswith("within \\boxed{}.")


def test_verifier_on_known_right_and_wrong_answers():
    task = task_of(CHAIN)
    ex = task.eval_examples(1)[0]
    right = ex.data["entry"]["answer"]
    wrong = str(int(right) + 1)
    assert ex.answer == f"<answer>{right}</answer>"
    assert task.verify(f"Adding them: <answer>{right}</answer>", ex) == 1.0
    assert task.verify(f"<answer> {right} </answer>\nDone.", ex) == 1.0
    assert task.verify(f"<answer>{wrong}</answer>", ex) == 0.0
    assert task.verify(f"The answer is {right}.", ex) == 0.0  # not in the asked format
    assert task.verify(f"<answer>{right}</answer> no wait <answer>{wrong}</answer>", ex) == 0.0
    boxed = task_of({**CHAIN, "answer_format": "boxed"})
    assert boxed.verify(f"so \\boxed{{{right}}}", ex) == 1.0
    assert boxed.verify(f"<answer>{right}</answer>", ex) == 0.0


def test_last_number_reads_what_a_small_model_writes():
    """SmolLM2-135M-Instruct writes "The final answer ... is 17." whatever format it is asked."""
    task = task_of({**CHAIN, "answer_format": "last_number"})
    ex = task.eval_examples(1)[0]
    right = ex.data["entry"]["answer"]
    assert ex.prompt.endswith("End your reply with the final answer.") and ex.answer == right
    assert task.verify(f"The final answer to the arithmetic problem is {right}.", ex) == 1.0
    assert task.verify(f"{right} + 1 = {int(right) + 1}", ex) == 0.0


def test_gsm_symbolic_and_leg_counting_verify_their_own_answers():
    for name in ("gsm_symbolic", "leg_counting"):
        task = task_of({"dataset": name})
        for ex in task.eval_examples(3):
            assert task.verify(f"<answer>{ex.data['entry']['answer']}</answer>", ex) == 1.0
            assert task.verify("<answer>-1</answer>", ex) == 0.0


def test_partial_score_is_the_process_reward():
    """countdown gives a well-formed wrong expression a small partial score: not positive,
    but the process reward (R = O + βΦ) sees it."""
    task = task_of({"dataset": "countdown", "config": {"min_numbers": 3, "max_numbers": 3}})
    ex = task.eval_examples(1)[0]
    numbers = ex.data["entry"]["metadata"]["numbers"]
    wrong = "<answer>" + " + ".join(map(str, numbers)) + "</answer>"
    if task.score(wrong, ex) == 1.0:  # the sum happened to be the target
        wrong = "<answer>" + " * ".join(map(str, numbers)) + "</answer>"
    assert 0 < task.process_reward(wrong, ex) < 1 and task.verify(wrong, ex) == 0.0
    run = RunConfig.model_validate(
        {
            "task": {"name": "reasoning_gym", "params": {"dataset": "countdown"}},
            "rewards": [{"name": "process"}],
        }
    )
    scores = score_rollouts(build_rewards(run.rewards), [wrong], [ex], [5], RewardContext(task, 16))
    assert scores.outcome == [0.0] and 0 < scores.parts["process"][0] < 1


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        ("no tag at all, 42", "answer_tag", None),
        ("<answer>42", "answer_tag", None),  # never closed: cut off
        ("<answer>1</answer> then <answer>2</answer>", "answer_tag", "2"),
        ("<answer>\n 7 \n</answer> and some trailing text", "answer_tag", "7"),
        ("no box, 42", "boxed", None),
        ("\\boxed{1} and then \\boxed{2}", "boxed", "2"),
        ("\\boxed{\\frac{1}{2}}", "boxed", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "boxed", "\\{1, 2\\}"),
        ("\\boxed{3} trailing words {with braces}", "boxed", "3"),
        ("\\boxed{3} then a cut-off \\boxed{4", "boxed", None),
        ("The sum is 12.", "last_number", "12"),
        ("3 + 4 = 7, so \\boxed{7}. Check: 7 - 4 = 3", "last_number", "7"),
        ("no number at all", "last_number", None),
        # issue 37: a reply cut off inside an expression reads no answer, not an echoed operand
        ("…multiply both sides of the equation by 11. (1 * 6) *", "last_number", None),
        ("so x = 6 -", "last_number", None),
        ("The greatest common divisor is **6**.", "last_number", "6"),
        ("12 - 6 = 6, and the answer is 6 (the largest).", "last_number", "6"),
    ],
)
def test_answer_extraction_edge_cases(text, fmt, expected):
    assert extract_answer(text, fmt) == expected


def test_a_weighted_mixture_draws_each_generator_by_weight():
    mix = {"mixture": [{"name": "chain_sum", "weight": 3}, {"name": "leg_counting"}]}
    task = task_of(mix)
    drawn = Counter(
        ex.data["entry"]["metadata"]["source_dataset"]
        for ex in task.train_prompts(random.Random(0), 800)
    )
    assert set(drawn) == {"chain_sum", "leg_counting"}
    assert 2.4 < drawn["chain_sum"] / drawn["leg_counting"] < 3.8
    ex = task.eval_examples(1)[0]
    assert task.verify(ex.answer, ex) == 1.0


def test_bad_generators_and_configs_are_refused_at_the_field():
    assert (
        "unknown reasoning-gym generator 'nope'"
        in dict(errors_of({"dataset": "nope"}))[("params", "dataset")]
    )
    bad_key = dict(errors_of({"dataset": "chain_sum", "config": {"terms": 2}}))
    assert "its parameters: min_terms" in bad_key[("params", "config", "terms")]
    bad_type = dict(errors_of({"dataset": "chain_sum", "config": {"min_terms": "two"}}))
    assert bad_type[("params", "config", "min_terms")] == (
        "Input should be a valid integer (the default is 2)"
    )
    refused = dict(errors_of({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}))
    assert "max_terms must be >= min_terms" in refused[("params", "config", "max_terms")]
    owned = dict(errors_of({"dataset": "chain_sum", "config": {"seed": 1}}))
    assert "disjoint seeds" in owned[("params", "config", "seed")]
    mixed = errors_of(
        {"mixture": [{"name": "chain_sum"}, {"name": "leg_counting", "config": {"max_animals": 0}}]}
    )
    assert [loc for loc, _ in mixed] == [("params", "mixture", 1, "config", "max_animals")]
    twice = errors_of({"mixture": [{"name": "chain_sum"}, {"name": "chain_sum"}]})
    assert [loc for loc, _ in twice] == [("params", "mixture", 1, "name")]


def test_the_form_lists_the_generators():
    schema = TaskConfig.model_validate({"name": "reasoning_gym"})
    from conspo.registry import get_task

    dataset = get_task("reasoning_gym").params.model_json_schema()["properties"]["dataset"]
    assert dataset["enum"] == generator_names()
    assert {"chain_sum", "gsm_symbolic", "leg_counting", "basic_arithmetic"} <= set(dataset["enum"])
    assert "composite" not in dataset["enum"]  # mixtures are the mixture parameter
    assert schema.params["dataset"] == "chain_sum"
