"""Reward functions: what a rollout earns, several per run, each with a weight.

    @register_reward("format", params=FormatParams, description="...")
    def format_reward(completion, example, context, params: FormatParams) -> float: ...

One module per reward: ``verifier`` (the task's verify, the verified outcome O every run has),
``format`` (one \\boxed{} answer, or a regex), ``length`` (DAPO's soft overlong penalty),
``process`` (a process signal Φ the task provides: RLVP's R = O + βΦ), ``info_gain`` (ISPO's
sequence signal, a batched reward that reads the policy), ``reward_model`` (a trained
reward model's score, through the run's models: ``RewardContext.models``) and ``judge`` (a
generative judge's critiques and scores, through the same models); ``base`` holds what
they share and scores a batch (``build_rewards``, ``score_rollouts``). Adding one: a new module
here with a parameter model and a function under ``@register_reward``; the registry imports
every module of this package, so nothing else changes. Torch-free at import: the API validates
configs with it.
"""

from __future__ import annotations

# The trainer and the training loop import the scoring machinery from the package.
from conspo.rewards.base import (
    ContinuationScorer,
    RewardContext,
    RewardFailed,
    RewardParams,
    RewardScores,
    WeightedReward,
    build_rewards,
    score_rollouts,
)

__all__ = [
    "ContinuationScorer",
    "RewardContext",
    "RewardFailed",
    "RewardParams",
    "RewardScores",
    "WeightedReward",
    "build_rewards",
    "score_rollouts",
]
