"""The environment protocol: a multi-turn world a rollout plays, one instance per rollout.

    env = GuessNumber(params, example, seed)   # created with the example it plays
    first = env.reset()                        # the first observation, appended to the prompt
    result = env.step("I guess 50")            # StepResult(observation, reward, done, info)
    env.final_reward()                         # optional: a reward the environment owns at the end
    env.close()

An environment is registered like a task (``conspo.registry.register_environment``) with its
parameter model and what it needs of a run (``EnvNeeds``); its code is user code and its input
is model text, so it is never called directly by the rollout but through
``conspo.environments.runner``, which contains whatever it does (raises, hangs, returns a wrong
type, a huge observation, a NaN reward) and records the episode (``Turn``, ``Episode``).

The example fixes the game (every rollout of a group plays the same one: ``game_seed``); the
``seed`` is the rollout's own, for an environment whose dynamics are random.

Pure Python, torch-free: the API validates configs with the registry.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from conspo.tasks.base import Example

# The total reward at which an episode counts as won: every built-in game, TextArena's and the
# TRL convention give 1 for a win (TextArena gives a fraction for a partial solve).
SUCCESS_REWARD = 1.0


class EnvironmentParams(BaseModel):
    """Base of every environment's parameter model: unknown keys are errors, as in a config."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class EnvNeeds:
    """What an environment needs of a run, declared in its registration (the config refuses a
    run that lacks it: a later task wires that check)."""

    max_turns: int  # the most turns an episode of it may take (turns with an action each)
    tools: tuple[str, ...] = ()  # registered tools its episodes call besides its own steps
    sandbox: bool = False  # it runs model-written code (conspo.sandbox)
    judge: bool = False  # it calls a simulator (or judge) model: created with ``simulator=``


@dataclass(frozen=True)
class StepResult:
    """What one ``step`` returns: the observation the model reads next, the turn's reward,
    whether the episode is over, and anything else the environment wants recorded."""

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode of a world, created as ``cls(params, example, seed)``.

    Optional: ``final_reward() -> float | None``, a reward the environment owns at the end (a
    win), read once after the last turn; ``reference_answer() -> str | None``, one action that
    wins the game at once, when there is one (a task's reference answer, for SFT and checks).
    """

    def reset(self) -> str:
        """The first observation (instructions, the board): appended to the prompt."""
        ...

    def step(self, action_text: str) -> StepResult:
        """Play the model's turn (its text, as written) and say what it sees next."""
        ...

    def close(self) -> None:
        """Release what the episode holds; called once, even after a failure."""
        ...


class Simulator(Protocol):
    """A model an environment may talk to (a simulated user, a judge), given to an environment
    whose registration says ``EnvNeeds(judge=True)`` as ``cls(params, example, seed,
    simulator=...)``. Bounded in tokens by the run (``environment.simulator_max_new_tokens``)
    and in time by the step that calls it (``environment.timeout_s``)."""

    def reply(self, messages: list[dict[str, str]]) -> str:
        """The model's next message after chat ``messages`` ({"role", "content"} each)."""
        ...


class NoSimulator:
    """What an environment that needs a simulator gets where no model runs: where prompts are
    drawn and a single answer is checked (the API's task check, a verify without an episode).
    Its ``reset`` must not need one; a ``step`` that calls it fails its episode, saying why."""

    def reply(self, messages: list[dict[str, str]]) -> str:
        raise RuntimeError("no simulator model here: a run plays this environment with one")


def game_seed(example: Example) -> int:
    """The game ``example`` stands for: its ``data["seed"]`` (the environment task's), else a
    stable hash of its prompt, so a user's task whose examples carry no seed still fixes one
    game per example."""
    seed = example.data.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    digest = hashlib.sha1(example.prompt.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class Turn:
    """One turn as played: the model's action and what the environment answered."""

    action: str
    observation: str  # as the model reads it (cut to the runner's limit)
    reward: float
    done: bool
    seconds: float  # wall time of the environment's step
    error: str | None = None  # why the turn failed the episode; None for a turn that played
    cut_chars: int = 0  # how much shorter the observation is than the environment's (cut)
    info: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "observation": self.observation,
            "reward": self.reward,
            "done": self.done,
            "seconds": round(self.seconds, 6),
            "error": self.error,
            "cut_chars": self.cut_chars,
            "info": _jsonable(self.info),
        }


@dataclass(frozen=True)
class Episode:
    """One rollout's episode, stored with the rollout: rewards and verifiers may read it."""

    turns: tuple[Turn, ...]
    final_reward: float | None = None  # the environment's own, from ``final_reward()``
    failure: str | None = None  # why the episode failed (an environment fault); None if it ran
    first_observation: str = ""  # what ``reset`` returned
    truncated: bool = False  # the turn limit ended it before the environment said done

    def rewards(self) -> list[float]:
        """The per-turn rewards, in order."""
        return [turn.reward for turn in self.turns]

    @property
    def turn_count(self) -> int:
        return len(self.turns)

    @property
    def total_reward(self) -> float:
        """The episode's return: the environment's final reward when it gives one, else the
        sum of its turn rewards; 0 for a failed episode."""
        if self.failure is not None:
            return 0.0
        if self.final_reward is not None:
            return self.final_reward
        return sum(self.rewards())

    @property
    def succeeded(self) -> bool:
        """Ended without a fault, with a return that is a win (``SUCCESS_REWARD``)."""
        return self.failure is None and self.total_reward >= SUCCESS_REWARD

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_observation": self.first_observation,
            "turns": [turn.as_dict() for turn in self.turns],
            "final_reward": self.final_reward,
            "failure": self.failure,
            "truncated": self.truncated,
            "turn_count": self.turn_count,
            "total_reward": self.total_reward,
            "succeeded": self.succeeded,
        }


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: an environment's info may carry anything (numpy numbers,
    tuples, objects); what JSON cannot carry is kept as its repr, a non-finite float as None."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    return repr(value)
