"""A TRL ``environment_factory`` class, written the way TRL's docs show (nothing in it for
ConSPO Lab): ``reset()`` opens an episode, each public method is a tool the model calls with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, ``get_reward()`` scores it.

A run plays it through the platform's adapter, the class unchanged:
``task: {name: environment, params: {environment: trl,
  environment_params: {entry_point: "conspo_example_plugin.trl_env:GuessEnv"}}}``
(the adapter takes classes from a loaded plugin's package only).
"""

from __future__ import annotations


class GuessEnv:
    def __init__(self):
        self.secret = 0
        self.reward = 0.0

    def reset(self, **kwargs) -> str | None:
        self.secret = kwargs["seed"] % 10 + 1
        self.reward = 0.0
        return "Guess the secret number between 1 and 10 with the `guess` tool."

    def guess(self, number: int) -> str:
        """
        Guess the secret number.

        Args:
            number: The number you guess, between 1 and 10.

        Returns:
            Whether the secret is higher, lower, or your guess is correct.
        """
        if number == self.secret:
            self.reward = 1.0
            return "Correct!"
        if not 1 <= number <= 10:
            raise ValueError("The number must be between 1 and 10.")
        return "Higher." if self.secret > number else "Lower."

    def get_reward(self) -> float:
        return self.reward
