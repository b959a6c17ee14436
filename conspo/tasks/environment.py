"""Games to play: the task that serves an environment's seeds.

    {"name": "environment", "params": {"environment": "guess_number",
                                       "environment_params": {"high": 20}}}

Each problem is one game: a seed in [0, seeds), which the environment builds its game from
(``conspo.environments.base.game_seed``), so every rollout of a group plays the same game, and
about a tenth of the seeds (hashed, as every procedural task's held-out split is) are held-out
games, never trained on. The prompt is the game's first observation (its ``reset``, at seed
0): what the model reads first, as the user's message, with the game's number after it.

A run on this task plays its games turn by turn (``conspo.generation.tool_rollout``): each
rollout's ``Episode`` reaches ``verify`` in ``example.data["episode"]`` (``with_episode``), and
a rollout is right when its episode is won (``Episode.succeeded``). Given no episode (a single
answer, as the task check or an SFT trace gives), ``verify`` plays the completion as the
episode's one action. The reference answer is the environment's ``reference_answer()`` (one
winning action) when it has one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from conspo.environments.base import Episode, NoSimulator, Simulator
from conspo.environments.runner import (
    EnvironmentFault,
    EnvironmentLimits,
    EpisodeRunner,
    contained_call,
)
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
    """A plugin's task may build on it (its own params model, another default environment):
    ``plays_environment`` tells the config and the trainer it is played turn by turn."""

    name = "environment"
    plays_environment = True

    def __init__(self, params: EnvironmentTaskParams) -> None:
        self.environment = params.environment
        self.entry = get_environment(params.environment)
        self.env_params = self.entry.params.model_validate(params.environment_params)
        self.seeds = params.seeds
        self.limits = EnvironmentLimits(timeout_s=VERIFY_TIMEOUT_S, max_turns=1)

    def sample(self, rng: random.Random) -> Example:
        seed = rng.randrange(self.seeds)
        label = Example(
            prompt=f"[{self.environment} game {seed}]\n",
            answer="",
            data={"seed": seed, "environment": self.environment},
        )
        runner = self.runner(label, 0, self.limits)
        first = runner.reset()  # None: it failed (its episodes fail too: the label stays)
        answer = ""
        env = runner.environment
        if first is not None and callable(getattr(env, "reference_answer", None)):
            try:  # one winning action of the game just reset (user code: contained)
                reference = contained_call(
                    env.reference_answer,  # type: ignore[union-attr]
                    timeout_s=self.limits.timeout_s,
                    what="reference_answer",
                )
                answer = "" if reference is None else str(reference)
            except EnvironmentFault:
                pass
        runner.finish()
        # The game's number stays in the prompt: prompts are what tell problems apart (the
        # held-out split, a step's distinct prompts, the per-prompt history), and every game of
        # an environment may open with the same words.
        prompt = label.prompt if first is None else f"{first}\n(game {seed})"
        return replace(label, prompt=prompt, answer=answer)

    def runner(
        self,
        example: Example,
        seed: int,
        limits: EnvironmentLimits,
        simulator: Simulator | None = None,
    ) -> EpisodeRunner:
        """An episode of ``example``'s game, not yet reset, every call into it contained. An
        environment that needs a simulator model gets ``simulator`` (``NoSimulator`` when none
        runs here)."""
        cls, params = self.entry.cls, self.env_params
        if not self.entry.needs.judge:
            return EpisodeRunner(lambda: cls(params, example, seed), limits)
        model = simulator or NoSimulator()
        return EpisodeRunner(lambda: cls(params, example, seed, simulator=model), limits)

    def play(self, completion: str, example: Example) -> Episode:
        """The completion played as the episode's one action (contained: ``runner``)."""
        runner = self.runner(example, 0, self.limits)
        if runner.reset() is not None:
            runner.step(completion)
        return runner.finish()

    def verify(self, completion: str, example: Example) -> float:
        episode = example.data.get("episode")
        if not isinstance(episode, Episode):  # a single answer: played as one action
            episode = self.play(completion, example)
        return 1.0 if episode.succeeded else 0.0


def episode_starter(
    task: object, limits: EnvironmentLimits, simulator: Simulator | None = None
) -> Callable[[Example, int], EpisodeRunner | None] | None:
    """How a run on ``task`` starts each rollout's episode (``start(example, seed)``), or None
    when ``task`` plays no environment. ``task`` may be wrapped by its prompts
    (``conspo.tasks.prompts.PromptedTask``), whose examples carry the task's own."""
    inner = getattr(task, "task", task)
    if not isinstance(inner, EnvironmentTask):
        return None

    def start(example: Example, seed: int) -> EpisodeRunner | None:
        game = example.data.get("_original", example)
        if game.data.get("environment") != inner.environment:  # a benchmark's problem
            return None
        return inner.runner(game, seed, limits, simulator)

    return start


def with_episode(example: Example, episode: Episode | None) -> Example:
    """``example`` carrying the episode its rollout played (``data["episode"]``), in the
    task's own example too where prompts wrap it: what ``verify`` and rewards read."""
    if episode is None:
        return example
    data = {**example.data, "episode": episode}
    if isinstance(data.get("_original"), Example):
        data["_original"] = with_episode(data["_original"], episode)
    return replace(example, data=data)
