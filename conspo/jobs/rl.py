"""The ``rl`` job kind: the RLVR trainer itself (``conspo.training.trainer``); it has no
kind_params."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from conspo.registry import register_job_kind

if TYPE_CHECKING:
    from conspo.config import RunConfig
    from conspo.training.loop import TrainResult


class RLParams(BaseModel):
    """The algorithm's hyperparameters are ``params``; this kind takes none of its own."""

    model_config = ConfigDict(extra="forbid")


@register_job_kind(
    "rl",
    params=RLParams,
    description="RL with verifiable rewards: sample groups, verify, train the objective"
    " (config.algorithm).",
    sections=("algorithm", "sampling", "rewards"),
    distributed=True,
    example_params={},  # none of its own: the run's algorithm and rewards are what it trains
)
def train_rl(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.trainer import train

    return train(config, *args, **kwargs)
