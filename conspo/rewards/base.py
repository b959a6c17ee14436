"""What every reward shares: the context a reward reads, its parameter base, the failure it may
raise, and scoring a batch of rollouts with the configured rewards.

    rewards = build_rewards(cfg.rewards)
    scores = score_rollouts(rewards, texts, examples, lengths, RewardContext(task, 16))

A run lists its rewards in ``RunConfig.rewards`` (``[{name, weight, params}]``); the reward the
objective sees is the shaped reward R = Σ weight · reward (docs/objectives.md §7), and each
reward's mean over the step's rollouts is logged as ``reward/<name>``. ``verifier`` is the task's
verify, the verified outcome O: every run has it (the config adds it with weight 1 when it is not
listed), and O alone decides who is positive, whatever the other rewards and the weights are.
Pure Python on strings, no torch: the API validates configs against the parameter models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from conspo.registry import get_reward
from conspo.tasks.base import Example, Task, prefetch

if TYPE_CHECKING:
    from conspo.config import RewardConfig

log = logging.getLogger(__name__)

VERIFIER = "verifier"  # the reward whose value is the verified outcome (conspo.rewards.verifier)
BOXED = "\\boxed{"  # the answer's marker, which format and info_gain both look for


# (rows, contexts, continuations) → for each row, the mean log π(continuation | the row's prompt
# followed by context), at the sampling temperature, without grad.
ContinuationScorer = Callable[[Sequence[int], Sequence[str], Sequence[str]], list[float]]


@dataclass(frozen=True)
class RewardContext:
    """What a reward may need beyond the completion and its example."""

    task: Task
    max_new_tokens: int  # the response cap L_max
    # this rollout's response tokens, EOS included, the model's own only: a tool's output is
    # not counted (as in len/*); per-rollout rewards
    length: int = 0
    group_size: int = 1  # rows [i*G, (i+1)*G) share a prompt (batched rewards)
    continuation_logprob: ContinuationScorer | None = None  # the policy, for batched rewards


class RewardFailed(Exception):
    """A reward that could not be computed for one rollout: the rollout gets 0 from it, and
    ``score_rollouts`` counts and logs such rollouts per reward."""


class RewardParams(BaseModel):
    """Base of every reward's parameter model: unknown keys are errors, as in the whole config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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
    """Every reward of every rollout; ``rewards`` must hold the verifier (the config adds it).
    The task first sees the whole batch (its optional ``prefetch``: the code task runs the
    batch's sandboxes together)."""
    parts: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    prefetch(context.task, completions, examples)
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
