"""The ``reward_model`` reward and the score-model helper it calls (conspo.models.scoring), on
tiny reward models built here (a built-in body, a one-label head): its scores are the model's
own, split into bounded batches, normalised within groups; a NaN fails those rollouts alone, a
timeout or a bad name fails with a reason naming it, a cancel ends the step; and one real
training step shapes its reward with it."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from conspo import metrics as M
from conspo import stopping
from conspo.access import Unavailable
from conspo.config import RunConfig
from conspo.generation.tool_rollout import verified_texts
from conspo.models.scoring import ModelScorers
from conspo.rewards import RewardContext, build_rewards, score_rollouts
from conspo.rewards.info_gain import group_normalised
from conspo.rewards.reward_model import RewardModelParams, reward_model_reward
from conspo.sink import MemorySink
from conspo.tasks.arith import ArithParams, ArithTask
from conspo.tasks.base import Example
from conspo.training import loop, rollouts, trainer
from tests.conspo.score_models import build_reward_model

CPU = torch.device("cpu")
TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 4}
ARITH = ArithTask(ArithParams(digits=1, num_operands=2))
PROMPTS = ["1+2=", "1+2=", "7-3=", "7-3=", "5+5=", "5+5="]
COMPLETIONS = ["3", "4 I think", "4", "10", "10, since 5+5 is ten", "1"]
EXAMPLES = [Example(p, "", {"value": eval(p[:-1])}) for p in PROMPTS]  # noqa: S307
NAN_TEXT = "!"  # the NaN reward model's poisoned character


@pytest.fixture(scope="module")
def reward_models(model_store: Any, tmp_path_factory: Any) -> dict[str, Path]:
    """Reward models on the character tokenizer (tiny: no chat template) and on the BPE one with
    Qwen's chat template (tiny-chat), and one whose "!" embeds to NaN."""
    root = tmp_path_factory.mktemp("reward-models")
    tiny, chat = model_store.resolve("tiny"), model_store.resolve("tiny-chat")
    return {
        "tiny": build_reward_model(tiny, root / "rm-tiny"),
        "tiny-chat": build_reward_model(chat, root / "rm-chat", seed=1),
        "nan": build_reward_model(tiny, root / "rm-nan", nan_text=NAN_TEXT),
    }


@pytest.fixture
def scorers(model_store: Any) -> ModelScorers:
    return ModelScorers(model_store.resolve, CPU, torch.float32)


def direct_score(path: Path, prompt: str, completion: str) -> float:
    """The reward model's own forward on one text: the conversation in its chat template when
    it has one, else prompt + completion (no batch, no padding, no helper)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": completion}]  # fmt: skip
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:
        ids = tokenizer(prompt + completion, return_tensors="pt").input_ids
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


def context(scorers: ModelScorers, group_size: int = 2) -> RewardContext:
    return RewardContext(ARITH, 16, group_size=group_size, models=scorers)


def rm_reward(scorers: ModelScorers, path: Path, **params: Any) -> list[float]:
    p = RewardModelParams(model=str(path), **params)
    return reward_model_reward(COMPLETIONS, EXAMPLES, [1] * 6, context(scorers), p)


@pytest.mark.parametrize("rm", ["tiny", "tiny-chat"])
def test_scores_are_the_reward_models_own_forward(reward_models, scorers, rm):
    got = rm_reward(scorers, reward_models[rm], batch_size=4)
    pairs = zip(PROMPTS, COMPLETIONS, strict=True)
    expected = [direct_score(reward_models[rm], p, c) for p, c in pairs]
    assert got == pytest.approx(expected, abs=1e-4)
    assert len(set(got)) == len(got)  # the texts are told apart: not one constant


def test_a_batch_over_batch_size_is_split_and_scores_the_same(reward_models, scorers):
    path = reward_models["tiny-chat"]
    whole = rm_reward(scorers, path, batch_size=64)
    forwards = []
    scorer = scorers.load(str(path))
    scorer.model.register_forward_pre_hook(lambda _m, args: forwards.append(1))
    split = rm_reward(scorers, path, batch_size=4)
    assert len(forwards) == 2  # 6 texts, 4 per pass
    assert split == pytest.approx(whole, abs=1e-5)


def test_group_normalisation_is_within_each_group(reward_models, scorers):
    raw = rm_reward(scorers, reward_models["tiny"])
    assert rm_reward(scorers, reward_models["tiny"], normalise="group") == pytest.approx(
        group_normalised(raw, 2)
    )


def test_max_tokens_cuts_the_prompt_from_its_left(reward_models, scorers):
    path = reward_models["tiny"]
    long_prompt = "0123456789" * 6 + "1+2="
    deadline = time.monotonic() + 600
    [cut] = scorers.score(str(path), [long_prompt], ["3"], max_tokens=20, batch_size=1,
                          deadline=deadline)  # fmt: skip
    # The character tokenizer: 20 tokens are the prompt's last 19 characters and the answer.
    assert cut == pytest.approx(direct_score(path, long_prompt[-19:], "3"), abs=1e-4)


def test_a_nan_score_fails_those_rollouts_alone_and_the_step_goes_on(reward_models, scorers):
    completions = ["3", f"3{NAN_TEXT}", "4", "5", "10", "1"]
    cfg = RunConfig.model_validate({
        "task": TASK,
        "rewards": [{"name": "verifier"},
                    {"name": "reward_model", "params": {"model": str(reward_models["nan"]),
                                                        "normalise": "group"}}],
    })  # fmt: skip
    scores = score_rollouts(build_rewards(cfg.rewards), completions, EXAMPLES, [1] * 6,
                            context(scorers))  # fmt: skip
    assert scores.failed == {"reward_model": 1}
    assert "returned nan" in scores.reasons["reward_model"]
    parts = scores.parts["reward_model"]
    assert parts[1] == 0.0 and all(math.isfinite(v) for v in parts)
    # Its group-mate is normalised over the finite scores alone: a group of one gives 0.
    assert parts[0] == 0.0 and parts[2:] == pytest.approx(group_normalised(parts[2:], 2))
    assert parts[2] != 0.0
    assert scores.outcome == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # the verifier scored every one


def test_a_timeout_fails_the_batch_with_its_reason_within_a_layer(reward_models, scorers):
    """A model slower than timeout_s (each layer sleeps past it) fails the batch at the next
    layer: the bound holds inside one forward pass, not only between batches."""
    path = reward_models["tiny"]
    scorer = scorers.load(str(path))
    layers = list(scorer.model.model.layers)
    ran = []

    def slow(module, args, output):
        ran.append(module)
        time.sleep(0.3)

    for layer in layers:
        layer.register_forward_hook(slow)
    cfg = RunConfig.model_validate({
        "task": TASK,
        "rewards": [{"name": "verifier"},
                    {"name": "reward_model", "params": {"model": str(path), "timeout_s": 0.1}}],
    })  # fmt: skip
    scores = score_rollouts(build_rewards(cfg.rewards), COMPLETIONS, EXAMPLES, [1] * 6,
                            context(scorers))  # fmt: skip
    assert scores.failed == {"reward_model": 6}
    reason = scores.reasons["reward_model"]
    assert "ran past timeout_s (0.1 s)" in reason and str(path) in reason
    assert len(ran) == 1 < len(layers)  # the second layer never started
    assert scores.outcome == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # the other rewards did score


def test_a_cancel_during_scoring_ends_the_step(reward_models, scorers):
    path = reward_models["tiny"]
    scorer = scorers.load(str(path))
    cancelled = []
    scorer.model.model.layers[0].register_forward_hook(lambda *a: cancelled.append(True))
    cfg = RunConfig.model_validate({
        "task": TASK, "rewards": [{"name": "reward_model", "params": {"model": str(path)}}],
    })  # fmt: skip
    with stopping.abandon_when(lambda: bool(cancelled)), pytest.raises(stopping.Abandoned):
        score_rollouts(build_rewards(cfg.rewards), COMPLETIONS, EXAMPLES, [1] * 6,
                       context(scorers))  # fmt: skip
    assert len(cancelled) == 1  # stopped inside the first forward pass


def rl_config(model: str | None, weight: float = 1.0) -> RunConfig:
    """One GRPO step on tiny-arith; ``model``: the reward model beside the verifier (None:
    the verifier alone)."""
    rm = [] if model is None else [{"name": "reward_model", "weight": weight,
                                    "params": {"model": model}}]  # fmt: skip
    return RunConfig.model_validate({
        "algorithm": "grpo",  # advantages from the shaped reward (ConSPO's read the outcome)
        "steps": 1,
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "rewards": [{"name": "verifier"}, *rm],
    })  # fmt: skip


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("/no/such/reward-model", "rewards[1].params.model '/no/such/reward-model'"),
        ("tiny", "rewards[1].params.model 'tiny' is not a reward model"),  # a causal LM
    ],
)
def test_a_model_that_is_no_reward_model_fails_set_up_at_its_field(model_store, name, message):
    with pytest.raises((Unavailable, ValueError)) as refused:
        loop.setup(rl_config(name), model_store)
    assert message in str(refused.value)


def test_the_trainers_rollouts_shape_their_reward_with_the_reward_models(
    model_store, reward_models
):
    path = reward_models["tiny"]
    state = loop.setup(rl_config(str(path), weight=0.5), model_store)
    prompts = state.task.train_prompts(random.Random(0), 2)
    got = rollouts.sample_groups(state, prompts, seed=0)
    part = got.reward_parts["reward_model"]
    texts = verified_texts(state.tokenizer, got.batch)
    expected = [direct_score(path, ex.prompt, t) for ex, t in zip(
        [ex for ex in prompts for _ in range(4)], texts, strict=True)]  # fmt: skip
    assert part.tolist() == pytest.approx(expected, abs=1e-4)
    assert got.rewards.tolist() == pytest.approx((got.correct + 0.5 * part).tolist())


def test_one_training_step_logs_the_reward_models_reward(model_store, reward_models, tmp_path):
    sink = MemorySink()
    trainer.train(rl_config(str(reward_models["tiny"])), sink, workdir=tmp_path / "rm",
                  model_store=model_store)  # fmt: skip
    m = sink.steps[1].metrics
    assert math.isfinite(m[M.reward_key("reward_model")]) and m[M.reward_key("reward_model")] != 0
    assert m[M.reward_key("verifier")] == pytest.approx(m[M.BATCH_PASS_RATE])
    alone = MemorySink()
    trainer.train(rl_config(None), alone, workdir=tmp_path / "plain", model_store=model_store)
    # The same rollouts (same seed, same start), another shaped reward: another update (the
    # loss's value at the sampling policy is the same whatever the advantages; its gradient not).
    assert m[M.BATCH_PASS_RATE] == alone.steps[1].metrics[M.BATCH_PASS_RATE]
    assert m[M.GRAD_NORM] != pytest.approx(alone.steps[1].metrics[M.GRAD_NORM])
