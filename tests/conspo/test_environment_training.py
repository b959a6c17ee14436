"""Training runs that play environments: a TextArena game and a TRL environment_factory class
(written as TRL's docs show, nothing in it for us) each train a step with per-turn credit; and
SmolLM2-135M-Instruct + LoRA plays guess_number turn by turn with GiGPO credit, its turns
reaching the update."""

from __future__ import annotations

import math
import time

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.environments import targets
from conspo.generation.batch import RolloutBatch
from conspo.objectives.base import PolicyBatch
from conspo.sink import MemorySink
from conspo.training.rollouts import Rollouts, concat_rollouts, keep_groups
from conspo.training.trainer import train


def game_run(game: str, game_params: dict, **overrides) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 1,
        "model": {"name": "tiny"},
        "task": {
            "name": "environment",
            "eval_size": 4,
            "params": {"environment": game, "environment_params": game_params},
        },
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 32},
        "environment": {"max_turns": 2, "credit": "turn"},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "logging": {"rollout_sample": 4},
        **overrides,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("environment", "params"),
    [
        ("ta_guess_the_number", {}),
        ("trl", {"entry_point": "tests.conspo.test_environments:GuessEnv"}),
    ],
)
def test_a_textarena_game_and_a_trl_class_train_a_step(
    environment: str, params: dict, model_store, tmp_path, monkeypatch
) -> None:
    # the TRL class lives in this test package, standing for a plugin's
    monkeypatch.setattr(targets, "allowed_roots", lambda: {"tests"})
    sink = MemorySink()
    result = train(game_run(environment, params), sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded"
    m = sink.steps[1].metrics
    assert m[M.ENV_FAILED] == 0.0, "the environment failed an episode"
    assert 0 <= m[M.ENV_TURNS] <= 2 and math.isfinite(m[M.LOSS])
    assert M.ENV_SUCCESS in m and M.TIME_ENV_S in m


@pytest.mark.slow
def test_smollm2_plays_guess_number_and_its_turns_reach_the_update(
    model_store, tmp_path, monkeypatch
) -> None:
    seen: list[PolicyBatch] = []
    from conspo.objectives import grpo

    original = grpo.grpo_objective

    def watched(batch: PolicyBatch, params):  # what the trainer hands the objective
        seen.append(batch)
        return original(batch, params)

    monkeypatch.setattr("conspo.registry.OBJECTIVES.get", _with_fn("grpo", watched))
    cfg = game_run(
        "guess_number",
        {"high": 8},
        model={"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 4}},
        prompt={"system": "Answer with one number only."},
        sampling={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 96},
        environment={"max_turns": 4, "credit": "gigpo"},
        optim={"lr": 1e-3},
    )
    sink = MemorySink()
    result = train(cfg, sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded"
    m = sink.steps[1].metrics
    assert m[M.ENV_TURNS] > 1, "SmolLM2 played no second turn"
    assert m[M.ENV_FAILED] == 0.0 and math.isfinite(m[M.LOSS])
    # the turn-level advantages reached the objective, on the model's tokens only
    assert seen and all(b.turn_advantages is not None for b in seen)
    for b in seen:
        assert b.turn_advantages is not None
        assert bool((b.turn_advantages[b.mask == 0] == 0).all())
    # and a sampled rollout shows the conversation: the environment's answer as a user turn
    shown = [r.completion for r in sink.steps[1].rollouts]
    assert any("user" in text and "assistant" in text for text in shown)


def _with_fn(name: str, fn):
    """``OBJECTIVES.get`` whose ``name`` entry calls ``fn`` instead."""
    from dataclasses import replace

    from conspo.registry import OBJECTIVES, Registry

    get = Registry.get

    def patched(key: str):
        entry = get(OBJECTIVES, key)
        return replace(entry, fn=fn) if key == name else entry

    return patched


def rollouts_of(widths: list[int], g: int, fill: float) -> Rollouts:
    """A round of len(widths) rollouts, row i with widths[i] response tokens of turn 0 and a
    turn advantage of fill + i on each."""
    n, t = len(widths), max(widths)
    mask = torch.zeros(n, t)
    for i, w in enumerate(widths):
        mask[i, :w] = 1
    index = torch.where(mask > 0, 0, -1)
    batch = RolloutBatch(
        torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, t, dtype=torch.long), mask, mask.sum(-1).long(), torch.zeros(n).bool(),
        torch.zeros(n, t), None, 0.0, None, index, [None] * n,
    )  # fmt: skip
    credit = (fill + torch.arange(n).float())[:, None] * mask
    ids = torch.arange(n // g).repeat_interleave(g)
    return Rollouts(batch, torch.zeros(n), torch.zeros(n), ids, n, turn_advantages=credit)


def test_turn_credit_stays_row_for_row_when_rounds_stack_and_groups_drop() -> None:
    """Dynamic sampling's refill stacks rounds and keeps some groups: the turn advantages stay
    with their rollouts, as wide as the responses."""
    first, second = rollouts_of([2, 3], 2, 10.0), rollouts_of([5, 1], 2, 20.0)
    both = concat_rollouts([first, second], 2, 0)
    assert both.turn_advantages is not None and both.batch.turn_index is not None
    assert both.turn_advantages.shape == both.batch.response_ids.shape == (4, 5)
    assert both.turn_advantages[:, 0].tolist() == [10.0, 11.0, 20.0, 21.0]
    assert bool((both.turn_advantages[both.batch.turn_index < 0] == 0).all())
    kept = keep_groups(both, torch.tensor([False, True]), 2)
    assert kept.turn_advantages is not None
    assert kept.turn_advantages[:, 0].tolist() == [20.0, 21.0]
    assert kept.batch.episodes == [None, None]


class ScriptedUser:
    """A simulator that records what it was asked and answers from a script."""

    def __init__(self, answer: str) -> None:
        self.answer, self.asked = answer, []

    def reply(self, messages):
        self.asked.append(messages)
        return self.answer


def test_ask_the_user_talks_to_its_simulator_and_keeps_the_secret() -> None:
    from conspo.environments.simulated_user import AskTheUser, AskTheUserParams
    from conspo.tasks.base import Example

    example = Example("game", "", {"seed": 5})
    user = ScriptedUser("")
    env = AskTheUser(AskTheUserParams(words=4), example, 0, simulator=user)
    word = env.word
    user.answer = f"Yes, {word.upper()} is sweet."
    assert "ANSWER: <word>" in env.reset()
    first = env.step("Is it sweet?")
    assert not first.done and word not in first.observation.lower() and "…" in first.observation
    persona, question = user.asked[0][0], user.asked[0][-1]
    assert persona["role"] == "system" and word in persona["content"]
    assert question == {"role": "user", "content": "Is it sweet?"}
    env.step("Is it yellow?")  # the conversation so far goes with each question
    assert [m["role"] for m in user.asked[1]] == ["system", "user", "assistant", "user"]
    won = env.step(f"ANSWER: {word}")
    assert won.done and won.reward == 1.0
    lost = AskTheUser(AskTheUserParams(), example, 0, simulator=user).step("ANSWER: nothing")
    assert lost.done and lost.reward == 0.0


def test_an_environment_that_needs_a_simulator_plays_without_one_only_what_needs_none() -> None:
    import random

    from conspo.config import TaskConfig
    from conspo.tasks import make_task

    task = make_task(TaskConfig.model_validate({
        "name": "environment", "params": {"environment": "ask_the_user"},
    }))  # fmt: skip
    (example,) = task.train_prompts(random.Random(0), 1)
    assert "ANSWER: <word>" in example.prompt  # drawn without a model (the API's check)
    assert task.verify(example.answer, example) == 1.0  # the reference needs no simulator
    episode = task.play("Is it red?", example)
    assert episode.failure is not None and "no simulator model here" in episode.failure


def test_a_simulator_is_named_where_an_environment_needs_one_and_only_there() -> None:
    from pydantic import ValidationError

    def errors(data: dict) -> dict:
        with pytest.raises(ValidationError) as caught:
            RunConfig.model_validate(data)
        return {tuple(e["loc"]): e["msg"] for e in caught.value.errors()}

    asks = {"name": "environment", "params": {"environment": "ask_the_user"}}
    assert "name one" in errors({"task": asks})[("environment", "simulator")]
    guess = {"name": "environment", "params": {"environment": "guess_number"}}
    simulator = {"simulator": "smollm2-135m-instruct"}
    refused = errors({"task": guess, "environment": simulator})
    assert "talks to no simulator" in refused[("environment", "simulator")]
    assert "plays none" in errors({"environment": simulator})[("environment", "simulator")]
    assert RunConfig.model_validate({"task": asks, "environment": simulator})


def test_a_run_plays_ask_the_user_with_a_model_as_the_user(model_store, tmp_path) -> None:
    cfg = game_run("ask_the_user", {"words": 3}, environment={
        "max_turns": 3, "credit": "turn", "simulator": "tiny", "simulator_max_new_tokens": 8,
    })  # fmt: skip
    sink = MemorySink()
    result = train(cfg, sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded"
    m = sink.steps[1].metrics
    assert m[M.ENV_FAILED] == 0.0 and M.TIME_ENV_S in m


@pytest.mark.slow
def test_the_example_plugins_trl_class_trains_smollm2_with_lora(
    model_store, tmp_path, monkeypatch
) -> None:
    """The TRL environment_factory class shipped in the example plugin (TRL's docs' shape,
    unchanged), loaded as a plugin and played through the adapter by SmolLM2 + LoRA."""
    from pathlib import Path

    from conspo import plugins

    example = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "conspo_example_plugin"
    plugins.reset()
    monkeypatch.syspath_prepend(str(example))
    monkeypatch.setenv(plugins.ENV_VAR, "conspo_example_plugin")
    try:
        entry = "conspo_example_plugin.trl_env:GuessEnv"
        cfg = game_run(
            "trl",
            {"entry_point": entry},
            model={"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 4}},
            sampling={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 64},
            environment={"max_turns": 3, "credit": "gigpo"},
        )
        sink = MemorySink()
        result = train(cfg, sink, workdir=tmp_path, model_store=model_store)
    finally:
        monkeypatch.delenv(plugins.ENV_VAR)
        plugins.reset()
    assert result.status == "succeeded"
    m = sink.steps[1].metrics
    assert m[M.ENV_FAILED] == 0.0 and math.isfinite(m[M.LOSS])
    assert any("guess" in (r.prompt or "") for r in sink.steps[1].rollouts)


def test_the_simulator_answers_the_replies_asked_meanwhile_as_one_batch(model_store) -> None:
    """Replies asked while a generation runs wait for it, then go together: each answer is the
    one it would get alone (greedy), in one generation."""
    import threading

    from conspo.generation.simulator import ModelSimulator
    from conspo.models.loading import load_pretrained

    model, tokenizer = load_pretrained(
        model_store.resolve("tiny"), torch.device("cpu"), torch.float32
    )
    simulator = ModelSimulator(model, tokenizer, max_new_tokens=6)
    asks = [[{"role": "user", "content": f"question {i} " * (i + 1)}] for i in range(6)]
    alone = [simulator.reply(a) for a in asks]
    calls: list[int] = []
    generate = simulator._generate
    simulator._generate = lambda texts: calls.append(len(texts)) or generate(texts)  # type: ignore[method-assign]
    answers: dict[int, str] = {}
    simulator._lock.acquire()  # a generation under way: the asks queue behind it
    threads = [
        threading.Thread(target=lambda i=i: answers.__setitem__(i, simulator.reply(asks[i])))
        for i in range(6)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(simulator._asks) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    simulator._lock.release()
    for t in threads:
        t.join(60)
    assert calls == [6]
    assert [answers[i] for i in range(6)] == alone
