"""The ``info_gain`` reward: ISPO's sequence signal (designed from the abstract:
docs/objectives.md §5.2), a batched reward that reads the policy through the context's
``continuation_logprob``, which the trainer supplies."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from conspo.registry import register_reward
from conspo.rewards.base import BOXED, RewardContext, RewardParams
from conspo.tasks.base import Example

# A reward std at or below this counts as zero (a group whose signals are all equal gets 0).
STD_EPS = 1e-6
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class InfoGainParams(RewardParams):
    normalise: Literal["group", "none"] = Field(
        "group",
        description="Normalise the information gain within each group ((I − mean) / std, 0 for"
        " a group whose gains are equal), or use it raw. Designed from the abstract.",
    )


@register_reward(
    "info_gain",
    params=InfoGainParams,
    default_weight=0.1,
    batched=True,
    description="ISPO's sequence signal (designed from the abstract): how much the reasoning z"
    " raises the answer a's log-prob, I = mean log π(a | q, z) − mean log π(a | q), normalised"
    " within the group; weight β_seq (default 0.1). 0 for a rollout without reasoning before its"
    " answer (a bare answer, as in arith). Costs two no-grad forward passes per step.",
)
def info_gain_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
    params: BaseModel,
) -> list[float]:
    assert isinstance(params, InfoGainParams)
    if context.continuation_logprob is None:
        raise ValueError("the info_gain reward reads the policy: its context needs a scorer")
    spans = [answer_span(text) for text in completions]
    rows = [i for i, span in enumerate(spans) if span and completions[i][: span[0]].strip()]
    reasoning = [completions[i][: spans[i][0]] for i in rows]  # type: ignore[index]
    answers = [completions[i][slice(*spans[i])] for i in rows]  # type: ignore[misc]
    after = context.continuation_logprob(rows, reasoning, answers)
    direct = context.continuation_logprob(rows, [""] * len(rows), answers)
    info = [0.0] * len(completions)
    for i, a, d in zip(rows, after, direct, strict=True):
        info[i] = a - d
    return group_normalised(info, context.group_size) if params.normalise == "group" else info


def answer_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the final answer in ``text``: the content of its last complete
    \\boxed{...}, else its last number; None when there is neither (or the box is empty)."""
    start = text.rfind(BOXED)
    if start >= 0:
        depth, begin = 1, start + len(BOXED)
        for end in range(begin, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                return (begin, end) if end > begin else None
    numbers = list(NUMBER.finditer(text))
    return numbers[-1].span() if numbers else None


def group_normalised(values: Sequence[float], group_size: int) -> list[float]:
    """(v − group mean) / group population std per group of ``group_size`` consecutive values;
    0 for a group whose std is at most STD_EPS."""
    out: list[float] = []
    for g in range(0, len(values), group_size):
        group = values[g : g + group_size]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((v - mean) ** 2 for v in group) / len(group))
        out += [(v - mean) / std if std > STD_EPS else 0.0 for v in group]
    return out
