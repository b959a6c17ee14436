"""The ``judge`` reward and the judge half of the model helper (conspo.models.scoring): the
score parser on hand-written judge texts, the aggregates, and the reward on real tiny causal LMs
— a scripted judge (tests/conspo/judge_models.py) whose texts are known, and tiny-chat, whose
texts are junk: k judgements drawn per rollout, deterministic for a seed, values in [0, 1] or
the rollout failed with a reason quoting the judge; critiques cut by max_new_tokens; a timeout
fails the batch naming timeout_s; a cancel ends the step; a bad name fails set-up at its field."""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from conspo import metrics as M
from conspo import stopping
from conspo.access import Unavailable
from conspo.config import RunConfig
from conspo.generation import rollout
from conspo.generation.batch import RolloutBatch
from conspo.models.scoring import ModelScorers
from conspo.rewards import RewardContext, build_rewards, score_rollouts
from conspo.rewards.judge import (
    DEFAULT_RUBRIC,
    JudgeParams,
    aggregate,
    judge_prompt,
    parse_score,
    score_line,
)
from conspo.sink import MemorySink
from conspo.tasks.arith import ArithParams, ArithTask
from conspo.tasks.base import Example
from conspo.training import loop, trainer
from conspo.training.rollouts import Rollouts, concat_rollouts, keep_groups
from tests.conspo.judge_models import build_scripted_judge

CPU = torch.device("cpu")
TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 4}
ARITH = ArithTask(ArithParams(digits=1, num_operands=2))
PROMPTS = ["1+2=", "7-3=", "5+5=", "2+2=", "9-1=", "3+4=", "6-6=", "8+1="]
COMPLETIONS = ["3", "4", "10", "4", "8", "7", "0", "9"]
EXAMPLES = [Example(p, "", {"value": eval(p[:-1])}) for p in PROMPTS]  # noqa: S307
SCRIPT = ["Score: 7", "Score: 3", "Nil!"]  # drawn 1/4, 1/4, 1/2 (the branch is at "S" / "N")


# ------------------------------------------------------------------------------------------------
# Parsing and aggregating judgements (hand-written texts)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Looks right.\nScore: 8", 8.0),
        ("Score: 2\nOn reflection it is right.\nScore: 9", 9.0),  # the last one wins
        ("Final: 7/10", None),  # no "Score"
        ("Score: 7/10", 7.0),
        ("score : 8", 8.0),
        ("SCORE:6.5", 6.5),
        ("**Score:** 4", 4.0),
        ("Score: 4/5", 8.0),  # four out of five, on the 0..10 scale
        ("The answer is fine, I would give it a high mark.", None),
        ("Score: 11", None),  # above max_score
        ("Score: -1", None),
        ("Score: 12/10", None),
        ("Score: 3/0", None),
        ("Score: 0", 0.0),
        ("Score: 10", 10.0),
    ],
)
def test_parse_score(text: str, expected: float | None) -> None:
    assert parse_score(text, 10) == expected


def test_aggregates() -> None:
    assert aggregate([7, 3, 8], "mean") == pytest.approx(6)
    assert aggregate([7, 3, 8, 9], "median") == 7.5
    assert aggregate([7, 3, 7], "majority") == 7
    assert aggregate([2, 8, 5], "majority") == 5  # a three-way tie: the median of the tied
    assert aggregate([3], "majority") == 3


def test_the_prompt_fills_each_placeholder_once() -> None:
    prompt = judge_prompt(DEFAULT_RUBRIC, "What is {answer}?", "It is {question}", 10)
    assert "Question:\nWhat is {answer}?" in prompt and "Answer:\nIt is {question}" in prompt
    assert "from 0 (wrong) to 10" in prompt


def test_a_rubric_without_its_placeholders_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as refused:
        RunConfig.model_validate({
            "task": TASK,
            "rewards": [{"name": "judge", "params": {"model": "tiny-chat",
                                                     "rubric": "Grade {question}"}}],
        })  # fmt: skip
    error = refused.value.errors()[0]
    assert error["loc"][-1] == "rubric" and "{answer}" in error["msg"]


# ------------------------------------------------------------------------------------------------
# The reward on real tiny judges
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted(model_store: Any, tmp_path_factory: Any) -> Path:
    return build_scripted_judge(
        model_store.resolve("tiny-chat"), tmp_path_factory.mktemp("judge") / "scripted", SCRIPT
    )


@pytest.fixture
def models(model_store: Any) -> ModelScorers:
    return ModelScorers(model_store.resolve, CPU, torch.float32)


def judged(models: ModelScorers, model: str, **params: Any) -> Any:
    """``score_rollouts`` with the verifier and the judge ``model``, on the 8 answers."""
    cfg = RunConfig.model_validate({
        "task": TASK,
        "rewards": [{"name": "verifier"},
                    {"name": "judge", "params": {"model": model, **params}}],
    })  # fmt: skip
    context = RewardContext(ARITH, 16, group_size=2, models=models)
    return score_rollouts(build_rewards(cfg.rewards), COMPLETIONS, EXAMPLES, [1] * 8, context)


def test_k_judgements_per_rollout_aggregate_into_its_value(scripted, models):
    params = JudgeParams(model=str(scripted), samples=5, temperature=1.0)
    pairs = zip(PROMPTS, COMPLETIONS, strict=True)
    prompts = [judge_prompt(params.rubric, p, c, 10) for p, c in pairs]
    texts = models.generate(str(scripted), prompts, samples=5, temperature=1.0,
                            max_new_tokens=256, max_prompt_tokens=2048, batch_size=16,
                            deadline=time.monotonic() + 600, seed=0)  # fmt: skip
    assert [len(t) for t in texts] == [5] * 8
    drawn = Counter(t for ts in texts for t in ts)
    assert set(drawn) <= set(SCRIPT) and len(drawn) == 3  # every scripted text, nothing else
    scores = judged(models, str(scripted), samples=5, temperature=1.0)
    values = scores.parts["judge"]
    for ts, value in zip(texts, values, strict=True):
        parsed = [7.0 if t == "Score: 7" else 3.0 for t in ts if t != "Nil!"]
        assert value == pytest.approx(sum(parsed) / len(parsed) / 10 if parsed else 0.0)
    assert scores.critiques == [ts[0] for ts in texts]  # the first judgement, kept
    assert len(set(values)) > 1 and all(0 <= v <= 1 for v in values)


def test_the_same_seed_draws_the_same_judgements_another_seed_others(scripted, models):
    first = judged(models, str(scripted), temperature=1.0)
    again = judged(models, str(scripted), temperature=1.0)
    other = judged(models, str(scripted), temperature=1.0, seed=7)
    assert first.parts["judge"] == again.parts["judge"]
    assert first.critiques == again.critiques
    assert other.critiques != first.critiques


@pytest.mark.parametrize("how", ["median", "majority"])
def test_median_and_majority_read_the_parsed_scores(scripted, models, how):
    scores = judged(models, str(scripted), samples=5, temperature=1.0, aggregate=how)
    assert {round(v * 10, 6) for v in scores.parts["judge"]} <= {0.0, 3.0, 5.0, 7.0}


def test_a_rollout_whose_judgements_all_fail_to_parse_fails_quoting_the_judge(scripted, models):
    """One judgement each (k=1): half the rollouts draw "Nil!", which has no score."""
    scores = judged(models, str(scripted), samples=1, temperature=1.0)
    junk = [c == "Nil!" for c in scores.critiques]
    assert 0 < sum(junk) < 8
    assert scores.failed == {"judge": sum(junk)}
    assert "no score in range in 1 judgements" in scores.reasons["judge"]
    assert "the first: 'Nil!'" in scores.reasons["judge"]
    assert scores.lost == junk
    for lost, value in zip(junk, scores.parts["judge"], strict=True):
        assert value in ((0.0,) if lost else (0.3, 0.7))
    assert scores.outcome == [1.0] * 8  # the verifier scored every one


def test_an_over_long_critique_is_cut_at_max_new_tokens(scripted, models):
    """ "Score: 7" is 7 tokens: at 4 the judge writes "Scor" and stops there, no score."""
    scores = judged(models, str(scripted), samples=2, temperature=0.0, max_new_tokens=4)
    assert all(c is not None and len(c) <= 4 for c in scores.critiques)
    assert scores.failed["judge"] + scores.critiques.count("Nil!") >= 1


def test_a_junk_writing_judge_scores_in_range_or_fails_with_its_text(models):
    """tiny-chat is random weights: whatever it writes, each rollout's value is in [0, 1] or
    the rollout failed, its reason quoting what the judge wrote."""
    scores = judged(models, "tiny-chat", samples=2, max_new_tokens=24, temperature=1.0)
    values = scores.parts["judge"]
    assert all(math.isfinite(v) and 0 <= v <= 1 for v in values)
    assert scores.failed  # what a random model writes has no "Score: N"
    reason = scores.reasons["judge"]
    assert "judge 'tiny-chat' gave no score in range in 2 judgements" in reason
    first_failed = scores.critiques[scores.lost.index(True)]
    assert first_failed and repr(first_failed[:20])[:-1] in reason  # quoting what it wrote


def test_a_timeout_fails_the_batch_naming_timeout_s(scripted, models):
    judge = models.load_judge(str(scripted))
    ran = []

    def slow(module, args, output):
        ran.append(module)
        time.sleep(0.3)

    layers = list(judge.model.model.layers)
    handles = [layer.register_forward_hook(slow) for layer in layers]
    try:
        scores = judged(models, str(scripted), timeout_s=0.1)
    finally:
        for h in handles:
            h.remove()
    assert scores.failed == {"judge": 8}
    reason = scores.reasons["judge"]
    assert "ran past timeout_s (0.1 s)" in reason and str(scripted) in reason
    assert len(ran) == 1 < len(layers)  # the prefill's second layer never started
    assert scores.outcome == [1.0] * 8


def test_a_cancel_while_judging_ends_the_step_between_decode_steps(scripted, models, monkeypatch):
    drawn: list[int] = []
    draw = rollout._draw  # every token the native sampler draws goes through it

    def counted(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        drawn.append(1)
        return draw(*args, **kwargs)

    monkeypatch.setattr(rollout, "_draw", counted)
    with stopping.abandon_when(lambda: len(drawn) >= 2), pytest.raises(stopping.Abandoned):
        judged(models, str(scripted), samples=2)
    assert len(drawn) == 2  # the first batch's second token: not after its 256


def rl_config(judge: str, **params: Any) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 1,
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "rewards": [{"name": "verifier"},
                    {"name": "judge", "params": {"model": judge, "temperature": 1.0,
                                                 **params}}],
    })  # fmt: skip


def test_a_judge_the_sources_cannot_load_fails_set_up_at_its_field(model_store):
    with pytest.raises(Unavailable) as refused:
        loop.setup(rl_config("/no/such/judge"), model_store)
    assert "rewards[1].params.model '/no/such/judge'" in str(refused.value)


def test_one_training_step_logs_the_judges_reward(model_store, scripted, tmp_path):
    sink = MemorySink()
    trainer.train(rl_config(str(scripted)), sink, workdir=tmp_path / "judge",
                  model_store=model_store)  # fmt: skip
    m = sink.steps[1].metrics
    value = m[M.reward_key("judge")]
    assert 0 <= value <= 0.7  # each rollout's is 0 (lost), or between 0.3 and 0.7
    assert 0 <= m[M.BATCH_REWARD_LOST] <= 1
    # each sampled rollout carries its judge's first judgement to the sink
    critiques = [r.critique for r in sink.steps[1].rollouts]
    assert critiques and set(critiques) <= set(SCRIPT)


def few_rollouts(critiques: list[str | None] | None, n: int = 4) -> Rollouts:
    """``n`` rollouts in groups of 2, token ids all 0: only their rows and critiques matter."""
    batch = RolloutBatch(
        torch.zeros(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
        torch.zeros(n, 3, dtype=torch.long), torch.ones(n, 3),
        torch.full((n,), 3), torch.zeros(n, dtype=torch.bool),
    )  # fmt: skip
    ids = torch.arange(n // 2).repeat_interleave(2)
    return Rollouts(batch, torch.zeros(n), torch.zeros(n), ids, n, critiques=critiques)


def test_critiques_follow_their_rollouts_through_kept_groups_and_refill_rounds():
    first = keep_groups(few_rollouts(["a0", "a1", "a2", "a3"]), torch.tensor([False, True]), 2)
    assert first.critiques == ["a2", "a3"]
    merged = concat_rollouts([first, few_rollouts(None)], 2, pad_id=0)
    assert merged.critiques == ["a2", "a3", None, None, None, None]
    assert concat_rollouts([few_rollouts(None)] * 2, 2, pad_id=0).critiques is None
    assert keep_groups(merged, torch.tensor([True, False, True]), 2).critiques == [
        "a2", "a3", None, None,
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Vector judges: named dimensions, each logged, combined by weight
# ------------------------------------------------------------------------------------------------

VECTOR = {"dimensions": [{"name": "correctness", "weight": 2}, {"name": "clarity"}]}


class HandWrittenJudgements:
    """What a judge wrote, by hand (the texts a vector judge may give, which a tiny model cannot
    be scripted to write): ``generate`` hands them out in order, k per prompt, and keeps the
    prompts it was asked."""

    def __init__(self, texts: list[list[str]]) -> None:
        self.texts = texts
        self.asked: list[str] = []

    def score(self, *args: Any, **kwargs: Any) -> list[float]:
        raise AssertionError("a judge generates")

    def generate(self, name: str, prompts: Any, **kwargs: Any) -> list[list[str]]:
        self.asked += prompts
        assert len(prompts) == len(self.texts) and kwargs["samples"] == len(self.texts[0])
        return self.texts


def test_a_dimensions_score_is_its_own_line_read_as_a_whole_word() -> None:
    text = "incorrectness: 1\nCorrectness : 8/10\nclarity: 4\ncorrectness: 6"
    assert parse_score(text, 10, score_line("correctness")) == 6.0  # the last, not "incorrect…"
    assert parse_score("incorrectness: 1", 10, score_line("correctness")) is None
    assert parse_score(text, 10, score_line("clarity")) == 4.0
    assert parse_score(text, 10) is None  # no "Score" line at all


def test_a_vector_judges_dimensions_are_logged_and_weighed_into_its_value() -> None:
    texts = [
        ["Right.\ncorrectness: 8\nclarity: 2", "correctness: 6"],  # clarity from one of two
        ["correctness: 10\nclarity: 10", "correctness: 10\nclarity: 10"],
        ["Fine.\nScore: 9", "correctness: 4"],  # no clarity anywhere: the rollout fails
    ]
    models = HandWrittenJudgements(texts)
    cfg = RunConfig.model_validate({
        "task": TASK,
        "rewards": [{"name": "verifier"},
                    {"name": "judge", "params": {"model": "tiny-chat", "samples": 2, **VECTOR}}],
    })  # fmt: skip
    context = RewardContext(ARITH, 16, group_size=1, models=models)  # type: ignore[arg-type]
    scores = score_rollouts(
        build_rewards(cfg.rewards), COMPLETIONS[:3], EXAMPLES[:3], [1] * 3, context
    )
    assert scores.parts["judge.correctness"] == pytest.approx([0.7, 1.0, 0.0])
    assert scores.parts["judge.clarity"] == pytest.approx([0.2, 1.0, 0.0])
    assert scores.parts["judge"] == pytest.approx([(2 * 0.7 + 0.2) / 3, 1.0, 0.0])
    assert scores.failed == {"judge": 1} and scores.lost == [False, False, True]
    assert "no score in range for 'clarity' in 2 judgements" in scores.reasons["judge"]
    assert "the first: 'Fine.\\nScore: 9'" in scores.reasons["judge"]
    # the default rubric asks for one line per dimension
    assert models.asked[0].endswith("(best):\ncorrectness: N\nclarity: N")
    assert scores.shaped == pytest.approx([1 + v for v in scores.parts["judge"]])


@pytest.mark.parametrize(
    ("dimensions", "message"),
    [
        ([{"name": "clarity"}, {"name": "Clarity"}], "each name once"),
        ([{"name": "a", "weight": 0}], "a weight above 0"),
        ([{"name": "has space"}], "should match pattern"),
    ],
)
def test_bad_dimensions_are_refused_at_the_field(dimensions: Any, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        RunConfig.model_validate({
            "task": TASK,
            "rewards": [{"name": "judge", "params": {"model": "tiny-chat",
                                                     "dimensions": dimensions}}],
        })  # fmt: skip
    error = refused.value.errors()[0]
    assert error["loc"][:3] == ("rewards", 0, "params") and message in error["msg"]


def test_a_training_step_logs_each_dimension(model_store, scripted, tmp_path):
    """The scripted judge writes "Score: 7" or "Score: 3": a one-dimension vector judge whose
    dimension is named Score logs reward/judge.Score, equal to the reward (one weight)."""
    cfg = rl_config(str(scripted), dimensions=[{"name": "Score"}])
    sink = MemorySink()
    trainer.train(cfg, sink, workdir=tmp_path / "vector", model_store=model_store)
    m = sink.steps[1].metrics
    assert m["reward/judge.Score"] == pytest.approx(m[M.reward_key("judge")])
    assert 0 <= m["reward/judge.Score"] <= 0.7
