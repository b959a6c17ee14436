"""A study as submitted (``POST /api/studies``, ``conspo-lab study run study.yaml``).

A study file, ten lines for the usual question::

    name: conspo-vs-grpo
    config: {task: {name: arith}, steps: 40}       # the base RunConfig every arm starts from
    arms:
      - {name: grpo, overrides: {algorithm: grpo}}
      - {name: conspo, overrides: {algorithm: conspo, params.tau: 1.0}}
    seeds: [0, 1, 2, 3, 4]
    objective: {metric: eval/accuracy, reduce: mean_last_k, k: 3}
    baseline: grpo
    concurrency: 2

``tasks: [arith, countdown]`` crosses every arm with every task as well as every seed (pairs by
(task, seed); across tasks: IQM and a stratified bootstrap, ``backend.studies.stats``).
Overrides are nested dicts or dotted paths (``params.tau: 1.0`` is ``{params: {tau: 1.0}}``).
Each arm's config (base ⊕ overrides) is validated as a RunConfig here, so an unknown path or a
bad value is a 422 located at ``body.arms.<i>.overrides.<path>`` before anything is stored.
A search study gives ``search`` instead of ``arms``: Optuna proposes the arms (``backend.studies.
search``), every trial run over every seed.

A tuned study is an arm study whose arms may carry ``tune: {space, trials}``: each such arm is
first searched on ``tuning_seeds`` (disjoint from ``seeds``), then runs on ``seeds`` at its best
trial's parameters, and the verdict is computed from those final runs alone
(``backend.studies.tuned``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from backend.errors import dotted_loc
from backend.schemas import FreeJSON, Int, Label, Seed, Tag, _Body
from conspo import metrics as M
from conspo.config import RunConfig, deep_merge, with_overrides
from conspo.input_checks import anchored, json_problem, loc_text

# Arm names go into run names (study-<id>-<arm>-s<seed>) and tags: short, no spaces.
ARM_NAME = r"[A-Za-z0-9][A-Za-z0-9_.=+-]{0,59}"
ArmName = Annotated[str, anchored(ARM_NAME)]
MAX_RUNS = 1_000  # arms × seeds of one study
# An arm study's verdict rests on a paired t interval, which needs two seeds' differences: a
# study of one seed would spend its compute and then say "too few seeds for an interval".
MIN_ARM_SEEDS = 2
MAX_GRID = 10_000  # values of one stepped search parameter


class Objective(_Body):
    metric: Label = Field("eval/accuracy", description="The metric key reduced to one number.")
    reduce: Literal["last", "mean_last_k", "auc"] = Field(
        "mean_last_k",
        description="last: the last logged value; mean_last_k: the mean of the last k values"
        " (less noisy); auc: the mean height of the curve over its steps (trapezoids).",
    )
    k: Int = Field(3, ge=1, le=10_000, description="The window of mean_last_k.")
    direction: Literal["max", "min"] = Field("max", description="Which way is better.")
    scale: float | None = Field(
        None,
        gt=0,
        description="Display factor (100 turns an accuracy into points); default 100 for an"
        " accuracy or another fraction (a pass rate), else 1.",
    )
    unit: str | None = Field(
        None,
        max_length=20,
        description="Display unit; default 'points' for a fraction shown × 100, else the metric"
        " catalogue's unit of the metric (e.g. 'log-prob / token' for sep/gap).",
    )
    effect: float = Field(
        1.0, gt=0, description="The smallest difference worth detecting, in display units."
    )

    @model_validator(mode="after")
    def _display_defaults(self) -> Objective:
        """A fraction (an accuracy, a pass rate) in points (× 100), any other metric in its
        catalogue unit: a verdict's difference and the effect its seeds-needed estimate is for
        always carry a unit ("an effect of 1 point", never "a 1 effect")."""
        metric = self.metric
        accuracy = "accuracy" in metric or "avg@" in metric or "pass@" in metric
        fraction = accuracy or M.bounds(metric) == (0.0, 1.0)
        if self.scale is None:
            self.scale = 100.0 if fraction else 1.0
        if self.unit is None:
            entry = M.metric(metric) or M.pattern(metric)
            catalogued = entry.unit if entry is not None else ""
            self.unit = "points" if fraction and self.scale == 100.0 else catalogued
        return self


class StudyObjective(Objective):
    """A study's objective: a key its runs log (the metric catalogue's, or one of its families
    such as eval/<benchmark>/avg@<k>); an unknown key would leave every arm without a value."""

    @field_validator("metric")
    @classmethod
    def _known(cls, key: str) -> str:
        if M.metric(key) is None and M.pattern(key) is None:
            known = ", ".join(M.KEY_METRICS)
            raise ValueError(f"unknown metric {key!r}: not a key runs log (e.g. {known})")
        return key


class Arm(_Body):
    name: ArmName
    overrides: FreeJSON = Field(default_factory=dict)
    tune: Tune | None = Field(
        None,
        description="Search this arm on the study's tuning_seeds first; its final runs take"
        " the best trial's parameters over its own overrides.",
    )


class SearchParam(_Body):
    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(None, gt=0, description="Grid step of a float/int range.")
    choices: list[str | bool | int | float | None] | None = Field(
        None, min_length=1, max_length=100
    )

    @model_validator(mode="after")
    def _bounds(self) -> SearchParam:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs choices")
        elif self.low is None or self.high is None or self.low > self.high:
            raise ValueError(f"a {self.type} parameter needs low ≤ high")
        elif self.log and self.low <= 0:
            raise ValueError("a log-scaled range needs low > 0")
        elif self.log and self.step is not None:
            raise ValueError("a range is either log-scaled or stepped, not both")
        elif self.step is not None and (self.high - self.low) / self.step > MAX_GRID:
            raise ValueError(f"more than {MAX_GRID} steps between low and high")
        return self


class Tune(_Body):
    """An arm's search before the final seeds: its parameters (config paths over the arm's
    config) and how many trials, each run on every tuning seed."""

    space: dict[Label, SearchParam] = Field(min_length=1, max_length=20)
    sampler: Literal["grid", "random", "tpe"] = "tpe"
    trials: Int = Field(8, ge=1, le=200)


class Search(Tune):
    prune: bool = Field(
        False,
        description="Stop a trial early when its mean intermediate eval is below the median of"
        " earlier trials at the same step (Optuna's MedianPruner).",
    )


def _arms_or_search(schema: dict[str, Any]) -> None:
    """``_arms_or_search``'s first two rules in the JSON schema (the third counts runs)."""
    schema["anyOf"] = [
        {
            "required": ["arms"],
            "properties": {"arms": {"minItems": 1}, "seeds": {"minItems": MIN_ARM_SEEDS}},
        },
        {"required": ["search"], "properties": {"search": {"type": "object"}}},
    ]
    schema["not"] = {
        "required": ["search", "tasks"],
        "properties": {"search": {"type": "object"}, "tasks": {"minItems": 1}},
    }


class StudyCreate(_Body):
    model_config = ConfigDict(json_schema_extra=_arms_or_search)

    name: Label
    config: FreeJSON = Field(default_factory=dict, description="The base RunConfig.")
    arms: list[Arm] = Field(default_factory=list, max_length=100)
    seeds: list[Seed] = Field(min_length=1, max_length=100, json_schema_extra={"uniqueItems": True})
    tuning_seeds: list[Seed] = Field(
        default_factory=list,
        max_length=100,
        json_schema_extra={"uniqueItems": True},
        description="The seeds tuned arms' trials run on (required when an arm has tune;"
        " disjoint from seeds, which only the final runs use).",
    )
    objective: StudyObjective = Field(default_factory=StudyObjective)
    baseline: ArmName | None = Field(None, description="The arm others are paired against.")
    concurrency: Int = Field(4, ge=1, le=1_000, description="Runs queued or running at once.")
    search: Search | None = None
    tasks: list[Label] = Field(
        default_factory=list,
        max_length=20,
        json_schema_extra={"uniqueItems": True},
        description="Task names crossed with the seeds: every arm runs on every (task, seed),"
        " its task set to each in turn (the task's own params at their defaults). Differences"
        " are paired by (task, seed); across tasks the study reports the IQM and a stratified"
        " bootstrap (seeds resampled within each task).",
    )
    tags: list[Tag] = Field(default_factory=list, max_length=50)

    @field_validator("arms")
    @classmethod
    def _distinct_arms(cls, arms: list[Arm]) -> list[Arm]:
        seen: set[str] = set()
        for arm in arms:
            if arm.name in seen:
                raise ValueError(f"duplicate arm name {arm.name!r}")
            seen.add(arm.name)
        return arms

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be distinct")
        return seeds

    @field_validator("tuning_seeds")
    @classmethod
    def _distinct_tuning_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("tuning seeds must be distinct")
        return seeds

    @field_validator("tasks")
    @classmethod
    def _distinct_tasks(cls, tasks: list[str]) -> list[str]:
        if len(set(tasks)) != len(tasks):
            raise ValueError("tasks must be distinct")
        return tasks

    @field_validator("baseline")
    @classmethod
    def _baseline_is_an_arm(cls, baseline: str | None, info: ValidationInfo) -> str | None:
        names = [a.name for a in info.data.get("arms") or []]
        if baseline is not None and names and baseline not in names:
            raise ValueError(f"baseline {baseline!r} is not an arm (arms: {', '.join(names)})")
        return baseline

    @model_validator(mode="after")
    def _arms_or_search(self) -> StudyCreate:
        if self.search is None and not self.arms:
            raise PydanticCustomError("missing", "a study needs arms (or a search)")
        if self.search is not None and self.tasks:
            raise ValueError("a search study runs on one task: give it in config, not tasks")
        if len(self.arms or [None]) * len(self.seeds) * max(1, len(self.tasks)) > MAX_RUNS:
            raise ValueError(f"more than {MAX_RUNS} runs (arms × tasks × seeds)")
        self._tuning_rules()
        if self.search is None and len(self.seeds) < MIN_ARM_SEEDS:
            raise _error_at(
                "seeds",
                f"an arm study needs at least {MIN_ARM_SEEDS} seeds: its verdict is an interval"
                " over the seeds' paired differences, and one seed gives none",
                self.seeds,
            )
        return self

    @property
    def tuned(self) -> bool:
        """Some arm is searched on the tuning seeds before the final seeds."""
        return any(arm.tune is not None for arm in self.arms)

    def planned_runs(self) -> tuple[int, int]:
        """(tuning runs, final runs): trials × tuning seeds summed over the tuned arms, and
        arms (or a search's trials) × tasks × seeds."""
        tuning = sum(a.tune.trials for a in self.arms if a.tune) * len(self.tuning_seeds)
        arms = self.search.trials if self.search is not None else len(self.arms)
        return tuning, arms * max(1, len(self.tasks)) * len(self.seeds)

    def _tuning_rules(self) -> None:
        """A tuned study: tuning seeds given and disjoint from the final seeds, one task, no
        search beside it, and its runs of both phases under ``MAX_RUNS``."""
        if not self.tuned:
            if self.tuning_seeds:
                raise _error_at(
                    "tuning_seeds", "no arm has a tune block to run on them", self.tuning_seeds
                )
            return
        if self.search is not None:
            raise _error_at(
                "search", "a search study cannot also have tuned arms", self.model_dump()["search"]
            )
        if not self.tuning_seeds:
            raise _error_at("tuning_seeds", "an arm has tune: give the seeds its trials run on", [])
        if overlap := sorted(set(self.tuning_seeds) & set(self.seeds)):
            raise _error_at(
                "tuning_seeds",
                f"tuning seeds must be disjoint from seeds (both have {overlap}): the final"
                " runs must be fresh seeds, or the pick's luck on a seed enters the verdict",
                self.tuning_seeds,
            )
        if self.tasks:
            raise _error_at(
                "tasks", "a tuned study runs on one task: give it in config, not tasks", self.tasks
            )
        tuning, final = self.planned_runs()
        if tuning + final > MAX_RUNS:
            raise _error_at(
                "arms",
                f"{tuning} tuning runs (trials × tuning seeds) + {final} final runs (arms ×"
                f" seeds) = {tuning + final}, more than {MAX_RUNS}",
                len(self.arms),
            )


def _error_at(field: str, message: str, value: Any) -> ValidationError:
    """A model-level rule's refusal located at ``field`` (a model validator's own errors are
    located at the model), so a 422 and the study form name the field to change."""
    error = PydanticCustomError("value_error", message)
    return ValidationError.from_exception_data(
        "StudyCreate", [InitErrorDetails(type=error, loc=(field,), input=value)]
    )


def expand_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"params.tau": 1, "optim": {"lr": 2e-6}}`` → ``{"params": {"tau": 1}, "optim": {...}}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r} goes through a value that is not a section")
        leaf = expand_dotted(value) if isinstance(value, dict) else value
        if isinstance(leaf, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = deep_merge(node[parts[-1]], leaf)
        else:
            node[parts[-1]] = leaf
    return out


def arm_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The arm's raw config: base with (dotted or nested) overrides, by the override rule of
    ``conspo.config.with_overrides``."""
    nested = expand_dotted(overrides)
    # a dotted key nests as deep as it has dots ("a.a.…": hundreds of levels, past what the
    # merge and the validation below may recurse through): the bound every stored JSON keeps
    if (problem := json_problem(nested)) is not None:
        where, what = problem
        raise ValueError(f"overrides, expanded, at {loc_text(where)}: {what}")
    return with_overrides(base, nested)


def validate_arm(
    base: dict[str, Any], overrides: dict[str, Any], loc: tuple[str | int, ...]
) -> tuple[RunConfig | None, list[dict[str, Any]]]:
    """The arm's RunConfig, or the errors located under ``loc`` (e.g. body.arms.1.overrides)."""
    try:
        raw = arm_config(base, overrides)
    except ValueError as exc:
        return None, [_error(loc, str(exc))]
    try:
        return RunConfig.model_validate(raw), []
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        return None, [{**e, "loc": (*loc, *dotted_loc(e["loc"], overrides))} for e in errors]


def _error(loc: tuple[str | int, ...], message: str) -> dict[str, Any]:
    return {"type": "value_error", "loc": loc, "msg": message}


def run_name(study_id: int, arm: str, seed: int, task: str | None = None) -> str:
    return f"study-{study_id}-{arm}-{task}-s{seed}" if task else f"study-{study_id}-{arm}-s{seed}"


# A study that crosses tasks stores each (arm, task) as its own row arm, "arm@task": study_runs
# is unique on (study, arm, seed), and arm names never contain "@" (ARM_NAME).
TASK_SEP = "@"


def row_arm(arm: str, task: str | None) -> str:
    return f"{arm}{TASK_SEP}{task}" if task else arm


def split_row_arm(text: str) -> tuple[str, str | None]:
    """``"grpo@arith"`` → ``("grpo", "arith")``; ``"grpo"`` → ``("grpo", None)``."""
    arm, _, task = text.partition(TASK_SEP)
    return arm, task or None


# A tuned arm's trial rows are "arm:t<number>": study_runs is unique on (study, arm, seed), arm
# names never contain ":" (ARM_NAME), and such a row is never an arm of the verdict.
TRIAL_SEP = ":"


def trial_row_arm(arm: str, trial: int) -> str:
    return f"{arm}{TRIAL_SEP}t{trial}"


def tuned_arm_of(text: str) -> str | None:
    """``"grpo:t3"`` → ``"grpo"`` (a tuning row); a final row's arm → None."""
    arm, sep, _ = text.partition(TRIAL_SEP)
    return arm if sep else None


def group_of(study_id: int) -> str:
    """The runs' group id: the runs list links a group spelled so to its study page."""
    return f"study-{study_id}"


STUDY_GROUP = re.compile(r"^study-(\d+)$")
