"""The ``format`` reward: 1 when the completion has the expected form (one \\boxed{} answer, or a
user's regular expression), else 0."""

from __future__ import annotations

import regex  # type: ignore[import-untyped]
from pydantic import BaseModel, Field, field_validator

from conspo.registry import register_reward
from conspo.rewards.base import BOXED, RewardContext, RewardFailed, RewardParams
from conspo.tasks.base import Example

# A user's pattern may backtrack exponentially ("(.+)+#" on a line without "#"): each match is
# bounded (the ``regex`` package's timeout) and runs with the GIL released (``concurrent``), so
# the worker's heartbeat and cancel thread keep running beside it. A sane pattern matches a
# completion in microseconds.
PATTERN_TIMEOUT_S = 0.1
PATTERN_FLAGS = regex.DOTALL | regex.VERSION0  # VERSION0: the syntax of Python's re


class FormatParams(RewardParams):
    pattern: str | None = Field(
        None,
        max_length=500,
        description="A regular expression the whole completion (surrounding whitespace"
        " stripped) must match; null: the completion holds exactly one complete \\boxed{...}."
        f" A match taking over {PATTERN_TIMEOUT_S} s fails: the rollout scores 0 on it.",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                regex.compile(pattern, PATTERN_FLAGS)
            except regex.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return pattern


@register_reward(
    "format",
    params=FormatParams,
    description="1 when the completion has the expected form (exactly one \\boxed{} answer, or"
    " matches params.pattern), else 0.",
)
def format_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    assert isinstance(params, FormatParams)
    if params.pattern is not None:
        return float(matches(params.pattern, completion.strip()))
    return float(has_one_boxed_answer(completion))


def matches(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches the whole of ``text``; ``RewardFailed`` past the timeout."""
    compiled = regex.compile(pattern, PATTERN_FLAGS)  # regex caches compiled patterns
    try:
        found = compiled.fullmatch(text, timeout=PATTERN_TIMEOUT_S, concurrent=True)
    except TimeoutError:
        raise RewardFailed(f"params.pattern took over {PATTERN_TIMEOUT_S} s") from None
    return found is not None


def has_one_boxed_answer(text: str) -> bool:
    """Exactly one \\boxed{ in ``text``, and its braces close."""
    if text.count(BOXED) != 1:
        return False
    depth = 0
    for char in text[text.index(BOXED) + len(BOXED) - 1 :]:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return True
    return False
