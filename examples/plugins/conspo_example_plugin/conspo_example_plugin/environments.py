"""nim: take 1 to 3 sticks a turn against a fixed opponent; whoever takes the last stick wins.

A multi-turn environment of the platform's protocol (``conspo.environments``): one instance per
rollout, created with the example it plays; ``reset`` says the rules and the pile, ``step``
plays the model's move and the opponent's answer. The example's game seed fixes the pile (every
rollout of a group plays the same game). A move that is not 1 to 3 sticks (or more than are
left) is invalid: the model is told so and loses that turn.

A run plays it as ``task: {name: environment, params: {environment: nim}}``, or as this
plugin's own task ``nim_games`` (the environment task with nim as its default), e.g.
``task: {name: nim_games}``.
"""

from __future__ import annotations

import random
import re

from pydantic import Field

from conspo.environments.base import EnvironmentParams, EnvNeeds, StepResult, game_seed
from conspo.registry import register_environment, register_task
from conspo.tasks.base import Example
from conspo.tasks.environment import EnvironmentTask, EnvironmentTaskParams

MOVE = re.compile(r"\d+")


class NimParams(EnvironmentParams):
    min_sticks: int = Field(5, ge=1, le=100, description="The smallest starting pile.")
    max_sticks: int = Field(12, ge=1, le=100, description="The largest starting pile.")


@register_environment(
    "nim",
    params=NimParams,
    description="Nim against a fixed opponent: take 1-3 sticks a turn, the last stick wins"
    " (example plugin).",
    needs=EnvNeeds(max_turns=20),
)
class Nim:
    def __init__(self, params: NimParams, example: Example, seed: int) -> None:
        rng = random.Random(game_seed(example))
        self.sticks = rng.randint(params.min_sticks, max(params.min_sticks, params.max_sticks))
        self.won: bool | None = None

    def reset(self) -> str:
        return (
            f"Nim: there are {self.sticks} sticks. Each turn take 1, 2 or 3; whoever takes the"
            " last stick wins. You go first: write how many you take."
        )

    def step(self, action_text: str) -> StepResult:
        numbers = MOVE.findall(action_text)
        take = int(numbers[-1]) if numbers else 0
        if not 1 <= take <= min(3, self.sticks):
            return StepResult(
                f"Take 1 to {min(3, self.sticks)} sticks; {self.sticks} are left.",
                info={"invalid": True},
            )
        self.sticks -= take
        if self.sticks == 0:
            self.won = True
            return StepResult("You took the last stick: you win!", reward=1.0, done=True)
        answer = self.sticks % 4 or 1  # the opponent leaves a multiple of 4 when it can
        self.sticks -= answer
        if self.sticks == 0:
            self.won = False
            return StepResult(f"I take {answer}: I took the last stick, you lose.", done=True)
        return StepResult(f"I take {answer}. {self.sticks} sticks are left: your move.")

    def reference_answer(self) -> str:
        """The first move that leaves a multiple of 4 (any move, when there is none)."""
        return str(self.sticks % 4 or 1)

    def close(self) -> None:
        pass


class NimGamesParams(EnvironmentTaskParams):
    environment: str = Field("nim", description="The environment played: nim by default.")


@register_task(
    "nim_games",
    params=NimGamesParams,
    description="Games of nim, one pile per problem, 10% held out (example plugin).",
)
class NimGames(EnvironmentTask):
    name = "nim_games"
