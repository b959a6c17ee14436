"""Reward functions (conspo.rewards): each built-in by hand, the shaped sum, the config's
checks, and a short run that logs reward/<name> while positives stay the verified outcome."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from pydantic import ValidationError

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.generation.rollout import encode_prompts
from conspo.registry import reward_names
from conspo.rewards import RewardContext, build_rewards, score_rollouts
from conspo.rewards.format import PATTERN_TIMEOUT_S, has_one_boxed_answer, matches
from conspo.rewards.info_gain import (
    InfoGainParams,
    answer_span,
    group_normalised,
    info_gain_reward,
)
from conspo.sink import MemorySink
from conspo.tasks.arith import ArithParams, ArithTask, intermediate_results
from conspo.tasks.base import Example
from conspo.training import loop, rollouts, trainer

ARITH = ArithTask(ArithParams(num_operands=3, operators="+-*"))
# "3*4+7=": intermediate results 12 then 19.
EXAMPLE = Example("3*4+7=", "19", {"value": 19, "steps": [12, 19]})
TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 8}
SHAPED = [
    {"name": "format", "weight": 0.5, "params": {"pattern": r"-?\d+"}},
    {"name": "length", "weight": 2.0, "params": {"buffer": 2}},
    {"name": "process"},
]


def one_reward(name: str, completion: str, length: int = 1, max_new_tokens: int = 6, **params):
    spec = RunConfig.model_validate({
        "task": TASK,
        "sampling": {"max_new_tokens": max_new_tokens},
        "rewards": [{"name": name, "params": params}],
    }).rewards  # fmt: skip
    [reward] = [r for r in build_rewards(spec) if r.name == name]
    context = RewardContext(ARITH, max_new_tokens, length)
    return reward.fn(completion, EXAMPLE, context, reward.params)


def test_verifier_is_the_tasks_verify():
    assert one_reward("verifier", "19") == 1.0
    assert one_reward("verifier", " 19 ") == 1.0
    assert one_reward("verifier", "18") == 0.0
    assert one_reward("verifier", "19 apples") == 0.0


def test_format_checks_one_boxed_answer_or_a_regex():
    assert has_one_boxed_answer("so \\boxed{\\frac{1}{2}}.")
    assert not has_one_boxed_answer("\\boxed{1} and \\boxed{2}")
    assert not has_one_boxed_answer("\\boxed{1")  # never closed
    assert not has_one_boxed_answer("19")
    assert one_reward("format", "x \\boxed{19}") == 1.0
    assert one_reward("format", "19") == 0.0
    assert one_reward("format", " -19\n", pattern=r"-?\d+") == 1.0  # whitespace stripped
    assert one_reward("format", "19 apples", pattern=r"-?\d+") == 0.0  # the whole completion


@pytest.mark.parametrize(
    ("length", "expected"),
    # max_new_tokens 6, buffer 2: no penalty up to 4 tokens, then -1/2 per token down to -1.
    [(1, 0.0), (4, 0.0), (5, -0.5), (6, -1.0)],
)
def test_length_is_dapos_soft_overlong_penalty(length, expected):
    assert one_reward("length", "19", length=length, buffer=2) == expected


def test_process_is_the_share_of_intermediate_results_written():
    assert intermediate_results("3*4+7") == [12, 19]
    assert intermediate_results("2+3*4-1") == [12, 14, 13]
    assert one_reward("process", "19") == 0.5  # the answer: the last of two results
    assert one_reward("process", "12") == 0.5  # the product right, the sum not done
    assert one_reward("process", "12, 19") == 1.0
    assert one_reward("process", "12 19 1 2") == 0.5  # 2 of 4 numbers written: no spraying
    assert one_reward("process", "twelve") == 0.0
    sampled = ARITH.sample(random.Random(0))
    assert ARITH.process_reward(sampled.answer, sampled) == 1 / len(sampled.data["steps"])


def test_the_shaped_reward_is_the_weighted_sum_and_the_outcome_the_verifier():
    cfg = RunConfig.model_validate(
        {"task": TASK, "sampling": {"max_new_tokens": 6}, "rewards": SHAPED}
    )
    assert [(r.name, r.weight) for r in cfg.rewards] == [
        ("verifier", 1.0),  # added first
        ("format", 0.5),
        ("length", 2.0),
        ("process", 0.2),  # RLVP's default β
    ]
    rewards = build_rewards(cfg.rewards)
    texts, lengths = ["19", "12", "19 apples", "7"], [3, 3, 6, 5]
    scores = score_rollouts(rewards, texts, [EXAMPLE] * 4, lengths, RewardContext(ARITH, 6))
    assert scores.outcome == [1.0, 0.0, 0.0, 0.0]
    assert scores.parts["format"] == [1.0, 1.0, 0.0, 1.0]
    assert scores.parts["length"] == [0.0, 0.0, -1.0, -0.5]
    assert scores.parts["process"] == [0.5, 0.5, 0.5, 0.0]
    expected = [1 + 0.5 + 0.1, 0.5 + 0.1, -2.0 + 0.1, 0.5 - 1.0]
    assert scores.shaped == pytest.approx(expected)


def error_of(data: dict) -> tuple[tuple, str]:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate({"task": TASK, **data})
    [error] = info.value.errors()
    return error["loc"], error["msg"]


@pytest.mark.parametrize(
    ("rewards", "loc", "words"),
    [
        ([{"name": "nope"}], ("rewards", 0, "name"), "valid rewards: " + ", ".join(reward_names())),
        ([{"name": "format", "params": {"pattern": "("}}], ("rewards", 0, "params", "pattern"),
         "not a regular expression"),
        ([{"name": "length", "params": {"bufer": 2}}], ("rewards", 0, "params", "bufer"),
         "Extra inputs"),
        ([{"name": "length", "params": {"buffer": 16}}], ("rewards", 0, "params", "buffer"),
         "smaller than sampling.max_new_tokens"),
        ([{"name": "format"}, {"name": "format"}], ("rewards", 1, "name"), "listed twice"),
        ([{"name": "format", "weight": float("nan")}], ("rewards", 0, "weight"), "finite"),
        ([{"name": "format", "weight": 1e300}], ("rewards", 0, "weight"), "less than or equal"),
    ],
)  # fmt: skip
def test_a_bad_reward_is_refused_at_its_field(rewards, loc, words):
    got_loc, message = error_of({"rewards": rewards})
    assert got_loc == loc and words in message, (got_loc, message)


def test_the_process_reward_needs_a_task_with_a_process_signal(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    data = {"task": {"name": "jsonl", "params": {"path": str(tmp_path / "p.jsonl")}}}
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate({**data, "rewards": [{"name": "process"}]})
    [error] = info.value.errors()
    assert error["loc"] == ("rewards", 0, "name") and "process_reward()" in error["msg"]


def test_the_objectives_overlong_params_are_the_length_reward():
    """params.overlong_buffer / overlong_penalty keep working: moved onto a length reward."""
    cfg = RunConfig.model_validate(
        {"algorithm": "grpo", "params": {"overlong_buffer": 4, "overlong_penalty": 0.5}}
    )
    assert [(r.name, r.weight, r.params) for r in cfg.rewards] == [
        ("verifier", 1.0, {}),
        ("length", 0.5, {"buffer": 4}),
    ]
    assert RunConfig.model_validate(cfg.model_dump()) == cfg  # a stored config round-trips
    # The params stay: a config without the rewards list (the web form's) derives it again.
    without_rewards = {k: v for k, v in cfg.model_dump().items() if k != "rewards"}
    assert RunConfig.model_validate(without_rewards) == cfg
    dapo = RunConfig.model_validate({"algorithm": "dapo"})  # DAPO's default buffer, 8
    assert [(r.name, r.params) for r in dapo.rewards][1] == ("length", {"buffer": 8})
    # A listed length reward takes precedence over DAPO's default buffer, saved as 0 ...
    listed = [{"name": "length", "params": {"buffer": 3}}]
    own = RunConfig.model_validate({"algorithm": "dapo", "rewards": listed})
    assert [(r.name, r.params) for r in own.rewards][1] == ("length", {"buffer": 3})
    assert own.params["overlong_buffer"] == 0
    assert RunConfig.model_validate(own.model_dump()) == own
    # ... and beside an explicit buffer it is an error: which one was meant?
    loc, message = error_of({"algorithm": "dapo", "params": {"overlong_buffer": 4},
                             "rewards": listed})  # fmt: skip
    assert loc == ("params", "overlong_buffer") and "rewards.0 (length)" in message


def test_sample_groups_gives_the_objective_the_shaped_sum(model_store, arith_base):
    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "rewards": SHAPED,
    })  # fmt: skip
    state = loop.setup(cfg, model_store)
    prompts = state.task.train_prompts(random.Random(0), 4)
    r = rollouts.sample_groups(state, prompts, seed=1)
    parts = r.reward_parts
    assert set(parts) == {"verifier", "format", "length", "process"}
    weighted = sum(w * parts[n] for n, w in [("verifier", 1), ("format", 0.5),
                                             ("length", 2), ("process", 0.2)])  # fmt: skip
    torch.testing.assert_close(r.rewards, weighted)
    torch.testing.assert_close(r.correct, parts["verifier"])  # positives: the outcome alone


def short_run(model_store, tmp_path, rewards: list[dict]) -> dict[str, float]:
    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 2,
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "rewards": rewards,
    })  # fmt: skip
    sink = MemorySink()
    trainer.train(cfg, sink, workdir=tmp_path, model_store=model_store)
    return sink.steps


def test_a_shaped_run_logs_each_reward_and_keeps_its_positives(model_store, arith_base, tmp_path):
    shaped = short_run(model_store, tmp_path / "shaped", SHAPED)
    plain = short_run(model_store, tmp_path / "plain", [])
    for step in (1, 2):
        m = shaped[step].metrics
        for name in ("verifier", "format", "length", "process"):
            assert M.pattern(M.reward_key(name)) is not None
        assert m[M.reward_key("verifier")] == pytest.approx(m[M.BATCH_PASS_RATE])
        assert 0 <= m[M.reward_key("format")] <= 1 and -1 <= m[M.reward_key("length")] <= 0
        assert 0 <= m[M.reward_key("process")] <= 1
        assert set(plain[step].metrics) & {k for k in m if k.startswith("reward/")} == {
            M.reward_key("verifier")
        }
    # Step 1 samples the same rollouts from the same start: shaping moves the loss, never who is
    # positive (pass rate, group mix, lengths and scores by outcome all agree).
    a, b = shaped[1].metrics, plain[1].metrics
    for key in (M.BATCH_PASS_RATE, M.BATCH_VALID_GROUPS, M.BATCH_ALL_POS_GROUPS, M.LEN_POS,
                M.LEN_NEG, M.SEP_GAP, M.SEP_ORDER_ACC):  # fmt: skip
        assert a[key] == pytest.approx(b[key], nan_ok=True), key
    assert a[M.LOSS] != pytest.approx(b[M.LOSS])
    assert [r.reward for r in shaped[1].rollouts] == [r.reward for r in plain[1].rollouts]


# ------------------------------------------------------------------------------------------
# ISPO's sequence signal: the info_gain reward (designed from the abstract, §5.2)
# ------------------------------------------------------------------------------------------


def test_answer_span_and_group_normalisation_by_hand():
    assert answer_span("so 3+4 = \\boxed{7}.") == (16, 17)
    assert answer_span("\\boxed{\\frac{1}{2}} x") == (7, 18)
    assert answer_span("3+4 gives 7, then 8") == (18, 19)  # the last number
    assert answer_span("\\boxed{}") is None and answer_span("none") is None
    # Groups of 2: [1, 3] → mean 2, std 1; [5, 5] has no spread → 0.
    assert group_normalised([1.0, 3.0, 5.0, 5.0], 2) == [-1.0, 1.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def arith_state(model_store, arith_base):
    cfg = RunConfig.model_validate({
        "algorithm": "ispo",
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "rewards": [{"name": "info_gain"}],
    })  # fmt: skip
    return loop.setup(cfg, model_store)


def manual_mean_logprob(state, prompt: str, context: str, answer: str) -> float:
    """log π(answer | prompt + context) from one plain forward over the concatenated ids."""
    tok, model = state.tokenizer, state.model
    encode = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    head, tail = encode(prompt) + encode(context), encode(answer)
    with torch.no_grad():
        logits = model(torch.tensor([head + tail])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)  # sampling temperature 1
    picked = [logprobs[len(head) + j - 1, t] for j, t in enumerate(tail)]
    return float(sum(picked) / len(picked))


def test_info_gain_is_the_answers_log_prob_gain_from_the_reasoning(arith_state):
    state = arith_state
    prompts = ["3+4=", "3+4=", "2+2=", "2+2="]
    ids, mask = encode_prompts(state.tokenizer, prompts, state.device)
    completions = ["3+4 makes \\boxed{7}", "7", "2+2=4 so 4", "1+1=2 so 5"]
    examples = [Example(p, "") for p in prompts]
    score = functools.partial(rollouts.continuation_logprobs, state, ids, mask)
    got = score([0, 2], ["3+4 makes \\boxed{", "2+2=4 so "], ["7", "4"])
    expected = [manual_mean_logprob(state, "3+4=", "3+4 makes \\boxed{", "7"),
                manual_mean_logprob(state, "2+2=", "2+2=4 so ", "4")]  # fmt: skip
    assert got == pytest.approx(expected, abs=1e-5)
    context = RewardContext(state.task, 6, group_size=2, continuation_logprob=score)
    raw = info_gain_reward(
        completions, examples, [1] * 4, context, InfoGainParams(normalise="none")
    )
    gains = [
        manual_mean_logprob(state, p, c[: answer_span(c)[0]], c[slice(*answer_span(c))])
        - manual_mean_logprob(state, p, "", c[slice(*answer_span(c))])
        for p, c in zip(prompts, completions, strict=True)
    ]
    gains[1] = 0.0  # a bare answer: no reasoning, no signal
    assert raw == pytest.approx(gains, abs=1e-5)
    normalised = info_gain_reward(completions, examples, [1] * 4, context, InfoGainParams())
    assert normalised == pytest.approx(group_normalised(raw, 2))


def test_ispo_with_its_sequence_signal_trains(model_store, arith_base, tmp_path):
    cfg = RunConfig.model_validate({
        "algorithm": "ispo",
        "steps": 2,
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "optim": {"mini_batches": 2},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "rewards": [{"name": "info_gain"}],
    })  # fmt: skip
    sink = MemorySink()
    trainer.train(cfg, sink, workdir=tmp_path, model_store=model_store)
    for step in (1, 2):
        m = sink.steps[step].metrics
        # arith's completions are bare answers: no reasoning, so no information gain.
        assert m[M.reward_key("info_gain")] == 0.0
        assert 0 <= m[M.ISPO_HINGE_ACTIVE] <= 1 and m[M.OPTIM_UPDATES] >= 1


# A pattern that backtracks exponentially even in the ``regex`` package (which sees through
# the issue's "(.+)+#" at once): the match must fail within the timeout, not hang the step.
EXPONENTIAL = r"(?:.|..)+\Z(?<=#)"


def test_a_backtracking_pattern_fails_the_reward_within_its_timeout_without_holding_the_gil(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading
    import time

    from conspo.config import RewardConfig

    rewards = build_rewards(
        [
            RewardConfig(name="verifier"),
            RewardConfig(name="format", params={"pattern": EXPONENTIAL}),
        ]
    )
    texts = ["ab" * 30, "x" * 50, "19", "#"]
    ticks = 0
    done = threading.Event()

    def tick() -> None:  # stands for the worker's heartbeat thread
        nonlocal ticks
        while not done.wait(0.01):
            ticks += 1

    threading.Thread(target=tick, daemon=True).start()
    started = time.monotonic()
    scores = score_rollouts(rewards, texts, [EXAMPLE] * 4, [4] * 4, RewardContext(ARITH, 6))
    elapsed = time.monotonic() - started
    done.set()
    assert scores.parts["format"] == [0.0, 0.0, 0.0, 1.0]  # the short ones match or not at once
    assert scores.failed == {"format": 2}
    assert elapsed < 2 * 10 * PATTERN_TIMEOUT_S  # two timeouts, with a wide margin
    assert ticks >= elapsed / 0.01 / 4  # the other thread ran during the matches
    assert "reward format failed on 2 of 4 rollouts" in caplog.text


def test_the_issues_redos_pattern_is_matched_at_once() -> None:
    assert not matches("(.+)+#", "a" * 10_000)
