"""Guess the number: the smallest game with per-turn feedback ("higher", "lower").

The example fixes the secret (its game seed), so a group's rollouts all guess the same number.
A turn's action is the model's text; its last whole number is the guess. A right guess earns 1
and ends the episode; any other turn earns 0; a turn with no number, or one out of range, is
told so and costs the turn.
"""

from __future__ import annotations

import random
import re

from pydantic import Field, model_validator

from conspo.environments.base import EnvironmentParams, EnvNeeds, StepResult, game_seed
from conspo.registry import register_environment
from conspo.tasks.base import Example

NUMBER = re.compile(r"-?\d+")
MAX_TURNS = 10


class GuessNumberParams(EnvironmentParams):
    low: int = Field(1, ge=-1_000_000, le=1_000_000, description="The smallest secret number.")
    high: int = Field(
        100, ge=-1_000_000, le=1_000_000, description="The largest secret number (inclusive)."
    )

    @model_validator(mode="after")
    def _range_not_empty(self) -> GuessNumberParams:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


@register_environment(
    "guess_number",
    params=GuessNumberParams,
    description="Guess a secret whole number in [low, high] from 'higher'/'lower' feedback;"
    " reward 1 for the right guess, which ends the episode.",
    needs=EnvNeeds(max_turns=MAX_TURNS),
)
class GuessNumber:
    def __init__(self, params: GuessNumberParams, example: Example, seed: int) -> None:
        self.params = params
        self.secret = random.Random(game_seed(example)).randint(params.low, params.high)
        self.guesses = 0

    def reset(self) -> str:
        low, high = self.params.low, self.params.high
        return (
            f"I am thinking of a whole number between {low} and {high}. Guess it: each turn,"
            " write your guess as a number and I will say whether mine is higher or lower."
        )

    def step(self, action_text: str) -> StepResult:
        numbers = NUMBER.findall(action_text)
        if not numbers:
            return StepResult(
                "No number found in your answer: write your guess as a number.",
                info={"invalid": True},
            )
        guess = int(numbers[-1])
        low, high = self.params.low, self.params.high
        if not low <= guess <= high:
            return StepResult(
                f"{guess} is outside the range: guess between {low} and {high}.",
                info={"invalid": True},
            )
        self.guesses += 1
        if guess == self.secret:
            return StepResult(f"{guess} is right!", reward=1.0, done=True)
        direction = "higher" if self.secret > guess else "lower"
        return StepResult(f"{guess} is wrong: my number is {direction}.")

    def reference_answer(self) -> str:
        """The guess that wins at once."""
        return str(self.secret)

    def close(self) -> None:
        pass
