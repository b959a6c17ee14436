"""A reward is user code (a plugin registers its own): ``score_rollouts`` contains what it does
wrong. A reward that raises, or returns no finite number, fails that rollout alone (scored 0,
counted, its reason logged once per step); a batched reward's bad call fails its whole batch.
The other rollouts and rewards score as before, the shaped reward stays finite, and a cancel
(``Abandoned``) or the device out of memory still ends the step."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from conspo import metrics as M
from conspo.config import RewardConfig, RunConfig
from conspo.registry import REWARDS, register_reward
from conspo.rewards import RewardContext, RewardScores, build_rewards, score_rollouts
from conspo.rewards.base import RewardParams
from conspo.sink import MemorySink
from conspo.stopping import Abandoned
from conspo.tasks.arith import ArithParams, ArithTask
from conspo.tasks.base import Example
from conspo.training.loop import setup
from conspo.training.rollouts import sample_groups
from conspo.training.trainer import train

ARITH = ArithTask(ArithParams(num_operands=3, operators="+-*"))
EXAMPLE = Example("3*4+7=", "19", {"value": 19, "steps": [12, 19]})
TEXTS = ["19", "bad", "18", "19"]  # the reward under test misbehaves on "bad" alone
OUTCOME = [1.0, 0.0, 0.0, 1.0]  # the verifier's, whatever the other reward does
GOOD = 0.25  # what the reward under test gives every other rollout
WEIGHT = 0.5
NAME = "misbehaving"

Register = Callable[..., None]


@pytest.fixture
def register() -> Iterator[Register]:
    """Register a reward as a plugin would, and take it back after the test."""
    names: list[str] = []

    def add(fn: Callable[..., Any], *, name: str = NAME, batched: bool = False) -> None:
        register_reward(name, params=RewardParams, description="A test's.", batched=batched)(fn)
        names.append(name)

    yield add
    for name in names:
        REWARDS.discard(name)


def score(*names: str, task: Any = ARITH) -> RewardScores:
    specs = [RewardConfig(name="verifier"), *(RewardConfig(name=n, weight=WEIGHT) for n in names)]
    examples, lengths = [EXAMPLE] * len(TEXTS), [len(t) for t in TEXTS]
    return score_rollouts(build_rewards(specs), TEXTS, examples, lengths, RewardContext(task, 6))


def assert_only_the_bad_rollout_failed(scores: RewardScores, reason: str) -> None:
    assert scores.parts[NAME] == [GOOD, 0.0, GOOD, GOOD]
    assert scores.outcome == scores.parts["verifier"] == OUTCOME
    assert scores.failed == {NAME: 1}
    assert scores.lost == [False, True, False, False]  # the rollout that lost a reward
    assert reason in scores.reasons[NAME]
    weighted = zip(OUTCOME, scores.parts[NAME], strict=True)
    assert scores.shaped == [o + WEIGHT * p for o, p in weighted]
    assert all(math.isfinite(s) for s in scores.shaped)


def fails_on_bad(misbehave: Callable[[], Any]) -> Callable[..., Any]:
    def reward(completion: str, example: Example, context: RewardContext, params: Any) -> Any:
        return misbehave() if completion == "bad" else GOOD

    return reward


def raise_(exc: Exception) -> Callable[[], Any]:
    def misbehave() -> Any:
        raise exc

    return misbehave


@pytest.mark.parametrize(
    ("misbehave", "reason"),
    [
        (raise_(ValueError("no answer in it")), "ValueError: no answer in it"),
        (lambda: 1 / 0, "ZeroDivisionError: division by zero"),
        (lambda: EXAMPLE.data["missing"], "KeyError: 'missing'"),
        (lambda: None, "returned None (NoneType), not a finite number"),
        (lambda: "0.5", "returned '0.5' (str), not a finite number"),
        (lambda: [1.0], "returned [1.0] (list), not a finite number"),
        (lambda: math.nan, "returned nan (float), not a finite number"),
        (lambda: math.inf, "returned inf (float), not a finite number"),
        (lambda: -math.inf, "returned -inf (float), not a finite number"),
        (lambda: torch.tensor([1.0, 2.0]), "(Tensor), not a finite number"),
    ],
    ids=[
        "value_error",
        "zero_division",
        "key_error",
        "none",
        "str",
        "list",
        "nan",
        "inf",
        "minus_inf",
        "two_element_tensor",
    ],  # fmt: skip
)
def test_a_reward_that_raises_or_returns_no_finite_number_fails_that_rollout_alone(
    register: Register,
    caplog: pytest.LogCaptureFixture,
    misbehave: Callable[[], Any],
    reason: str,
) -> None:
    register(fails_on_bad(misbehave))
    with caplog.at_level(logging.WARNING, logger="conspo.rewards.base"):
        scores = score(NAME)
    assert_only_the_bad_rollout_failed(scores, reason)
    [logged] = [r.getMessage() for r in caplog.records if f"reward {NAME} failed" in r.message]
    assert f"failed on 1 of 4 rollouts (scored 0): {scores.reasons[NAME]}" in logged


def test_bools_ints_and_scalars_are_numbers(register: Register) -> None:
    # A verifier-like reward returns whether the answer is right: True is 1.0, False 0.0.
    register(lambda completion, example, context, params: completion == "19", name="is_19")
    register(lambda completion, example, context, params: len(completion), name="chars")
    register(lambda completion, *_: torch.tensor(0.5, dtype=torch.float64), name="tensor")
    scores = score("is_19", "chars", "tensor")
    assert scores.parts["is_19"] == OUTCOME
    assert scores.parts["chars"] == [2.0, 3.0, 2.0, 2.0]
    assert scores.parts["tensor"] == [0.5] * 4
    assert scores.failed == {} and scores.reasons == {}
    assert all(isinstance(v, float) for values in scores.parts.values() for v in values)


def test_a_reason_is_cut_and_logged_once_per_reward_per_step(
    register: Register, caplog: pytest.LogCaptureFixture
) -> None:
    register(lambda completion, *_: (_ for _ in ()).throw(RuntimeError("x" * 10_000)))
    with caplog.at_level(logging.WARNING, logger="conspo.rewards.base"):
        scores = score(NAME)
    assert scores.parts[NAME] == [0.0] * 4 and scores.failed == {NAME: 4}
    assert scores.reasons[NAME].startswith("RuntimeError: xxx")
    assert len(scores.reasons[NAME]) <= 300
    logged = [r for r in caplog.records if f"reward {NAME} failed" in r.getMessage()]
    assert len(logged) == 1 and "failed on 4 of 4 rollouts" in logged[0].getMessage()


class RaisingVerify(ArithTask):
    """A user's task whose verify breaks on one completion."""

    def verify(self, completion: str, example: Example) -> float:
        if completion == "bad":
            raise IndexError("list index out of range")
        return super().verify(completion, example)


def test_a_verify_that_raises_is_outcome_0_for_that_rollout() -> None:
    scores = score(task=RaisingVerify(ArithParams(num_operands=3, operators="+-*")))
    assert scores.outcome == OUTCOME == scores.shaped
    assert scores.failed == {"verifier": 1}
    assert scores.reasons == {"verifier": "IndexError: list index out of range"}


class Unconvertible:
    def __float__(self) -> float:
        raise RuntimeError("its __float__ broke")


def batched(returns: Callable[[int], Any]) -> Callable[..., Any]:
    def reward(
        completions: list[str], examples: Any, lengths: Any, context: Any, params: Any
    ) -> Any:
        return returns(len(completions))

    return reward


@pytest.mark.parametrize(
    ("returns", "reason"),
    [
        (lambda n: [1.0] * (n // 0), "ZeroDivisionError: integer division or modulo by zero"),
        (lambda n: [GOOD] * (n - 1), "returned 3 values for 4 rollouts"),
        (lambda n: [GOOD] * (n + 1), "returned 5 values for 4 rollouts"),
        (lambda n: None, "returned None (NoneType), not a list of 4 numbers"),
        (lambda n: "1234", "returned '1234' (str), not a list of 4 numbers"),
    ],
    ids=["raises", "one_short", "one_over", "none", "str"],
)
def test_a_batched_reward_that_raises_or_returns_the_wrong_count_fails_its_whole_batch(
    register: Register, returns: Callable[[int], Any], reason: str
) -> None:
    register(batched(returns), batched=True)
    scores = score(NAME)
    assert scores.parts[NAME] == [0.0] * 4
    assert scores.outcome == OUTCOME == scores.shaped
    assert scores.failed == {NAME: 4}
    assert scores.reasons[NAME] == reason


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (math.nan, "returned nan (float), not a finite number"),
        (math.inf, "returned inf (float), not a finite number"),
        (None, "returned None (NoneType), not a finite number"),
        ("0.5", "returned '0.5' (str), not a finite number"),
        (Unconvertible(), "RuntimeError: its __float__ broke"),
    ],
    ids=["nan", "inf", "none", "str", "float_raises"],
)
def test_a_batched_rewards_value_that_is_no_finite_number_fails_its_rollout_alone(
    register: Register, bad: Any, reason: str
) -> None:
    register(batched(lambda n: [GOOD, bad, GOOD, GOOD]), batched=True)
    assert_only_the_bad_rollout_failed(score(NAME), reason)


def test_a_batched_reward_may_return_a_tensor(register: Register) -> None:
    register(batched(lambda n: torch.full((n,), GOOD)), batched=True)
    scores = score(NAME)
    assert scores.parts[NAME] == [GOOD] * 4 and scores.failed == {}


@pytest.mark.parametrize("is_batched", [False, True], ids=["per_rollout", "batched"])
@pytest.mark.parametrize(
    "error",
    [Abandoned("the run was abandoned"), torch.OutOfMemoryError("CUDA out of memory")],
    ids=["abandoned", "device_out_of_memory"],
)
def test_a_cancel_or_the_device_out_of_memory_inside_a_reward_ends_the_step(
    register: Register, error: Exception, is_batched: bool
) -> None:
    # A batched reward reads the policy (info_gain): the forward pass asks stopping.check()
    # between layers, and may run out of device memory; neither is the rollouts' failure.
    def reward(*args: Any) -> Any:
        raise error

    register(reward, batched=is_batched)
    with pytest.raises(type(error)):
        score(NAME)


def test_a_step_says_what_share_of_its_rollouts_lost_a_reward(
    register: Register, model_store: Any, tmp_path: Any
) -> None:
    """The run, not only its log, says how many rollouts lost a reward (issue 51): a reward
    that fails on the answers that are no number (the tiny model's answers are mostly numbers,
    but the reward says no to those with a 7 in them too) shows in batch/reward_lost as
    exactly the share of the step's rollouts it failed on."""

    def picky(completion: str, example: Example, context: RewardContext, params: Any) -> float:
        if "7" in completion:
            raise ValueError("no sevens")
        return 0.0

    register(picky)
    cfg = RunConfig.model_validate({
        "steps": 1, "model": {"name": "tiny-arith"}, "eval": {"every": 0},
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 2},
        "sampling": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 4},
        "rewards": [{"name": NAME, "weight": WEIGHT}],
    })  # fmt: skip
    state = setup(cfg, model_store)
    drawn = sample_groups(state, state.task.train_prompts(random.Random(1), 8), 5)
    texts = state.tokenizer.batch_decode(drawn.batch.response_ids, skip_special_tokens=True)
    expected = [("7" in t) for t in texts]
    assert drawn.reward_lost is not None and drawn.reward_lost.tolist() == expected

    sink = MemorySink()
    train(cfg, sink, workdir=tmp_path, model_store=model_store)
    lost = sink.steps[1].metrics[M.BATCH_REWARD_LOST]
    assert 0 <= lost <= 1 and (lost * 32).is_integer()
