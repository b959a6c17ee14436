"""The environment protocol (conspo.environments): a game played turn by turn, everything a
faulty environment may do contained to its own episode, and the adapters to what users already
have (a gymnasium-style class, a TRL environment_factory class, TextArena's games)."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from conspo import stopping
from conspo.config import RunConfig
from conspo.environments import (
    EnvironmentLimits,
    EpisodeRunner,
    StepResult,
    environment_factory,
    play_episode,
    targets,
)
from conspo.environments.gym import GymAdapter
from conspo.environments.trl import TrlAdapter
from conspo.registry import ENVIRONMENTS
from conspo.tasks import make_task
from conspo.tasks.base import Example
from tests.support import REQUIRE_SERVICES

LIMITS = EnvironmentLimits(timeout_s=5.0, max_observation_chars=256, max_turns=12)


def game(seed: int) -> Example:
    return Example(f"[game {seed}]\n", "", {"seed": seed})


def guess_number(seed: int = 7, **params: Any) -> Callable[[], Any]:
    return environment_factory("guess_number", params, game(seed), 0)


def bisecting_player(low: int, high: int) -> Callable[[str], str]:
    """Guesses the middle of what the feedback leaves open."""
    bounds = [low, high]
    last: list[int] = []

    def player(observation: str) -> str:
        if last and "higher" in observation:
            bounds[0] = last[-1] + 1
        elif last and "lower" in observation:
            bounds[1] = last[-1] - 1
        last.append((bounds[0] + bounds[1]) // 2)
        return f"My guess is {last[-1]}."

    return player


# ------------------------------------------------------------------------------------------------
# The protocol, on the built-in game
# ------------------------------------------------------------------------------------------------


def test_a_bisecting_player_wins_guess_the_number_and_every_turn_is_recorded() -> None:
    episode = play_episode(guess_number(seed=7, high=100), bisecting_player(1, 100), LIMITS)
    assert episode.failure is None and episode.succeeded and not episode.truncated
    assert "between 1 and 100" in episode.first_observation
    assert 1 <= episode.turn_count <= 7  # bisection needs at most ⌈log2 100⌉ guesses
    assert episode.rewards() == [0.0] * (episode.turn_count - 1) + [1.0]
    assert [t.done for t in episode.turns] == [False] * (episode.turn_count - 1) + [True]
    for turn in episode.turns[:-1]:
        assert re.search(r"is wrong: my number is (higher|lower)\.", turn.observation), turn
    assert episode.total_reward == 1.0
    stored = json.loads(json.dumps(episode.as_dict()))
    assert stored["succeeded"] and stored["turn_count"] == episode.turn_count
    assert stored["turns"][-1]["action"] == episode.turns[-1].action


def test_guess_the_number_says_what_is_wrong_with_an_action_and_stops_at_the_turn_limit() -> None:
    runner = EpisodeRunner(guess_number(high=10), EnvironmentLimits(max_turns=3))
    runner.reset()
    assert "No number found" in runner.step("I don't know").observation
    assert "outside the range" in runner.step("999").observation
    runner.step("0 or maybe 11")  # the last number is the guess: out of range too
    assert runner.over
    episode = runner.finish()
    assert episode.truncated and not episode.succeeded and episode.failure is None
    assert episode.rewards() == [0.0, 0.0, 0.0]


def test_the_example_fixes_the_game_so_a_group_plays_one_secret() -> None:
    secrets = {guess_number(seed=3)().secret for _ in range(4)}
    assert len(secrets) == 1
    assert len({guess_number(seed=s)().secret for s in range(20)}) > 1


# ------------------------------------------------------------------------------------------------
# Containment: a faulty environment fails its own episode, with the reason, and nothing else
# ------------------------------------------------------------------------------------------------


class Faulty:
    """Plays like a game for one turn, then does ``fault`` on the second."""

    release = threading.Event()  # ends a hung call when the test is over

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.turns = 0
        self.closed = False

    def reset(self) -> str:
        return "go"

    def step(self, action_text: str) -> Any:
        self.turns += 1
        if self.turns < 2:
            return StepResult("ok")
        if self.fault == "raises":
            raise RuntimeError("the world broke")
        if self.fault == "exits":
            raise SystemExit(3)
        if self.fault == "hangs":
            Faulty.release.wait(60)
            return StepResult("too late")
        return {
            "wrong type": ("ok", 0.0, False, {}),
            "nan reward": StepResult("ok", reward=math.nan),
            "inf reward": StepResult("ok", reward=-math.inf),
            "bool reward": StepResult("ok", reward=True),
            "done not a bool": StepResult("ok", done=1),  # type: ignore[arg-type]
            "observation not a str": StepResult(None),  # type: ignore[arg-type]
        }[self.fault]

    def close(self) -> None:
        self.closed = True


FAULTS = {
    "raises": "step raised RuntimeError: the world broke",
    "exits": "step raised SystemExit: 3",
    "hangs": "step timed out after 0.5 s",
    "wrong type": "step returned tuple, not a StepResult",
    "nan reward": "step's reward is nan, not a finite number",
    "inf reward": "step's reward is -inf, not a finite number",
    "bool reward": "step's reward is bool, not a number",
    "done not a bool": "step's done is int, not a bool",
    "observation not a str": "step returned NoneType, not a str observation",
}


@pytest.fixture
def released() -> Iterator[None]:
    Faulty.release.clear()
    yield
    Faulty.release.set()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_environment_fails_its_episode_and_the_others_play_on(fault, released) -> None:
    """Three episodes played side by side, turn by turn, as a rollout plays a group: the
    faulty one fails on its second turn with the reason; the games beside it are won."""
    limits = EnvironmentLimits(timeout_s=0.5, max_observation_chars=256, max_turns=12)
    faulty = Faulty(fault)
    runners = [
        EpisodeRunner(guess_number(seed=1, high=100), limits),
        EpisodeRunner(lambda: faulty, limits),
        EpisodeRunner(guess_number(seed=2, high=100), limits),
    ]
    players = [bisecting_player(1, 100), lambda _: "move", bisecting_player(1, 100)]
    observations = [runner.reset() for runner in runners]
    slowest = 0.0
    while not all(runner.over for runner in runners):
        for i, runner in enumerate(runners):
            if not runner.over:
                started = time.monotonic()
                observations[i] = runner.step(players[i](observations[i] or "")).observation
                slowest = max(slowest, time.monotonic() - started)
    good, bad, other = (runner.finish() for runner in runners)
    assert bad.failure == FAULTS[fault] and not bad.succeeded and bad.total_reward == 0.0
    assert bad.turn_count == 2 and bad.turns[-1].error == FAULTS[fault]
    assert good.succeeded and other.succeeded
    assert slowest < limits.timeout_s + 2.0  # a hang costs its timeout, not the caller's time
    # a hung environment is abandoned (it is still inside its call): never closed
    assert faulty.closed is (fault != "hangs")


def test_a_cancel_lands_while_an_environment_hangs(released) -> None:
    """A hung step is waited on in slices that ask the cancel check: the run's cancel ends the
    wait long before the step's timeout."""
    hung = Faulty("hangs")
    runner = EpisodeRunner(lambda: hung, EnvironmentLimits(timeout_s=60))
    runner.reset()
    runner.step("first")
    started = time.monotonic()
    with pytest.raises(stopping.Abandoned), stopping.abandon_when(lambda: True):
        runner.step("second")
    assert time.monotonic() - started < 10
    episode = runner.finish()  # the environment is still inside its step: never closed
    assert episode.failure == "cancelled while the environment was in a call" and not hung.closed


def test_an_environment_that_fails_to_start_fails_its_episode() -> None:
    def broken() -> Any:
        raise ImportError("no module named my_envs")

    runner = EpisodeRunner(broken, LIMITS)
    assert runner.reset() is None and runner.over
    episode = runner.finish()
    assert episode.failure == "creating the environment raised ImportError: no module named my_envs"
    assert episode.turn_count == 0

    class BadReset(Faulty):
        def reset(self) -> Any:
            return 42

    episode = play_episode(lambda: BadReset("raises"), lambda _: "x", LIMITS)
    assert episode.failure == "reset returned int, not a str observation"


def test_a_huge_observation_is_cut_to_the_limit_and_says_so() -> None:
    class Chatty(Faulty):
        def step(self, action_text: str) -> StepResult:
            return StepResult("head " + "x" * 100_000 + " tail", reward=1.0, done=True)

    episode = play_episode(lambda: Chatty(""), lambda _: "talk", LIMITS)
    (turn,) = episode.turns
    assert episode.failure is None and episode.succeeded
    assert len(turn.observation) <= LIMITS.max_observation_chars
    assert turn.observation.startswith("head ") and turn.observation.endswith(" tail")
    assert "characters cut]" in turn.observation and turn.cut_chars > 99_000


def test_a_final_reward_that_is_not_a_number_fails_the_episode() -> None:
    class Owns(Faulty):
        def __init__(self, value: Any) -> None:
            super().__init__("")
            self.value = value

        def step(self, action_text: str) -> StepResult:
            return StepResult("end", done=True)

        def final_reward(self) -> Any:
            return self.value

    assert play_episode(lambda: Owns(1), lambda _: "x", LIMITS).succeeded
    assert play_episode(lambda: Owns(None), lambda _: "x", LIMITS).total_reward == 0.0
    failed = play_episode(lambda: Owns(math.nan), lambda _: "x", LIMITS)
    assert failed.failure == "final_reward is nan, not a finite number"


# ------------------------------------------------------------------------------------------------
# A gymnasium-style text environment
# ------------------------------------------------------------------------------------------------


class CoinFlipEnv:
    """Gymnasium's shape: reset(seed) -> (obs, info); step -> 5-tuple, numpy-free here."""

    def __init__(self, sides: int = 2, five_tuple: bool = True) -> None:
        self.sides = sides
        self.five_tuple = five_tuple
        self.coin = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.coin = random.Random(seed).randrange(self.sides)
        return f"Call the coin: 0 … {self.sides - 1}.", {}

    def step(self, action: str):
        won = action.strip() == str(self.coin)
        observation = "right" if won else f"wrong, it was {self.coin}"
        if self.five_tuple:
            return observation, float(won), won, not won, {"coin": self.coin}
        return observation, float(won), True, {"coin": self.coin}


@pytest.mark.parametrize("five_tuple", [True, False])
def test_the_gym_adapter_plays_a_gymnasium_style_class(five_tuple: bool) -> None:
    coin = CoinFlipEnv(five_tuple=five_tuple)
    adapter = GymAdapter(coin, game(5))
    episode = play_episode(lambda: adapter, lambda obs: str(coin.coin), LIMITS)
    assert episode.succeeded and episode.first_observation == "Call the coin: 0 … 1."
    assert episode.turns[0].info == {"coin": coin.coin}
    lost = play_episode(lambda: GymAdapter(CoinFlipEnv(), game(5)), lambda _: "9", LIMITS)
    assert lost.failure is None and not lost.succeeded and lost.turns[0].done


def test_the_gym_adapter_refuses_a_step_of_the_wrong_shape() -> None:
    class Short(CoinFlipEnv):
        def step(self, action: str):
            return "obs", 1.0

    episode = play_episode(lambda: GymAdapter(Short(), game(1)), lambda _: "1", LIMITS)
    assert episode.failure is not None and "a tuple of 2" in episode.failure


def test_a_registered_adapter_builds_only_a_class_in_a_plugins_package(monkeypatch) -> None:
    """A config names the class; building it runs its code, so only a plugin's is taken."""
    params = {"entry_point": "subprocess:Popen", "kwargs": {"args": ["true"]}}
    with pytest.raises(ValidationError) as refused:
        RunConfig.model_validate(
            {"task": {"name": "environment", "params": {"environment": "gym",
                                                       "environment_params": params}}}
        )  # fmt: skip
    (error,) = refused.value.errors()
    assert error["loc"] == ("task", "params", "environment_params")
    assert "'subprocess' is not in a loaded plugin's package" in error["msg"]

    monkeypatch.setattr(targets, "allowed_roots", lambda: {__name__.split(".")[0]})
    target = f"{__name__}:CoinFlipEnv"
    make = environment_factory("gym", {"entry_point": target, "kwargs": {"sides": 3}}, game(2), 0)
    episode = play_episode(make, lambda _: str(random.Random(2).randrange(3)), LIMITS)
    assert episode.succeeded and "0 … 2" in episode.first_observation


# ------------------------------------------------------------------------------------------------
# A TRL environment_factory class, written the way TRL's docs show (nothing in it for us)
# ------------------------------------------------------------------------------------------------


def _example_trl_class() -> type:
    """The example plugin's TRL class (examples/plugins/.../trl_env.py), loaded from its file:
    one copy of the class the docs show, read by this test and by the example alike."""
    path = (
        Path(__file__).resolve().parents[2]
        / "examples" / "plugins" / "conspo_example_plugin" / "conspo_example_plugin" / "trl_env.py"
    )  # fmt: skip
    spec = importlib.util.spec_from_file_location("example_trl_env", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GuessEnv


GuessEnv = _example_trl_class()


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_the_trl_adapter_plays_an_environment_factory_class() -> None:
    example = game(36)  # the secret: 36 % 10 + 1 = 7
    adapter = TrlAdapter(GuessEnv(), example)
    assert list(adapter.tools) == ["guess"]
    runner = EpisodeRunner(lambda: adapter, EnvironmentLimits())
    assert runner.reset() == "Guess the secret number between 1 and 10 with the `guess` tool."
    low = runner.step("Let me try. " + call("guess", number=5))
    assert low.observation == "<tool_response>\nHigher.\n</tool_response>" and not low.done
    assert low.info["tool_results"] == [{"name": "guess", "content": "Higher."}]
    # the model's mistakes are its to read, as in TRL: an error in the tool's result
    mistakes = runner.step(call("guess", number=11) + call("shout") + "<tool_call>{x</tool_call>")
    assert mistakes.observation.count("<tool_response>") == 3
    assert "The number must be between 1 and 10." in mistakes.observation
    assert "Tool shout not found." in mistakes.observation
    assert "not JSON" in mistakes.observation and mistakes.info["tool_failures"] == 3
    assert "Correct!" in runner.step(call("guess", number=7)).observation
    assert runner.step("The number is 7.").done  # no call: the episode ends, as in TRL
    episode = runner.finish()
    assert episode.failure is None and episode.final_reward == 1.0 and episode.succeeded
    assert episode.rewards() == [0.0, 0.0, 0.0, 0.0]


def test_the_trl_adapter_describes_each_tool_by_its_signature_and_docstring() -> None:
    (schema,) = TrlAdapter(GuessEnv(), game(1)).tool_schemas()
    function = schema["function"]
    assert function["name"] == "guess"
    assert function["parameters"]["properties"]["number"]["type"] == "integer"
    assert "between 1 and 10" in function["parameters"]["properties"]["number"]["description"]


# ------------------------------------------------------------------------------------------------
# TextArena's single-player games, offline
# ------------------------------------------------------------------------------------------------

TEXTARENA_GAMES = {  # a few legal-looking moves each
    "ta_guess_the_number": ["[10]", "[5]", "[15]"],
    "ta_mastermind": ["[1 2 3 4]", "[2 3 4 5]", "[3 4 5 6]"],
    "ta_tower_of_hanoi": ["[A C]", "[A B]", "[C B]"],
    "ta_minesweeper": ["[3 3]", "[0 0]", "[7 7]"],
    "ta_frozen_lake": ["[right]", "[down]", "[down]"],
    "ta_sudoku": ["[1 1 5]", "[2 2 6]", "[3 3 7]"],
}


@pytest.fixture
def offline(monkeypatch) -> None:
    if importlib.util.find_spec("textarena") is None:
        if REQUIRE_SERVICES:
            pytest.fail("textarena is not installed: `make install` installs it (pyproject)")
        pytest.skip("textarena is not installed (pip install textarena==0.7.4)")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("the network is blocked in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_textarenas_offline_games_are_the_registered_ones() -> None:
    assert {n for n in ENVIRONMENTS.names() if n.startswith("ta_")} == set(TEXTARENA_GAMES)


@pytest.mark.parametrize("name", TEXTARENA_GAMES)
def test_a_textarena_game_plays_offline_seeded_by_its_example(name: str, offline) -> None:
    before = random.getstate()
    moves = iter(TEXTARENA_GAMES[name])
    episodes = [
        play_episode(
            environment_factory(name, {}, game(seed), 0),
            lambda _: next(moves, "[1]"),
            EnvironmentLimits(timeout_s=30, max_turns=3),
        )
        for seed in (11, 11)
    ]
    first = episodes[0]
    assert first.failure is None, first.failure
    assert first.first_observation.strip() and 1 <= first.turn_count <= 3
    assert all(t.observation.strip() and t.error is None for t in first.turns), first.turns
    assert first.first_observation == episodes[1].first_observation  # one seed, one game
    assert random.getstate() == before  # TextArena's seeding of `random` stays in the game


@pytest.mark.parametrize(
    ("params", "loc", "message"),
    [
        ({"environment": "chess"}, "environment", "unknown environment 'chess'; valid"),
        ({"environment_params": {"high": "9"}}, "environment_params", "high: Input should be"),
        ({"environment_params": {"low": 9, "high": 1}}, "environment_params", "high (1) is below"),
        (
            {"environment": "ta_sudoku", "environment_params": {"variant": "Sudoku-v9"}},
            "environment_params",
            "variant: Input should be 'Sudoku-v0'",
        ),
    ],
)
def test_the_environment_task_refuses_bad_settings_at_the_field(params, loc, message) -> None:
    with pytest.raises(ValidationError) as refused:
        RunConfig.model_validate({"task": {"name": "environment", "params": params}})
    (error,) = refused.value.errors()
    assert error["loc"] == ("task", "params", loc) and message in error["msg"], error


def test_the_environment_task_resolves_the_environments_parameters() -> None:
    task = RunConfig.model_validate({"task": {"name": "environment"}}).task
    assert task.params["environment_params"] == {"low": 1, "high": 100}
    given = {"environment_params": {"high": 20.0}}  # JSON's whole float is an integer
    task = RunConfig.model_validate({"task": {"name": "environment", "params": given}}).task
    assert task.params["environment_params"] == {"low": 1, "high": 20}


def test_the_environment_task_holds_out_seeds_of_a_textarena_game() -> None:
    config = RunConfig.model_validate(
        {"task": {"name": "environment", "params": {"environment": "ta_mastermind"}}}
    )
    task = make_task(config.task)
    train = {ex.data["seed"] for ex in task.train_prompts(random.Random(0), 300)}
    held_out = {ex.data["seed"] for ex in task.eval_examples(30)}
    assert len(held_out) == 30 and not train & held_out
    assert task.eval_examples(30) == task.eval_examples(30)
