"""Environments: multi-turn worlds a rollout plays (``base``: the protocol and its records;
``runner``: playing one with its faults contained), a module each for the built-in ones and the
adapters to what users already have (``gym``, ``trl``, ``textarena``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conspo.environments.base import (
    Environment,
    EnvironmentParams,
    EnvNeeds,
    Episode,
    StepResult,
    Turn,
    game_seed,
)
from conspo.environments.runner import (
    EnvironmentFault,
    EnvironmentLimits,
    EpisodeRunner,
    play_episode,
    play_turn,
)
from conspo.registry import get_environment
from conspo.tasks.base import Example

__all__ = [
    "EnvNeeds",
    "Environment",
    "EnvironmentFault",
    "EnvironmentLimits",
    "EnvironmentParams",
    "Episode",
    "EpisodeRunner",
    "StepResult",
    "Turn",
    "environment_factory",
    "game_seed",
    "play_episode",
    "play_turn",
]


def environment_factory(
    name: str, params: dict[str, Any] | None, example: Example, seed: int
) -> Callable[[], Environment]:
    """What ``EpisodeRunner`` creates its environment with: registered environment ``name``
    with ``params`` validated by its model (a bad one raises here, before any episode), built
    for ``example`` and the rollout's ``seed`` when called."""
    entry = get_environment(name)
    validated = entry.params.model_validate(params or {})
    return lambda: entry.cls(validated, example, seed)
