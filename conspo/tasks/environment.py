"""Games to play: the task that serves an environment's seeds.

    {"name": "environment", "params": {"environment": "guess_number",
                                       "environment_params": {"high": 20}}}

Each problem is one game: a seed in [0, seeds), which the environment builds its game from
(``conspo.environments.base.game_seed``), so every rollout of a group plays the same game, and
about a tenth of the seeds (hashed, as every procedural task's held-out split is) are held-out
games, never trained on. The prompt only names the game: what the model reads is the
environment's first observation, which the rollout appends to it (``reset``).

Until the rollout plays environments turn by turn, ``verify`` plays the completion as the
episode's single action: 1.0 when that wins the game (``Episode.succeeded``). The reference
answer is the environment's ``reference_answer()`` (one winning action) when it has one.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from conspo.environments.base import Episode
from conspo.environments.runner import EnvironmentLimits, EpisodeRunner
from conspo.registry import ENVIRONMENTS, get_environment, json_numbers, register_task
from conspo.tasks.base import Example, ProceduralTask, TaskParams

# One call of a verifying episode (create, reset, the single step): a game that takes longer
# fails that answer, not the run.
VERIFY_TIMEOUT_S = 10.0


class EnvironmentTaskParams(TaskParams):
    environment: str = Field(
        "guess_number", description="The registered environment whose games are played."
    )
    environment_params: dict[str, Any] = Field(
        default_factory=dict,
        validate_default=True,  # resolved to the environment's defaults, as given ones are
        description="The environment's parameters (its defaults for those left out).",
    )
    seeds: int = Field(
        100_000, ge=100, le=2**31, description="Games are seeds 0 … seeds-1; about 10% held out."
    )

    @field_validator("environment")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in ENVIRONMENTS.names():
            raise ValueError(ENVIRONMENTS.unknown(value))
        return value

    @field_validator("environment_params")
    @classmethod
    def _valid_for_the_environment(cls, value: dict[str, Any], info: ValidationInfo) -> Any:
        name = info.data.get("environment")
        if name is None:  # the name itself was refused
            return value
        model = get_environment(name).params
        try:  # JSON's types, strictly, as every parameter of a config (conspo.registry)
            resolved = model.model_validate(json_numbers(model, value), strict=True)
        except ValidationError as exc:
            raise ValueError("; ".join(map(_described, exc.errors()))) from None
        return resolved.model_dump()  # resolved, as a task's own parameters are


def _described(error: ErrorDetails) -> str:
    """One error of the environment's parameters as "field: message"."""
    message = error["msg"].removeprefix("Value error, ")
    where = ".".join(map(str, error["loc"]))
    return f"{where}: {message}" if where else message


@register_task(
    "environment",
    params=EnvironmentTaskParams,
    description="Games of a registered environment, one seed per problem, 10% held out.",
)
class EnvironmentTask(ProceduralTask):
    name = "environment"

    def __init__(self, params: EnvironmentTaskParams) -> None:
        self.environment = params.environment
        self.entry = get_environment(params.environment)
        self.env_params = self.entry.params.model_validate(params.environment_params)
        self.seeds = params.seeds
        self.limits = EnvironmentLimits(timeout_s=VERIFY_TIMEOUT_S, max_turns=1)

    def sample(self, rng: random.Random) -> Example:
        seed = rng.randrange(self.seeds)
        example = Example(
            prompt=f"[{self.environment} game {seed}]\n",
            answer="",
            data={"seed": seed, "environment": self.environment},
        )
        if hasattr(self.entry.cls, "reference_answer"):
            env = self.entry.cls(self.env_params, example, 0)
            example = Example(example.prompt, str(env.reference_answer()), example.data)
            env.close()
        return example

    def play(self, completion: str, example: Example) -> Episode:
        """The completion played as the episode's one action (contained: ``runner``)."""
        runner = EpisodeRunner(lambda: self.entry.cls(self.env_params, example, 0), self.limits)
        if runner.reset() is not None:
            runner.step(completion)
        return runner.finish()

    def verify(self, completion: str, example: Example) -> float:
        return 1.0 if self.play(completion, example).succeeded else 0.0
