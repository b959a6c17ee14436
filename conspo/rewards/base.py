"""Reward functions: what a rollout earns, several per run, each with a weight.

    @register_reward("format", params=FormatParams, description="...")
    def format_reward(completion, example, context, params: FormatParams) -> float: ...

    rewards = build_rewards(cfg.rewards)
    scores = score_rollouts(rewards, texts, examples, lengths, RewardContext(task, 16))

A run lists its rewards in ``RunConfig.rewards`` (``[{name, weight, params}]``); the reward the
objective sees is the shaped reward R = Σ weight · reward (docs/objectives.md §7), and each
reward's mean over the step's rollouts is logged as ``reward/<name>``. ``verifier`` is the task's
verify, the verified outcome O: every run has it (the config adds it with weight 1 when it is not
listed), and O alone decides who is positive, whatever the other rewards and the weights are.

Built-ins: ``verifier``, ``format`` (one \\boxed{} answer, or a regex), ``length`` (DAPO's soft
overlong penalty), ``process`` (a process signal Φ the task provides: RLVP's R = O + βΦ) and
``info_gain`` (ISPO's sequence signal, a batched reward that reads the policy through the
context's ``continuation_logprob``, which the trainer supplies).
Pure Python on strings, no torch: the API validates configs against these parameter models.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import regex  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, field_validator

from conspo.registry import get_reward, register_reward
from conspo.tasks.base import Example, Task

if TYPE_CHECKING:
    from conspo.config import RewardConfig

log = logging.getLogger(__name__)

VERIFIER = "verifier"
LENGTH = "length"
PROCESS = "process"
BOXED = "\\boxed{"


# (rows, contexts, continuations) → for each row, the mean log π(continuation | the row's prompt
# followed by context), at the sampling temperature, without grad.
ContinuationScorer = Callable[[Sequence[int], Sequence[str], Sequence[str]], list[float]]


@dataclass(frozen=True)
class RewardContext:
    """What a reward may need beyond the completion and its example."""

    task: Task
    max_new_tokens: int  # the response cap L_max
    length: int = 0  # this rollout's response tokens, EOS included (per-rollout rewards)
    group_size: int = 1  # rows [i*G, (i+1)*G) share a prompt (batched rewards)
    continuation_logprob: ContinuationScorer | None = None  # the policy, for batched rewards


class ProcessSignalTask(Task, Protocol):
    def process_reward(self, completion: str, example: Example) -> float:
        """Φ ∈ [0, 1]: how much of the way to the answer the completion went (partial credit)."""
        ...


class RewardFailed(Exception):
    """A reward that could not be computed for one rollout: the rollout gets 0 from it, and
    ``score_rollouts`` counts and logs such rollouts per reward."""


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
    " task that provides one (arith: the share of the intermediate results it writes;"
    " reasoning_gym: the generator's partial score).",
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
# ISPO's sequence signal (designed from the abstract: docs/objectives.md §5.2)
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Scoring a batch of rollouts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightedReward:
    name: str
    weight: float
    fn: Callable[..., Any]  # per rollout, or batched (``batched``)
    params: BaseModel
    batched: bool = False


def build_rewards(specs: Sequence[RewardConfig]) -> list[WeightedReward]:
    """The configured rewards, their parameters resolved (the config already validated them)."""
    built = []
    for spec in specs:
        registered = get_reward(spec.name)
        params = spec.reward_params()
        weight = registered.default_weight if spec.weight is None else spec.weight
        built.append(WeightedReward(spec.name, weight, registered.fn, params, registered.batched))
    return built


@dataclass(frozen=True)
class RewardScores:
    """Per rollout: the verified outcome, each reward, and their weighted sum."""

    outcome: list[float]
    parts: dict[str, list[float]]
    shaped: list[float]
    failed: dict[str, int] = field(default_factory=dict)  # reward → rollouts it failed on


def score_rollouts(
    rewards: Sequence[WeightedReward],
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
) -> RewardScores:
    """Every reward of every rollout; ``rewards`` must hold the verifier (the config adds it)."""
    parts: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for reward in rewards:
        if reward.batched:
            values = reward.fn(completions, examples, lengths, context, reward.params)
            parts[reward.name] = [float(v) for v in values]
            continue
        parts[reward.name] = []
        for text, example, n in zip(completions, examples, lengths, strict=True):
            try:
                value = reward.fn(text, example, replace(context, length=n), reward.params)
            except RewardFailed as exc:
                value, failed[reward.name] = 0.0, failed.get(reward.name, 0) + 1
                why = str(exc)
            parts[reward.name].append(value)
        if reward.name in failed:
            log.warning(
                "reward %s failed on %d of %d rollouts (scored 0): %s",
                reward.name, failed[reward.name], len(completions), why,
            )  # fmt: skip
    shaped = [sum(r.weight * parts[r.name][i] for r in rewards) for i in range(len(completions))]
    return RewardScores(outcome=parts[VERIFIER], parts=parts, shaped=shaped, failed=failed)
