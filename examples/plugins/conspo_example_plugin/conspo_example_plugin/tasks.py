"""count_letter: "How many times does the letter r appear in 'strawberry'?" → "3".

A procedural task: problems are drawn from a seed, and the held-out split is a fixed hashed
subset of the problem space (``ProceduralTask``), so training never sees an evaluation problem.
"""

from __future__ import annotations

import random
import string

from pydantic import Field

from conspo.registry import register_task
from conspo.tasks.base import Example, ProceduralTask, TaskParams

WORDS = [
    "strawberry", "banana", "mississippi", "committee", "bookkeeper", "parallel", "assessment",
    "balloon", "coffee", "letter", "address", "possession", "tattoo", "referee", "occurrence",
    "millennium", "accommodate", "embarrass", "necessary", "successful",
]  # fmt: skip


class CountLetterParams(TaskParams):
    random_words: bool = Field(
        False, description="Draw random letter strings instead of English words (harder)."
    )
    max_length: int = Field(10, ge=3, le=40, description="Length of a random string.")


@register_task(
    "count_letter",
    params=CountLetterParams,
    description="Count a letter's occurrences in a word (example plugin).",
)
class CountLetterTask(ProceduralTask):
    name = "count_letter"

    def __init__(self, params: CountLetterParams) -> None:
        self.params = params

    def sample(self, rng: random.Random) -> Example:
        if self.params.random_words:
            length = rng.randint(3, self.params.max_length)
            word = "".join(rng.choice(string.ascii_lowercase[:6]) for _ in range(length))
        else:
            word = rng.choice(WORDS)
        letter = rng.choice(sorted(set(word)))
        count = word.count(letter)
        prompt = f"How many times does the letter {letter} appear in '{word}'? Answer: "
        return Example(prompt=prompt, answer=str(count), data={"count": count})

    def verify(self, completion: str, example: Example) -> float:
        """1.0 when the first number written is the count."""
        digits = ""
        for char in completion.strip():
            if char.isdigit():
                digits += char
            elif digits:
                break
        return float(digits != "" and int(digits) == example.data["count"])
