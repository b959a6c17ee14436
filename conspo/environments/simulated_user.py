"""Ask the user: a simulated user (a model, ``EnvNeeds(judge=True)``) holds a secret word from a
short list; the policy asks it questions, one per turn, and wins by naming the word.

A conversation task with no external service (τ-bench's simulated user, made small): the
policy's turn is a question, or its answer as ``ANSWER: <word>``; the simulator, told the word
and to answer yes or no without saying it, replies. Reward 1 for the right word, which ends the
episode; a wrong answer ends it with 0. The game seed picks the word (a group's rollouts all ask
after the same one).
"""

from __future__ import annotations

import random
import re

from pydantic import Field

from conspo.environments.base import (
    EnvironmentParams,
    EnvNeeds,
    Simulator,
    StepResult,
    game_seed,
)
from conspo.registry import register_environment
from conspo.tasks.base import Example

WORDS = (
    "apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear", "plum",
)  # fmt: skip
ANSWER = re.compile(r"ANSWER:\s*([A-Za-z]+)", re.IGNORECASE)
# What the simulated user's reply may show of itself, at most (characters).
MAX_REPLY_CHARS = 300


class AskTheUserParams(EnvironmentParams):
    words: int = Field(
        4, ge=2, le=len(WORDS), description="How many candidate words (the first N of a list)."
    )


@register_environment(
    "ask_the_user",
    params=AskTheUserParams,
    description="A simulated user (a model) holds a secret word; ask it yes/no questions and"
    " answer 'ANSWER: <word>'. Needs environment.simulator.",
    needs=EnvNeeds(max_turns=8, judge=True),
)
class AskTheUser:
    def __init__(
        self, params: AskTheUserParams, example: Example, seed: int, *, simulator: Simulator
    ) -> None:
        self.candidates = WORDS[: params.words]
        self.word = random.Random(game_seed(example)).choice(self.candidates)
        self.simulator = simulator
        self.persona = (
            f"You are a user thinking of the word '{self.word}'. The assistant asks you"
            " questions about it: answer each with yes or no and a few words. Never write the"
            " word itself."
        )
        self.history: list[dict[str, str]] = []

    def reset(self) -> str:
        return (
            f"I am thinking of one of these words: {', '.join(self.candidates)}. Ask me"
            " questions to find out which, one per turn. When you know, write ANSWER: <word>."
        )

    def step(self, action_text: str) -> StepResult:
        found = ANSWER.search(action_text)
        if found:
            right = found.group(1).lower() == self.word
            verdict = "Right!" if right else f"No, it was {self.word}."
            return StepResult(verdict, reward=1.0 if right else 0.0, done=True)
        self.history.append({"role": "user", "content": action_text.strip()[:1000]})
        reply = self.simulator.reply([{"role": "system", "content": self.persona}, *self.history])
        said = re.compile(re.escape(self.word), re.IGNORECASE)  # the user keeps its secret
        reply = said.sub("…", reply)[:MAX_REPLY_CHARS] or "(no answer)"
        self.history.append({"role": "assistant", "content": reply})
        return StepResult(reply)

    def reference_answer(self) -> str:
        return f"ANSWER: {self.word}"

    def close(self) -> None:
        pass
