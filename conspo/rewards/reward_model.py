"""The ``reward_model`` reward: a trained reward model's score of each rollout.

    rewards: [{name: verifier}, {name: reward_model, params: {model: runs/12/rm}}]

The model is a sequence-score model (``AutoModelForSequenceClassification`` with one label:
what the ``reward_model`` job kind and TRL's RewardTrainer save), named as ``model.name`` is (a
model-store name, a model directory, a hub id: the same sources allow it). The trainer loads it
once at set-up (``conspo.models.scoring``), and this batched reward calls it through the
context's ``models``, so this module stays torch-free. The score is a proxy: the verifier alone
still decides who is positive.

A rollout the model gives no finite score (NaN, inf) fails alone; a call that runs past
``timeout_s`` fails the batch with the reason, and the step goes on with the other rewards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from conspo.input_checks import Label
from conspo.registry import register_reward
from conspo.rewards.base import RewardContext, RewardFailed, RewardParams
from conspo.rewards.info_gain import group_normalised
from conspo.tasks.base import Example


class RewardModelParams(RewardParams):
    # the fields naming a model: checked at submit time like model.name (backend.runs.inputs),
    # loaded at set-up (conspo.models.scoring.load_reward_models)
    model_names: ClassVar[tuple[str, ...]] = ("model",)

    model: Label = Field(
        min_length=1,
        max_length=300,
        description="The reward model: a model-store name, a local model directory or a hub id"
        " (as model.name), holding a sequence-classification head with one label (what the"
        " reward_model job kind trains); loaded once, on the policy's device in its dtype.",
    )
    normalise: Literal["none", "group"] = Field(
        "none",
        description="none: the model's own scores; group: (r − mean) / std within each group"
        " (0 for a group whose scores are equal), so the reward's scale is the group's spread.",
    )
    max_tokens: int = Field(
        1024,
        ge=16,
        le=32768,
        description="Tokens of one scored text at most (the conversation, prompt and"
        " completion): longer ones lose the prompt's start first.",
    )
    batch_size: int = Field(
        8, ge=1, le=1024, description="Texts per forward pass of the reward model."
    )
    timeout_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="Seconds one scoring call may take (a step's batch of rollouts, per"
        " sampling round): past it the batch gets no reward from this model, the reason is"
        " logged and the step goes on.",
    )


@register_reward(
    "reward_model",
    params=RewardModelParams,
    batched=True,
    description="A trained reward model's score of each rollout (the proxy reward of RLHF):"
    " the model reads the prompt and the completion as a conversation and gives one scalar."
    " Optionally normalised within the group. Costs one no-grad forward pass of the reward"
    " model per rollout; the verifier still decides who is positive.",
)
def reward_model_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
    params: BaseModel,
) -> list[float]:
    assert isinstance(params, RewardModelParams)
    if context.models is None:
        raise RewardFailed("the reward_model reward calls a model: its context needs the models")
    deadline = time.monotonic() + params.timeout_s
    try:
        scores = context.models.score(
            params.model,
            [question(ex) for ex in examples],
            completions,
            max_tokens=params.max_tokens,
            batch_size=params.batch_size,
            deadline=deadline,
        )
    except TimeoutError as exc:
        raise RewardFailed(
            f"reward model {params.model!r} ran past timeout_s ({params.timeout_s:g} s): {exc}"
        ) from exc
    if params.normalise == "group":
        return finite_group_normalised(scores, context.group_size)
    return scores


def question(example: Example) -> str:
    """The prompt the reward model reads: the task's own question, before this run's prompt
    template and the policy's chat template rendered it (``PromptedTask`` keeps the original
    example), so the reward model's chat template does not wrap the policy's, and the same
    answer scores the same whatever prompt the policy was trained with."""
    original = example.data.get("_original")
    return original.prompt if isinstance(original, Example) else example.prompt


def finite_group_normalised(scores: Sequence[float], group_size: int) -> list[float]:
    """``group_normalised`` over each group's finite scores; a score that is not finite stays
    as it is (its rollout alone fails: ``score_rollouts``), not spoiling its group's others."""
    out = list(scores)
    for g in range(0, len(scores), group_size):
        rows = [i for i in range(g, min(g + group_size, len(scores))) if math.isfinite(scores[i])]
        if rows:
            normalised = group_normalised([scores[i] for i in rows], len(rows))
            for i, value in zip(rows, normalised, strict=True):
                out[i] = value
    return out
