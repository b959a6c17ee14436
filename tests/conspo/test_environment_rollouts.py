"""Rollouts that play an environment turn by turn, on the real SmolLM2-135M-Instruct: each turn
the model ends with its end token is an action, the environment's answer comes back as the
next user turn of the chat template (tokens the model did not write, masked), and the rollout
ends when the episode does. And whatever the environment does wrong stays in its own episode."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from conspo import stopping
from conspo.config import PromptConfig, TaskConfig, ToolsConfig
from conspo.environments.base import StepResult
from conspo.environments.runner import EnvironmentLimits, EpisodeRunner
from conspo.generation.batch import SampleRequest
from conspo.generation.engines import NativeEngine
from conspo.generation.rollout import encode_prompts, end_token_ids
from conspo.generation.tool_rollout import EnvironmentPlay, ToolEngine, ToolUse, turn_format
from conspo.models.loading import load_pretrained
from conspo.tasks import make_task
from conspo.tasks.environment import episode_starter
from conspo.tasks.prompts import PromptRenderer, with_prompts
from conspo.tools import make_toolbox

pytestmark = pytest.mark.slow  # SmolLM2 plays whole episodes

MAX_TURNS = 4
BUDGET = 160


@pytest.fixture(scope="module")
def smollm2(model_store):
    model, tokenizer = load_pretrained(
        model_store.resolve("smollm2-135m-instruct"), torch.device("cpu"), torch.float32
    )
    return model.eval(), tokenizer


def guessing_task(tokenizer):
    task = make_task(
        TaskConfig.model_validate({
            "name": "environment",
            "params": {"environment": "guess_number", "environment_params": {"high": 8}},
        })
    )  # fmt: skip
    render = PromptRenderer(PromptConfig(), tokenizer)
    return with_prompts(task, render), render


def engine_for(tokenizer, start, render) -> ToolEngine:
    box = make_toolbox(ToolsConfig())
    play = EnvironmentPlay(start, turn_format(tokenizer, render.chat))
    return ToolEngine(NativeEngine(), ToolUse(box, tokenizer, play))


def sample(model, tokenizer, engine, examples, seed=0, should_stop=None):
    ids, mask = encode_prompts(tokenizer, [ex.prompt for ex in examples], torch.device("cpu"))
    request = SampleRequest(
        max_new_tokens=BUDGET,
        eos_id=end_token_ids(tokenizer, model),
        pad_id=tokenizer.pad_token_id,
        temperature=1.0,
        generator=torch.Generator().manual_seed(seed),
        examples=examples,
        should_stop=should_stop,
    )
    return engine.sample(model, ids, mask, request)


@pytest.fixture(scope="module")
def played(smollm2):
    import random

    model, tokenizer = smollm2
    task, render = guessing_task(tokenizer)
    limits = EnvironmentLimits(timeout_s=10, max_turns=MAX_TURNS)
    engine = engine_for(tokenizer, episode_starter(task, limits), render)
    examples = task.train_prompts(random.Random(3), 6)
    return sample(model, tokenizer, engine, examples), examples, tokenizer, render


def test_each_turn_is_an_action_and_each_observation_a_masked_user_turn(played) -> None:
    batch, examples, tokenizer, render = played
    fmt = turn_format(tokenizer, render.chat)
    assert batch.episodes is not None and batch.turn_index is not None
    assert batch.observation_mask is not None and batch.tool_calls is None  # no tools here
    several = 0
    for i, episode in enumerate(batch.episodes):
        assert episode is not None and episode.failure is None
        k = int(batch.lengths[i])
        ids = batch.response_ids[i, :k]
        observed = batch.observation_mask[i, :k] > 0
        turns = batch.turn_index[i, :k]
        # -1 exactly on the environment's tokens; the model's tokens count turns 0, 1, …
        assert bool(((turns == -1) == observed).all())
        assert bool((batch.model_mask[i, :k] == (~observed).float()).all())
        assert episode.turn_count <= MAX_TURNS
        if episode.turn_count == 0:  # its first turn ran out of tokens: nothing was played
            assert bool(batch.truncated[i]) and not bool(observed.any())
            assert episode.truncated  # cut, as an episode out of turns is
            continue
        if bool(batch.truncated[i]) and not episode.turns[-1].done:
            assert episode.truncated
        # Each played turn's action is the text the model wrote in that turn, as written.
        for t, turn in enumerate(episode.turns):
            written = tokenizer.decode(ids[turns == t].tolist(), skip_special_tokens=True)
            assert turn.action == written
        # What the model read between its turns is each observation, as a user turn of the
        # chat template; nothing after the turn that ended the episode.
        read = tokenizer.decode(ids[observed].tolist())
        shown = [turn.observation for turn in episode.turns]
        if episode.turns[-1].done or episode.turn_count == MAX_TURNS:
            shown = shown[:-1]
        assert read == "".join(fmt.wrap(o) for o in shown)
        assert "<|im_start|>user" in fmt.before and "<|im_start|>assistant" in fmt.after
        # A rollout ends where its episode does, or at the budget.
        over = episode.turns[-1].done or episode.turn_count == MAX_TURNS
        assert over or bool(batch.truncated[i])
        several += episode.turn_count > 1
    assert several, "no rollout played more than one turn"


def test_verify_reads_the_played_episode(played, smollm2) -> None:
    from conspo.tasks.environment import with_episode

    batch, examples, tokenizer, _ = played
    task, _ = guessing_task(tokenizer)
    for example, episode in zip(examples, batch.episodes, strict=True):
        with_it = with_episode(example, episode)
        assert with_it.data["_original"].data["episode"] is episode
        # the answer that wins at once, verified against a lost episode, is still wrong
        assert task.verify(example.answer, with_it) == float(episode.succeeded)


class Hostile:
    """Misbehaves on its second step, as its game (seed) says."""

    def __init__(self, mode: str) -> None:
        self.mode, self.steps = mode, 0

    def reset(self) -> str:
        return "Say anything."

    def step(self, action: str) -> StepResult:
        self.steps += 1
        if self.steps < 2 or self.mode == "fine":
            return StepResult("Go on.")
        if self.mode == "raise":
            raise KeyError("boom")
        if self.mode == "hang":
            time.sleep(60)
        if self.mode == "nan":
            return StepResult("x", reward=math.nan)
        if self.mode == "type":
            return "not a StepResult"  # type: ignore[return-value]
        return StepResult("y" * 100_000)  # huge

    def close(self) -> None:
        pass


MODES = ["raise", "hang", "nan", "type", "huge", "fine"]


def test_an_environment_that_misbehaves_fails_its_own_episode_only(smollm2) -> None:
    model, tokenizer = smollm2
    render = PromptRenderer(PromptConfig(), tokenizer)
    limits = EnvironmentLimits(timeout_s=1.0, max_observation_chars=200, max_turns=3)

    def start(example, seed):
        mode = example.data["mode"]
        return EpisodeRunner(lambda: Hostile(mode), limits)

    from conspo.tasks.base import Example

    examples = [
        Example(render(f"Say one word, then another. ({m})"), "", {"mode": m}) for m in MODES
    ]
    engine = engine_for(tokenizer, start, render)
    started = time.monotonic()
    batch = sample(model, tokenizer, engine, examples, seed=1)
    took = time.monotonic() - started
    by_mode = dict(zip(MODES, batch.episodes, strict=True))
    reached = {m: e for m, e in by_mode.items() if e.turn_count >= 2 or e.failure}
    for mode, episode in reached.items():
        if mode in ("fine", "huge"):
            assert episode.failure is None
        else:
            assert episode.failure is not None and episode.turns[-1].error
    if "raise" in reached:
        assert "KeyError" in reached["raise"].failure
    if "hang" in reached:
        assert "timed out after 1 s" in reached["hang"].failure
    if "nan" in reached:
        assert "not a finite number" in reached["nan"].failure
    if "huge" in reached:
        cut = reached["huge"].turns[1]
        assert len(cut.observation) <= 400 and cut.cut_chars > 0
    assert len(reached) >= 4, f"too few episodes reached their second step: {sorted(reached)}"
    assert took < 120  # the hang cost its timeout, not its 60 s


def test_a_cancel_lands_while_an_environment_step_hangs(smollm2) -> None:
    model, tokenizer = smollm2
    render = PromptRenderer(PromptConfig(), tokenizer)
    limits = EnvironmentLimits(timeout_s=60.0, max_turns=3)
    from conspo.tasks.base import Example

    examples = [Example(render("Say one word."), "", {"mode": "hang"})] * 2

    class HangsAtOnce(Hostile):
        def step(self, action: str) -> StepResult:
            time.sleep(60)
            return StepResult("late")

    engine = engine_for(
        tokenizer, lambda ex, s: EpisodeRunner(lambda: HangsAtOnce(""), limits), render
    )
    asked = threading.Event()
    threading.Timer(8.0, asked.set).start()
    started = time.monotonic()
    with pytest.raises((stopping.Abandoned, Exception)) as caught:
        sample(model, tokenizer, engine, examples, should_stop=asked.is_set)
    assert "stopped" in str(caught.value) or isinstance(caught.value, stopping.Abandoned)
    assert time.monotonic() - started < 8.0 + 10.0
