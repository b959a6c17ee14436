"""A gymnasium-style text environment, run unchanged.

The class (``entry_point``: "module:Class", in a plugin's package: ``targets``) is built with
``kwargs`` once per rollout, and played through the protocol:

- ``reset()`` returns the observation, or ``(observation, info)`` as gymnasium's does; it is
  given the game's seed (``reset(seed=...)``) when its signature takes one;
- ``step(action_text)`` returns ``(observation, reward, done, info)``, or gymnasium's
  ``(observation, reward, terminated, truncated, info)``, done being either of the two;
- ``close()``, if it has one.

Numpy scalars (a reward of ``np.float64``, a done of ``np.bool_``) are taken as the Python
values they hold; any other wrong type reaches the runner as returned, which fails the episode.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import Field, field_validator

from conspo.environments.base import EnvironmentParams, EnvNeeds, StepResult, game_seed
from conspo.environments.targets import check_target, load_class
from conspo.registry import register_environment
from conspo.tasks.base import Example

MAX_TURNS = 20


class GymParams(EnvironmentParams):
    entry_point: str = Field(
        description="The environment class as 'module:Class', in an installed plugin's package"
        " (e.g. 'my_envs.games:CoinFlipEnv')."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments its constructor is called with."
    )

    @field_validator("entry_point")
    @classmethod
    def _a_plugins_class(cls, value: str) -> str:
        return check_target(value)


@register_environment(
    "gym",
    params=GymParams,
    description="A gymnasium-style text environment of yours (step(text) -> observation,"
    " reward, done, info), named by module:Class.",
    needs=EnvNeeds(max_turns=MAX_TURNS),
)
class GymEnvironment:
    def __init__(self, params: GymParams, example: Example, seed: int) -> None:
        self.adapter = GymAdapter(load_class(params.entry_point)(**params.kwargs), example)

    def reset(self) -> str:
        return self.adapter.reset()

    def step(self, action_text: str) -> StepResult:
        return self.adapter.step(action_text)

    def close(self) -> None:
        self.adapter.close()


class GymAdapter:
    """The protocol over one gymnasium-style instance ``env`` (module docstring); a library
    caller may wrap an instance of its own with it, without a registration."""

    def __init__(self, env: Any, example: Example) -> None:
        self.env = env
        self.seed = game_seed(example)

    def reset(self) -> Any:
        result = self.env.reset(seed=self.seed) if _takes_seed(self.env.reset) else self.env.reset()
        if isinstance(result, tuple) and len(result) == 2:
            return result[0]
        return result

    def step(self, action_text: str) -> StepResult:
        result = self.env.step(action_text)
        if not isinstance(result, tuple) or len(result) not in (4, 5):
            raise TypeError(
                f"step returned {_shape(result)}; expected (observation, reward, done, info)"
                " or (observation, reward, terminated, truncated, info)"
            )
        if len(result) == 4:
            observation, reward, done, info = result
        else:
            observation, reward, terminated, truncated, info = result
            terminated, truncated = _plain(terminated), _plain(truncated)
            done = (
                terminated or truncated
                if isinstance(terminated, bool) and isinstance(truncated, bool)
                else terminated  # not bools: the runner refuses it as such
            )
        info = {} if info is None else info
        return StepResult(observation, _plain(reward), _plain(done), info)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _takes_seed(fn: Any) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in parameters)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds; anything else as it is."""
    if type(value).__module__ == "numpy" and callable(getattr(value, "item", None)):
        return value.item()
    return value


def _shape(value: object) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"
