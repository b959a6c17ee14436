"""Registries: each objective, task and reward function is its code plus one registration.

    @register_objective("conspo", params=ConSPOParams, description="...")
    def conspo_objective(batch: PolicyBatch, params: ConSPOParams) -> ObjectiveOutput: ...

    @register_task("arith", params=ArithParams, description="...")
    class ArithTask(ProceduralTask): ...

    @register_reward("format", params=FormatParams, description="...")
    def format_reward(completion, example, context, params: FormatParams) -> float: ...

An entry holds the code (a function, a class), its pydantic parameter model (defaults, help text,
validation) and a one-line description. The config model, the trainer, the REST presets
endpoint, the web form and docs/config.md all read the registries, so adding an algorithm, a
task, a reward or a job kind is one file (and its test; docs/config.md regenerated) and nothing
else: tests/conspo/test_registries.py holds every entry to the same rules by its registration
alone. One generic ``Registry`` serves every kind;
``register_objective`` / ``register_task`` / ``register_reward`` and their getters are its typed
faces.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FunctionType, UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Generic,
    Literal,
    Protocol,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from conspo import plugins

if TYPE_CHECKING:
    from conspo.environments.base import EnvNeeds
    from conspo.tasks.base import Task

Loc = tuple[str | int, ...]


class _Entry(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def code(self) -> object: ...
    @property
    def params(self) -> type[BaseModel]: ...
    @property
    def description(self) -> str: ...


E = TypeVar("E", bound=_Entry)


@dataclass(frozen=True)
class RegisteredObjective:
    name: str
    fn: Callable[..., Any]
    params: type[BaseModel]
    description: str
    # Keys of the metric catalogue (conspo.metrics) that this objective's stats add to what
    # every run logs, e.g. GRPO's clip fraction; the catalogue tells the pages who logs what.
    metrics: tuple[str, ...] = ()
    # With π_old = π_θ (one update per batch) and β = 0, the loss's gradient in the log-probs
    # does not depend on their values (a policy gradient whose weights come from the rewards):
    # a split gradient pass then needs no no-grad forward first (conspo.training.update).
    # tests/conspo/test_objectives.py checks each registration against the loss itself.
    linear_on_policy: bool = False
    # Its loss takes per-turn advantages (``PolicyBatch.turn_advantages``): an environment run
    # may credit turns (``environment.credit``) only with such an objective.
    turn_credit: bool = False
    # It reads a value model's predictions (``PolicyBatch.values``): the trainer loads and
    # trains a critic for it (``conspo.training.critic``) and fills the batch's per-token
    # rewards and turns.
    critic: bool = False
    # It reads each rollout's score against frozen anchors (``PolicyBatch.anchor_scores``):
    # the trainer collects the anchors, trains their projection head and scores every batch
    # with it (``conspo.training.anchors``; RRPO).
    anchors: bool = False

    @property
    def code(self) -> object:
        return self.fn


@dataclass(frozen=True)
class RegisteredTask:
    name: str
    # A class whose constructor takes an instance of ``params`` (and a ``DataFiles`` when the
    # params declare data_paths: conspo.tasks.make_task).
    cls: Callable[..., Task]
    params: type[BaseModel]
    description: str

    @property
    def code(self) -> object:
        return self.cls


@dataclass(frozen=True)
class RegisteredReward:
    name: str
    # fn(completion, example, context, params) -> float, or the batched form (``batched``).
    fn: Callable[..., Any]
    params: type[BaseModel]
    description: str
    # The weight a run gets when its config names none (RLVP's β = 0.2 for the process signal).
    default_weight: float = 1.0
    # A method the task must have for this reward (e.g. "process_reward"), checked by the config.
    task_method: str | None = None
    # Scores a whole batch at once: fn(completions, examples, lengths, context, params) -> list.
    batched: bool = False

    @property
    def code(self) -> object:
        return self.fn

    def applies_to(self, task: RegisteredTask) -> bool:
        """Whether a run of ``task`` may have this reward (the task has its ``task_method``)."""
        return self.task_method is None or hasattr(task.cls, self.task_method)


class Registry(Generic[E]):
    """Names of one kind (``"algorithm"``, ``"task"``) → entries.

    ``builtins`` names the modules or packages whose import registers the built-in entries; a
    package has every module in it imported, so a new built-in is a new file and nothing else.
    They are loaded on first lookup, not on import, because those modules import this one; the
    users' plugins (``conspo.plugins``) are loaded right after, on that same first lookup.
    """

    def __init__(self, kind: str, *builtins: str) -> None:
        self.kind = kind
        self.builtins = builtins
        self._entries: dict[str, E] = {}
        self._loaded = False
        _REGISTRIES.append(self)

    def add(self, entry: E) -> None:
        """One name registered twice is an error, unless it is the same code again (a module
        imported a second time re-runs its decorators)."""
        existing = self._entries.get(entry.name)
        if existing is not None and not _same_code(existing, entry):
            raise ValueError(
                f"{self.kind} {entry.name!r} is already registered to"
                f" {getattr(existing.code, '__qualname__', existing.code)}"
            )
        self._entries[entry.name] = entry
        plugins.note_registered(self, entry.name)

    def discard(self, name: str) -> None:
        """Take ``name`` back (a plugin whose import failed after registering it)."""
        self._entries.pop(name, None)

    def origin(self, name: str) -> str | None:
        """The plugin that registered ``name``; None for a built-in."""
        self._load_builtins()
        return plugins.origin(self.kind, name)

    def get(self, name: str) -> E:
        self._load_builtins()
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._entries)

    def unknown(self, name: object) -> str:
        return f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"

    def resolve_params(
        self, name: object, params: object, *, name_loc: Loc, params_loc: Loc
    ) -> tuple[dict[str, Any] | None, list[InitErrorDetails]]:
        """(the full parameter set of entry ``name`` for ``params``, errors): ``resolve_model``
        dumped."""
        resolved, errors = self.resolve_model(
            name, params, name_loc=name_loc, params_loc=params_loc
        )
        return (None if resolved is None else resolved.model_dump()), errors

    def resolve_model(
        self, name: object, params: object, *, name_loc: Loc, params_loc: Loc
    ) -> tuple[BaseModel | None, list[InitErrorDetails]]:
        """(``params`` validated by entry ``name``'s parameter model, errors).

        An unknown name is reported at ``name_loc``, each bad parameter at
        ``params_loc + (field,)``, so a 422 or a CLI message names the exact field. A name or
        params of the wrong type gives neither: the model's own field validation reports it.
        The types are JSON's, strictly (``json_numbers``): ``{"tau": "10"}`` is refused.
        """
        if not isinstance(name, str) or not (params is None or isinstance(params, dict)):
            return None, []
        self._load_builtins()
        if name not in self._entries:
            return None, [_error_at(name_loc, self.unknown(name), name)]
        model = self._entries[name].params
        try:
            return model.model_validate(json_numbers(model, params or {}), strict=True), []
        except ValidationError as exc:
            return None, relocated(exc, params_loc)

    def _load_builtins(self) -> None:
        """The built-ins, then every registry's plugins (once per process)."""
        self.load_builtins()
        plugins.load_plugins()

    def load_builtins(self) -> None:
        if self._loaded:
            return
        for name in self.builtins:
            package = importlib.import_module(name)  # runs its registrations
            for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
                importlib.import_module(f"{name}.{module.name}")
        self._loaded = True


_REGISTRIES: list[Registry[Any]] = []


def all_registries() -> list[Registry[Any]]:
    """Every registry (objectives, tasks, rewards, job kinds, tools, ...), in creation order."""
    return list(_REGISTRIES)


plugins.use_registries(all_registries)


def _same_code(a: _Entry, b: _Entry) -> bool:
    return _code_of(a.code) == _code_of(b.code) and (
        a.params is b.params or a.params.model_json_schema() == b.params.model_json_schema()
    )


def _code_of(obj: object) -> object:
    """What "the same code" compares: code objects are equal when compiled from the same source
    at the same place, so a re-imported module matches and any other definition does not."""
    if isinstance(obj, type):
        methods = [v.__code__ for v in vars(obj).values() if isinstance(v, FunctionType)]
        return (obj.__module__, obj.__qualname__, methods)
    return getattr(obj, "__code__", obj)


def _error_at(loc: Loc, message: str, value: object) -> InitErrorDetails:
    """One validation error at ``loc``, for ``ValidationError.from_exception_data``."""
    return {"type": PydanticCustomError("value_error", message), "loc": loc, "input": value}


def json_numbers(model: type[BaseModel], data: Any) -> Any:
    """``data`` for ``model``'s strict validation: each whole float given to an integer field
    (at any depth of its nested models) made that integer.

    A config's types are JSON's, strictly: a boolean is no number, 1 no boolean and "5" no
    number (pydantic's lax mode takes all three, so ``steps: true`` trained one step). Strict
    mode takes an integer for a float, as JSON does, but refuses 5.0 for an integer, which
    JSON Schema counts as one (and Python's json writes for a float that is whole).
    """
    if not isinstance(data, dict):
        return data
    fields = model.model_fields
    return {
        key: _json_number(fields[key].annotation, value) if key in fields else value
        for key, value in data.items()
    }


def _json_number(annotation: Any, value: Any) -> Any:
    arms = annotation_arms(annotation)
    if isinstance(value, float) and value.is_integer() and int in arms and float not in arms:
        return int(value)
    for arm in arms:
        if get_origin(arm) is list and isinstance(value, list):
            item = (get_args(arm) or (Any,))[0]
            return [_json_number(item, v) for v in value]
        if get_origin(arm) is None and isinstance(arm, type) and issubclass(arm, BaseModel):
            return json_numbers(arm, value)
    return value


def annotation_arms(annotation: Any) -> list[Any]:
    """The types a value of ``annotation`` may have: ``Annotated`` and unions unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return annotation_arms(get_args(annotation)[0])
    if origin is Union or origin is UnionType:
        return [arm for each in get_args(annotation) for arm in annotation_arms(each)]
    return [annotation]


def relocated(exc: ValidationError, prefix: Loc) -> list[InitErrorDetails]:
    """``exc``'s errors with ``prefix`` prepended to each location."""
    return [
        {
            "type": PydanticCustomError(err["type"], err["msg"]),
            "loc": (*prefix, *err["loc"]),
            "input": err.get("input"),
        }
        for err in exc.errors()
    ]


# --------------------------------------------------------------------------------------------
# Objectives (a module each, conspo/objectives/) and tasks (a module each, conspo/tasks/)
# --------------------------------------------------------------------------------------------

OBJECTIVES: Registry[RegisteredObjective] = Registry("algorithm", "conspo.objectives")
TASKS: Registry[RegisteredTask] = Registry("task", "conspo.tasks")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T", bound="Callable[..., Task]")


def register_objective(
    name: str,
    *,
    params: type[BaseModel],
    description: str,
    metrics: tuple[str, ...] = (),
    linear_on_policy: bool = False,
    turn_credit: bool = False,
    critic: bool = False,
    anchors: bool = False,
) -> Callable[[F], F]:
    """Register the objective function ``fn(batch, params)`` under ``name``; ``metrics``: the
    catalogue keys its stats add to what every run logs; ``linear_on_policy``: on policy and
    with β = 0 its gradient in the log-probs does not depend on their values
    (``RegisteredObjective.linear_on_policy``); ``turn_credit``: its loss adds
    ``PolicyBatch.turn_advantages`` (``RegisteredObjective.turn_credit``); ``critic``: it reads
    a value model's ``PolicyBatch.values`` (``RegisteredObjective.critic``); ``anchors``: it
    reads ``PolicyBatch.anchor_scores`` (``RegisteredObjective.anchors``)."""

    def decorator(fn: F) -> F:
        OBJECTIVES.add(
            RegisteredObjective(
                name,
                fn,
                params,
                description,
                tuple(metrics),
                linear_on_policy,
                turn_credit,
                critic,
                anchors,
            )
        )
        return fn

    return decorator


def get_objective(name: str) -> RegisteredObjective:
    return OBJECTIVES.get(name)


def objective_names() -> list[str]:
    return OBJECTIVES.names()


def register_task(name: str, *, params: type[BaseModel], description: str) -> Callable[[T], T]:
    """Register the task class ``cls(params)`` (it implements ``conspo.tasks.Task``); one whose
    params declare ``data_paths`` is built as ``cls(params, files)``."""

    def decorator(cls: T) -> T:
        TASKS.add(RegisteredTask(name, cls, params, description))
        return cls

    return decorator


def get_task(name: str) -> RegisteredTask:
    return TASKS.get(name)


def task_names() -> list[str]:
    return TASKS.names()


# --------------------------------------------------------------------------------------------
# Reward functions (a module each, conspo/rewards/)
# --------------------------------------------------------------------------------------------

REWARDS: Registry[RegisteredReward] = Registry("reward", "conspo.rewards")

R = TypeVar("R", bound=Callable[..., Any])


def register_reward(
    name: str,
    *,
    params: type[BaseModel],
    description: str,
    default_weight: float = 1.0,
    task_method: str | None = None,
    batched: bool = False,
) -> Callable[[R], R]:
    """Register the reward function ``fn(completion, example, context, params) -> float`` under
    ``name`` (logged as reward/<name>); ``task_method``: a method the task must provide for it;
    ``batched``: fn scores the whole batch, ``fn(completions, examples, lengths, context,
    params) -> list[float]`` (a reward that reads the policy, or normalises within groups)."""

    def decorator(fn: R) -> R:
        REWARDS.add(
            RegisteredReward(name, fn, params, description, default_weight, task_method, batched)
        )
        return fn

    return decorator


def get_reward(name: str) -> RegisteredReward:
    return REWARDS.get(name)


def reward_names() -> list[str]:
    return REWARDS.names()


# --------------------------------------------------------------------------------------------
# Job kinds (conspo/jobs/): what a run trains, each a train function of the trainer's signature
# --------------------------------------------------------------------------------------------


Head = Literal["causal_lm", "sequence_score"]


@dataclass(frozen=True)
class RegisteredJobKind:
    name: str
    # train(config, sink, should_stop, *, workdir, model_store, files, memory_limit) ->
    # conspo.training.trainer.TrainResult: the same signature as conspo.training.trainer.train (the
    # "rl" kind).
    fn: Callable[..., Any]
    params: type[BaseModel]  # validates config.kind_params
    description: str
    # Catalogue keys this kind logs besides what every kind logs (conspo.metrics.EVERY_KIND: the
    # learning rate, the step time, the evaluation); the run page draws their panels.
    metrics: tuple[str, ...] = ()
    # The RunConfig sections only some kinds train with ("algorithm": algorithm and params,
    # "sampling", "rewards") that this one does: the form shows those, hides the others.
    sections: tuple[str, ...] = ()
    # Trains on several processes (resources.gpus / nodes above 1); the others train on one.
    distributed: bool = False
    # The kind_params fields naming a finished run whose stored rollouts this kind reads
    # (checked at submit time like model.from_run), and the hook that turns those rollouts into
    # the job's input files before it trains: inputs(config, workdir, rollouts_of) where
    # rollouts_of(run_id) yields that run's stored (prompt, completion, reward).
    input_runs: tuple[str, ...] = ()
    inputs: Callable[..., None] | None = None
    # kind_params of a short run on a tiny model that trains in seconds: what the registry-wide
    # test trains every kind from (tests/conspo/test_registries.py), so a new kind is exercised
    # by its registration alone. A kind reading another run's rollouts (input_runs) names one;
    # whoever runs the example supplies those rollouts to its ``inputs`` hook.
    example_params: dict[str, Any] = field(default_factory=dict)
    # What the kind needs of the rest of the run config, beyond its kind_params:
    # check(config) -> [(loc, message, value)], each problem at the field to blame (the config
    # refuses the run with them). E.g. sft's tool traces need the tool in tools.names.
    check: Callable[[Any], list[tuple[Loc, str, object]]] | None = None
    # The head on the model it trains (``conspo.models.loading.load_pretrained``): the causal
    # LM's next-token logits, or one scalar on the last non-pad token (a reward model,
    # transformers' AutoModelForSequenceClassification with num_labels=1), which generates
    # nothing: such a kind evaluates itself, not by the task's generated answers.
    head: Head = "causal_lm"

    @property
    def code(self) -> object:
        return self.fn

    @property
    def trains_algorithm(self) -> bool:
        return "algorithm" in self.sections

    def algorithm_of(self, algorithm: str | None) -> str | None:
        """The run's algorithm as the runs table stores it: None for a kind that trains none."""
        return algorithm if self.trains_algorithm else None

    def label(self, algorithm: str | None) -> str:
        """What a run of this kind trains, for people: ``rl · grpo``, ``sft``."""
        return f"{self.name} · {algorithm}" if self.trains_algorithm and algorithm else self.name


JOB_KINDS: Registry[RegisteredJobKind] = Registry("kind", "conspo.jobs")


def register_job_kind(
    name: str,
    *,
    params: type[BaseModel],
    description: str,
    metrics: tuple[str, ...] = (),
    sections: tuple[str, ...] = (),
    distributed: bool = False,
    input_runs: tuple[str, ...] = (),
    inputs: Callable[..., None] | None = None,
    example_params: dict[str, Any],
    check: Callable[[Any], list[tuple[Loc, str, object]]] | None = None,
    head: Head = "causal_lm",
) -> Callable[[F], F]:
    """Register ``fn`` as the train function of job kind ``name`` (``config.kind``); its
    module must stay torch-free at import (``conspo.lazy``): the API validates configs.
    ``example_params``: kind_params of a seconds-long run on a tiny model (checked against
    ``params`` here), from which the registry-wide test trains the kind. ``check(config)``:
    what the kind needs of the rest of the config, as (loc, message, value) problems.
    ``head``: the model head it trains (``RegisteredJobKind.head``)."""
    params.model_validate(example_params)  # a wrong example fails at import, not in a test

    def decorator(fn: F) -> F:
        kind = RegisteredJobKind(
            name, fn, params, description, tuple(metrics), tuple(sections), distributed,
            tuple(input_runs), inputs, dict(example_params), check, head,
        )  # fmt: skip
        JOB_KINDS.add(kind)
        return fn

    return decorator


def get_job_kind(name: str) -> RegisteredJobKind:
    return JOB_KINDS.get(name)


def job_kind_names() -> list[str]:
    return JOB_KINDS.names()


# --------------------------------------------------------------------------------------------
# Tools (conspo/tools/): what a rollout may call between its turns
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredTool:
    name: str
    # A class built as ``cls(params, limits)`` (a ``conspo.tools.base.ToolLimits``) whose
    # ``run(calls) -> results`` executes a turn's calls.
    cls: Callable[..., Any]
    params: type[BaseModel]
    description: str
    tag: str  # the model calls it by writing <tag>…</tag>
    sandboxed: bool  # runs model-written code: needs a working sandbox (conspo.sandbox)

    @property
    def code(self) -> object:
        return self.cls


TOOLS: Registry[RegisteredTool] = Registry("tool", "conspo.tools")
ToolClass = TypeVar("ToolClass", bound=Callable[..., Any])


def register_tool(
    name: str, *, params: type[BaseModel], description: str, tag: str, sandboxed: bool
) -> Callable[[ToolClass], ToolClass]:
    """Register the tool class ``cls(params, limits)`` under ``name``; the model calls it by
    writing ``<tag>…</tag>``; ``sandboxed``: it runs model-written code (``conspo.sandbox``),
    so a worker without a sandbox refuses runs that use it."""

    def decorator(cls: ToolClass) -> ToolClass:
        TOOLS.add(RegisteredTool(name, cls, params, description, tag, sandboxed))
        return cls

    return decorator


def get_tool(name: str) -> RegisteredTool:
    return TOOLS.get(name)


def tool_names() -> list[str]:
    return TOOLS.names()


# --------------------------------------------------------------------------------------------
# Environments (conspo/environments/): the multi-turn worlds a rollout plays
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredEnvironment:
    name: str
    # A class built as ``cls(params, example, seed)`` per rollout (it implements
    # ``conspo.environments.base.Environment``), always played through
    # ``conspo.environments.runner``, which contains its faults.
    cls: Callable[..., Any]
    params: type[BaseModel]
    description: str
    needs: EnvNeeds  # what it needs of a run: turns, tools, sandbox, a judge model

    @property
    def code(self) -> object:
        return self.cls


ENVIRONMENTS: Registry[RegisteredEnvironment] = Registry("environment", "conspo.environments")
EnvironmentClass = TypeVar("EnvironmentClass", bound=Callable[..., Any])


def register_environment(
    name: str, *, params: type[BaseModel], description: str, needs: EnvNeeds
) -> Callable[[EnvironmentClass], EnvironmentClass]:
    """Register the environment class ``cls(params, example, seed)`` under ``name``; ``needs``:
    what it needs of a run (an ``EnvNeeds``: turns, tools, sandbox, a judge model)."""

    def decorator(cls: EnvironmentClass) -> EnvironmentClass:
        ENVIRONMENTS.add(RegisteredEnvironment(name, cls, params, description, needs))
        return cls

    return decorator


def get_environment(name: str) -> RegisteredEnvironment:
    return ENVIRONMENTS.get(name)


def environment_names() -> list[str]:
    return ENVIRONMENTS.names()
