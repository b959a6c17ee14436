"""Reward functions: what a rollout earns, several per run, each with a weight.

    @register_reward("format", params=FormatParams, description="...")
    def format_reward(completion, example, context, params: FormatParams) -> float: ...

    rewards = build_rewards(cfg.rewards)
    scores = score_rollouts(rewards, texts, examples, lengths, RewardContext(task, 16))

A run lists its rewards in ``RunConfig.rewards`` (``[{name, weight, params}]``); the reward the
objective sees is the shaped reward R = Σ weight · reward (docs/objectives.md §5.3), and each
reward's mean over the step's rollouts is logged as ``reward/<name>``. ``verifier`` is the task's
verify, the verified outcome O: every run has it (the config adds it with weight 1 when it is not
listed), and O alone decides who is positive, whatever the other rewards and the weights are.

Built-ins: ``verifier``, ``format`` (one \\boxed{} answer, or a regex), ``length`` (DAPO's soft
overlong penalty) and ``process`` (a process signal Φ the task provides: RLVP's R = O + βΦ).
Pure Python on strings, no torch: the API validates configs against these parameter models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conspo.registry import get_reward, register_reward
from conspo.tasks.base import Example, Task

if TYPE_CHECKING:
    from conspo.config import RewardConfig

VERIFIER = "verifier"
LENGTH = "length"
PROCESS = "process"
BOXED = "\\boxed{"


@dataclass(frozen=True)
class RewardContext:
    """What a reward may need beyond the completion and its example."""

    task: Task
    max_new_tokens: int  # the response cap L_max
    length: int = 0  # this rollout's response tokens, EOS included


RewardFn = Callable[[str, Example, RewardContext, BaseModel], float]


class ProcessSignalTask(Task, Protocol):
    def process_reward(self, completion: str, example: Example) -> float:
        """Φ ∈ [0, 1]: how much of the way to the answer the completion went (partial credit)."""
        ...


class RewardParams(BaseModel):
    """Base of every reward's parameter model: unknown keys are errors, as in the whole config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# Built-in rewards
# --------------------------------------------------------------------------------------------


@register_reward(
    VERIFIER,
    params=RewardParams,
    description="The task's verifier: the verified outcome O (1 correct, 0 wrong). Every run has"
    " it; it alone decides who is positive.",
)
def verifier_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    return float(context.task.verify(completion, example))


class FormatParams(RewardParams):
    pattern: str | None = Field(
        None,
        max_length=500,
        description="A regular expression the whole completion (surrounding whitespace"
        " stripped) must match; null: the completion holds exactly one complete \\boxed{...}.",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
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
        return float(re.fullmatch(params.pattern, completion.strip(), flags=re.DOTALL) is not None)
    return float(has_one_boxed_answer(completion))


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


class LengthParams(RewardParams):
    buffer: int = Field(
        8,
        ge=1,
        le=32_768,
        description="L_cache: length of the penalty zone before sampling.max_new_tokens (must be"
        " smaller than it). The penalty's size at the cap is the reward's weight.",
    )


@register_reward(
    LENGTH,
    params=LengthParams,
    description="DAPO's soft overlong penalty: 0 up to max_new_tokens − buffer tokens, then"
    " linear down to −1 at max_new_tokens (times the weight).",
)
def length_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    assert isinstance(params, LengthParams)
    start = context.max_new_tokens - params.buffer
    return -min(max(context.length - start, 0) / params.buffer, 1.0)


@register_reward(
    PROCESS,
    params=RewardParams,
    default_weight=0.2,
    task_method="process_reward",
    description="RLVP-style partial credit (designed from the abstract): the task's process"
    " signal Φ ∈ [0, 1]; with weight β the shaped reward is O + βΦ (default β 0.2). Only for a"
    " task that provides one (arith: the share of the intermediate results it writes).",
)
def process_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    task: ProcessSignalTask = context.task  # type: ignore[assignment]  # the config checked it
    phi = float(task.process_reward(completion, example))
    if not 0.0 <= phi <= 1.0:
        raise ValueError(f"task {task.name!r}: process_reward returned {phi}, outside [0, 1]")
    return phi


# --------------------------------------------------------------------------------------------
# Scoring a batch of rollouts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightedReward:
    name: str
    weight: float
    fn: RewardFn
    params: BaseModel


def build_rewards(specs: Sequence[RewardConfig]) -> list[WeightedReward]:
    """The configured rewards, their parameters resolved (the config already validated them)."""
    built = []
    for spec in specs:
        registered = get_reward(spec.name)
        params = registered.params.model_validate(spec.params)
        weight = registered.default_weight if spec.weight is None else spec.weight
        built.append(WeightedReward(spec.name, weight, registered.fn, params))
    return built


@dataclass(frozen=True)
class RewardScores:
    """Per rollout: the verified outcome, each reward, and their weighted sum."""

    outcome: list[float]
    parts: dict[str, list[float]]
    shaped: list[float]


def score_rollouts(
    rewards: Sequence[WeightedReward],
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
) -> RewardScores:
    """Every reward of every rollout; ``rewards`` must hold the verifier (the config adds it)."""
    parts: dict[str, list[float]] = {}
    for reward in rewards:
        parts[reward.name] = [
            reward.fn(text, example, _with_length(context, n), reward.params)
            for text, example, n in zip(completions, examples, lengths, strict=True)
        ]
    shaped = [sum(r.weight * parts[r.name][i] for r in rewards) for i in range(len(completions))]
    return RewardScores(outcome=parts[VERIFIER], parts=parts, shaped=shaped)


def _with_length(context: RewardContext, length: int) -> RewardContext:
    return RewardContext(context.task, context.max_new_tokens, length)
