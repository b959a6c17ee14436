"""reasoning-gym: about a hundred families of procedurally generated, verifiable problems.

    task: {name: reasoning_gym, params: {dataset: chain_sum, config: {min_terms: 2, max_terms: 3}}}
    task: {name: reasoning_gym, params: {mixture: [{name: chain_sum, weight: 2},
                                                   {name: leg_counting, config: {max_animals: 3}}]}}

Each generator of the ``reasoning-gym`` package (``basic_arithmetic``, ``chain_sum``,
``gsm_symbolic``, ``leg_counting``, ``countdown``, …) draws problems from a seed and a config
dataclass of its own, and scores an answer with its own ``score_answer``. Several generators mix
with weights through reasoning-gym's ``CompositeDataset``, which is what builds every split here,
one generator or many.

Splits. Training problems come from the generators seeded at ``TRAIN_SEED`` and held-out ones
from ``HELD_OUT_SEED``: reasoning-gym draws item ``i`` of a generator seeded ``s`` from
``Random(s + i)``, and the two seed ranges ``[s, s + POOL_SIZE + generators]`` lie far apart, so
the two streams never share a draw. On top of that, as in every procedural task here, a problem
belongs to the held-out split when the hash of its text says so (``conspo.tasks.base``), and each
split keeps only its own problems: a generator with a small problem space, which draws the same
question from both seeds, still never trains on a held-out problem.

Answers. The prompt asks for the final answer in ``<answer>…</answer>`` (default) or in
``\\boxed{}`` (``answer_format``), and the verifier reads the last of those; the generator's
``score_answer`` scores it in [0, 1]. A rollout is correct (verifier 1) at full score only; the
partial score is the task's ``process_reward``, which the ``process`` reward adds (R = O + βΦ).

Torch-free and light at import: reasoning-gym itself (it imports sympy and matplotlib) is imported
when a config is validated or a task is built, not when the task registry loads this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import random
import re
from collections import abc
from enum import Enum
from functools import cache
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from conspo.registry import Loc, register_task
from conspo.tasks.answers import extract_answer as last_boxed_or_number
from conspo.tasks.answers import last_boxed
from conspo.tasks.base import EVAL_SAMPLING_SEED, Example, TaskParams, safe_eval, sample_split

INSTALL = "pip install reasoning-gym==0.1.25 (make install does it)"
# Problems each split's generators index (some generators precompute per index, word_ladder
# refuses more than 20,000); item seeds of a split are its seed + index (+ generator position).
POOL_SIZE = 20_000
TRAIN_SEED = 0
HELD_OUT_SEED = 2**31
# The parameters the task sets itself: the seed (train and held-out splits differ in it) and the
# number of problems a split indexes.
TASK_OWNED = frozenset({"seed", "size"})
# reasoning-gym's own mixing dataset: the ``mixture`` parameter is its interface here.
COMPOSITE = "composite"

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INSTRUCTIONS = {
    "answer_tag": "Give your final answer between <answer> and </answer>.",
    "boxed": "Put your final answer within \\boxed{}.",
    "last_number": "End your reply with the final answer.",
}
# How a reference answer is written in each format: an example's answer, and an SFT target.
WRITTEN = {"answer_tag": "<answer>{}</answer>", "boxed": "\\boxed{{{}}}", "last_number": "{}"}


def extract_answer(completion: str, answer_format: str) -> str | None:
    """The completion's final answer as the prompt asked for it: the content of its last
    complete <answer>…</answer>, or of its last \\boxed{…} (nested braces allowed), stripped;
    None when there is none. Text after the answer is ignored. ``last_number``: the last
    \\boxed{} else the last number, as the math tasks read answers."""
    if answer_format == "boxed":
        return last_boxed(completion)
    if answer_format == "last_number":
        return last_boxed_or_number(completion)
    found = ANSWER_TAG.findall(completion)
    return found[-1].strip() if found else None


# --------------------------------------------------------------------------------------------
# Parameters, validated against the generators
# --------------------------------------------------------------------------------------------

# What a generator's config may ask for. A config sets the size of what its generator builds
# (terms, digits, animals, grid sides…), and reasoning-gym checks little beyond its own
# assertions: chain_sum at 10^7 terms draws a question of millions of characters for a minute.
# Every numeric parameter is capped: by the caps declared here for the generators people train
# on, else by the default rule (ten times the generator's own default, at least DEFAULT_CAP);
# text at MAX_TEXT characters, lists at MAX_ITEMS. Drawing problems under a config that passes
# still runs under a time and memory budget (``conspo.tasks.probe``) before a run is accepted.
DEFAULT_CAP = 100
CAP_FACTOR = 10
MAX_TEXT = 200
MAX_ITEMS = 64
_ARITHMETIC: dict[str, tuple[float, float]] = {
    "min_terms": (1, 20),
    "max_terms": (1, 20),
    "min_digits": (1, 18),
    "max_digits": (1, 18),
}
CAPS: dict[str, dict[str, tuple[float, float]]] = {
    "chain_sum": _ARITHMETIC,
    "basic_arithmetic": _ARITHMETIC,
    "products": _ARITHMETIC,
    "decimal_chain_sum": {
        **_ARITHMETIC,
        "min_decimal_places": (0, 10),
        "max_decimal_places": (0, 10),
    },
    "leg_counting": {
        "min_animals": (1, 50),
        "max_animals": (1, 50),
        "min_instances": (1, 100),
        "max_instances": (1, 100),
    },
    "gsm_symbolic": {"difficulty": (0.0, 1.0)},
    # countdown searches for a solution: its cost grows as numbers! * 4^numbers
    "countdown": {
        "min_numbers": (2, 7),
        "max_numbers": (2, 7),
        "min_value": (1, 10_000),
        "max_value": (1, 10_000),
        "min_target": (1, 100_000),
        "max_target": (1, 100_000),
    },
}


@cache
def _generators() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry: name → (dataset class, config dataclass)."""
    try:
        import reasoning_gym  # noqa: F401  # its import registers every generator
        from reasoning_gym.factory import DATASETS
    except ImportError:
        message = f"the reasoning_gym task needs the reasoning-gym package: {INSTALL}"
        raise ValueError(message) from None
    return {name: entry for name, entry in DATASETS.items() if name != COMPOSITE}


def generator_names() -> list[str]:
    return sorted(_generators())


def _list_generators(schema: dict[str, Any]) -> None:
    """The form's choices for ``dataset`` (json_schema_extra: run when the schema is built, so
    the registry import stays light)."""
    # Not installed: a free text field, and validation says what to install.
    with contextlib.suppress(ValueError):
        schema["enum"] = generator_names()


def _error(loc: Loc, message: str, value: object) -> InitErrorDetails:
    return {"type": PydanticCustomError("value_error", message), "loc": loc, "input": value}


Number = StrictInt | StrictFloat
Text = Annotated[StrictStr, StringConstraints(max_length=MAX_TEXT)]


def _checked_type(annotation: Any) -> Any:
    """The type a config value is validated as: the dataclass's annotation, strict (JSON has no
    implicit conversions a generator expects: "2" is not 2, 1.5 is not an int), every text
    and list bounded. A type with no JSON spelling (reasoning-gym's ARC board options) cannot
    be set."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is bool:
        return StrictBool
    if annotation is int:
        return StrictInt
    if annotation is float:
        return Number
    if annotation is str:
        return Text
    if annotation is tuple:  # a bare tuple: of words or numbers
        return Annotated[tuple[Text | Number, ...], Field(max_length=MAX_ITEMS)]
    if origin in (Union, UnionType):
        return Union[tuple(_checked_type(a) for a in args)]  # noqa: UP007  # built from a tuple
    if origin in (list, abc.Sequence):
        return Annotated[list[_checked_type(args[0])], Field(max_length=MAX_ITEMS)]  # type: ignore[misc]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = _checked_type(args[0])
            return Annotated[tuple[inner, ...], Field(max_length=MAX_ITEMS)]  # type: ignore[valid-type]
        return tuple[tuple(_checked_type(a) for a in args)]  # type: ignore[misc]
    if origin is Literal or annotation is type(None):
        return annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum | dt.date | dt.time):
        return annotation
    return Annotated[Any, AfterValidator(_no_json_form(annotation))]


def _no_json_form(annotation: Any) -> Any:
    """A validator refusing any value of a parameter whose type has no JSON spelling (the ARC
    generators' board options): it keeps the generator's default."""
    name = getattr(annotation, "__name__", str(annotation))

    def refuse(value: Any) -> Any:
        raise ValueError(f"a {name} cannot be written in a config; leave it at its default")

    return refuse


def generator_caps(name: str) -> dict[str, tuple[float, float]]:
    """(lowest, highest) of each numeric parameter of generator ``name``: the declared ``CAPS``,
    else ± ``CAP_FACTOR`` × its default, at least ``DEFAULT_CAP``."""
    _, config_cls = _generators()[name]
    hints = get_type_hints(config_cls)
    caps: dict[str, tuple[float, float]] = {}
    for f in dataclasses.fields(config_cls):
        if f.name in TASK_OWNED or hints.get(f.name) not in (int, float):
            continue
        default = f.default if isinstance(f.default, int | float) else 0
        bound = max(CAP_FACTOR * abs(default), DEFAULT_CAP)
        caps[f.name] = CAPS.get(name, {}).get(f.name, (-bound, bound))
    return caps


_KINDS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def generator_parameters(name: str) -> list[dict[str, Any]]:
    """Generator ``name``'s config parameters as a form offers them (seed and size excepted):
    each one's name, JSON type ("other" for one a form cannot type: a list, an enum), the
    generator's own default (None where it has none a form can show), and the caps a number
    must keep within. Raises KeyError for an unknown generator. Worked out once per generator
    (its default factories are called once, however often a form asks)."""
    return [dict(p) for p in _generator_parameters(name)]


@cache
def _generator_parameters(name: str) -> tuple[dict[str, Any], ...]:
    _, config_cls = _generators()[name]
    hints = get_type_hints(config_cls)
    caps = generator_caps(name)
    out = []
    for f in dataclasses.fields(config_cls):
        if f.name in TASK_OWNED:
            continue
        hint = hints.get(f.name)
        kind = _KINDS.get(hint, "other") if isinstance(hint, type) else "other"
        default: Any = f.default
        factory = f.default_factory
        if default is dataclasses.MISSING and callable(factory):
            with contextlib.suppress(Exception):
                default = factory()
        if not isinstance(default, bool | int | float | str) or default is dataclasses.MISSING:
            default = None  # a list, a tuple, an enum: the form says its type, not its value
        low, high = caps.get(f.name, (None, None))
        out.append({"name": f.name, "type": kind, "default": default, "min": low, "max": high})
    return tuple(out)


@cache
def config_model(name: str) -> type[BaseModel]:
    """A pydantic model of generator ``name``'s config dataclass (seed and size excepted: the
    task sets them): each field typed strictly from its annotation, numbers within
    ``generator_caps``, unknown keys refused, every field optional (the generator's default)."""
    _, config_cls = _generators()[name]
    hints = get_type_hints(config_cls)
    caps = generator_caps(name)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(config_cls):
        if f.name in TASK_OWNED:
            continue
        checked = _checked_type(hints.get(f.name, Any))
        if f.name in caps:
            low, high = caps[f.name]
            checked = Annotated[checked, Field(ge=low, le=high)]
        fields[f.name] = (checked | None, None)
    config = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
    return create_model(f"{name}_config", __config__=config, **fields)


def typed_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as generator ``name``'s dataclass takes it (tuples, dates, enums from their
    JSON spelling); raises ValidationError where it is not one."""
    model = config_model(name).model_validate(config)
    return {key: getattr(model, key) for key in config}


def generator_errors(
    name: str,
    config: dict[str, Any],
    name_loc: tuple[str | int, ...],
    config_loc: tuple[str | int, ...],
) -> list[InitErrorDetails]:
    """What is wrong with generator ``name`` under ``config``, each at the field to blame:
    an unknown generator at ``name_loc``; an unknown, task-owned, wrongly typed or over-cap key
    at ``config_loc + (key,)``; a value the generator's own ``validate`` refuses at the key its
    message names, else at ``config_loc``. Nothing is drawn here (validation runs on request
    threads and at every load of a config): drawing is the probe's, under a budget."""
    generators = _generators()
    if name not in generators:
        listed = ", ".join(sorted(generators))
        return [
            _error(name_loc, f"unknown reasoning-gym generator {name!r}; valid: {listed}", name)
        ]
    owned = [key for key in config if key in TASK_OWNED]
    if owned:
        message = "set by the task: training and held-out problems come from disjoint seeds"
        return [_error((*config_loc, key), message, config[key]) for key in owned]
    try:
        typed = typed_config(name, config)
    except ValidationError as exc:
        return [_field_error(name, config_loc, e) for e in exc.errors(include_url=False)]
    refusal = _refusal(name, typed)
    if refusal is None:
        return []
    # Blame the key the message names first ("max_terms must be >= min_terms": max_terms).
    named = {
        m.start(): key for key in config for m in re.finditer(rf"\b{re.escape(key)}\b", refusal)
    }
    blamed = named[min(named)] if named else None
    loc = config_loc if blamed is None else (*config_loc, blamed)
    message = f"generator {name!r} refuses this config: {refusal}"
    return [_error(loc, message, config if blamed is None else config[blamed])]


def _field_error(name: str, config_loc: Loc, error: Any) -> InitErrorDetails:
    """A config model's error as this task's: unknown keys list the generator's parameters."""
    loc = (*config_loc, *error["loc"])
    if error["type"] == "extra_forbidden":
        fields = ", ".join(config_model(name).model_fields)
        message = f"not a parameter of generator {name!r}; its parameters: {fields}"
        return _error(loc, message, error["input"])
    key = error["loc"][0]
    default = _defaults(name).get(key)
    if error["type"] in ("less_than_equal", "greater_than_equal"):
        low, high = generator_caps(name)[key]
        message = (
            f"{error['msg']}: {name}.{key} is capped at {low:g} to {high:g} here (larger"
            f" problems are too long to train on); the generator's default is {default}"
        )
        return _error(loc, message, error["input"])
    return _error(loc, f"{error['msg']} (the default is {default})", error["input"])


@cache
def _defaults(name: str) -> dict[str, str]:
    """Each parameter's default, as the messages show it (a long one cut)."""
    _, config_cls = _generators()[name]
    defaults = {}
    for f in dataclasses.fields(config_cls):
        factory = f.default_factory
        value = factory() if factory is not dataclasses.MISSING else f.default
        text = repr(value)
        defaults[f.name] = text if len(text) <= 80 else f"{text[:77]}..."
    return defaults


def _refusal(name: str, typed: dict[str, Any]) -> str | None:
    """Why generator ``name``'s own ``validate`` (its assertions, no drawing) refuses the config,
    or None."""
    _, config_cls = _generators()[name]
    try:
        config = config_cls(**typed, seed=TRAIN_SEED, size=POOL_SIZE)
        validate = getattr(config, "validate", None)
        if validate is not None:
            validate()
    except Exception as exc:  # whatever the config raises is a refusal of it
        return str(exc) or type(exc).__name__
    return None


class GeneratorSpec(BaseModel):
    """One generator of a mixture (reasoning-gym's ``DatasetSpec``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=100, description="A reasoning-gym generator.")
    weight: float = Field(1.0, gt=0, le=1e6, description="Its share of the problems, relative.")
    config: dict[str, Any] = Field(default_factory=dict, description="Its own parameters.")


class ReasoningGymParams(TaskParams):
    dataset: str = Field(
        "chain_sum",
        min_length=1,
        max_length=100,
        description="The reasoning-gym generator (basic_arithmetic, chain_sum, gsm_symbolic,"
        " leg_counting, countdown, … about a hundred).",
        json_schema_extra=_list_generators,
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The generator's own parameters (the fields of its config dataclass, seed"
        " and size excepted: the task sets those); unset ones take the generator's defaults.",
    )
    mixture: list[GeneratorSpec] = Field(
        default_factory=list,
        max_length=32,
        description="Several generators mixed with weights, as reasoning-gym's CompositeDataset"
        " does: [{name, weight, config}]. When given, it replaces dataset and config.",
    )
    answer_format: Literal["answer_tag", "boxed", "last_number"] = Field(
        "answer_tag",
        description="What the prompt asks the final answer to be written in, and what the"
        " verifier reads: the last <answer>…</answer>; the last \\boxed{}; or last_number, the"
        " last \\boxed{} else the last number (numeric generators, for small models that follow"
        " neither format: SmolLM2-135M-Instruct writes neither).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _check_generators(
        cls, data: Any, handler: ModelWrapValidatorHandler[ReasoningGymParams]
    ) -> ReasoningGymParams:
        params = handler(data)
        errors = []
        if params.mixture:
            names = [spec.name for spec in params.mixture]
            for i, spec in enumerate(params.mixture):
                if spec.name in names[:i]:
                    errors.append(_error(("mixture", i, "name"), "named twice", spec.name))
                    continue
                at = ("mixture", i)
                errors += generator_errors(spec.name, spec.config, (*at, "name"), (*at, "config"))
        else:
            errors += generator_errors(params.dataset, params.config, ("dataset",), ("config",))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return params

    def specs(self) -> list[GeneratorSpec]:
        """The generators mixed, with their weights (one of weight 1 without a mixture)."""
        return self.mixture or [GeneratorSpec(name=self.dataset, config=self.config)]


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------


def build_split(specs: list[GeneratorSpec], seed: int) -> Any:
    """reasoning-gym's CompositeDataset of ``specs`` seeded ``seed``: item i picks a generator
    by weight from Random(seed + i), then draws it from that generator, seeded seed + its
    position + 1 (reasoning_gym/composite.py)."""
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    # Each config as its dataclass takes it (tuples, dates, enums), not as JSON spells it.
    datasets = [DatasetSpec(s.name, s.weight, typed_config(s.name, s.config)) for s in specs]
    return CompositeDataset(CompositeConfig(size=POOL_SIZE, seed=seed, datasets=datasets))


@register_task(
    "reasoning_gym",
    params=ReasoningGymParams,
    description="reasoning-gym's procedural problems (about a hundred generators, or a weighted"
    " mixture), each scored by its generator's own verifier; answer in <answer></answer> or"
    " \\boxed{}.",
)
class ReasoningGymTask:
    name = "reasoning_gym"

    def __init__(self, params: ReasoningGymParams) -> None:
        self.answer_format = params.answer_format
        self.instruction = INSTRUCTIONS[params.answer_format]
        self.train = build_split(params.specs(), TRAIN_SEED)
        self.held_out = build_split(params.specs(), HELD_OUT_SEED)

    def example(self, item: dict[str, Any]) -> Example:
        """The generator's item as an example: the question and the instruction for the answer's
        format; the reference answer written in that format (what SFT would teach)."""
        prompt = f"{item['question'].rstrip()}\n\n{self.instruction}"
        answer = WRITTEN[self.answer_format].format(item["answer"])
        return Example(prompt, answer, data={"entry": item})

    def _draw(self, split: Any, rng: random.Random) -> Example:
        return self.example(split[rng.randrange(POOL_SIZE)])

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        return sample_split(lambda r: self._draw(self.train, r), rng, n, held_out=False)

    def eval_examples(self, n: int) -> list[Example]:
        rng = random.Random(EVAL_SAMPLING_SEED)
        return sample_split(lambda r: self._draw(self.held_out, r), rng, n, held_out=True)

    def score(self, completion: str, example: Example) -> float:
        """The generator's score of the completion's final answer, in [0, 1]."""
        answer = extract_answer(completion, self.answer_format)
        entry = example.data["entry"]
        return min(max(float(self.train.score_answer(answer, entry)), 0.0), 1.0)

    def verify(self, completion: str, example: Example) -> float:
        """1.0 at the generator's full score, else 0.0."""
        return float(self.score(completion, example) >= 1.0)

    def tool_solution(self, example: Example) -> str | None:
        """An expression whose value is the reference answer, for the generators that have one
        (``TOOL_SOLVABLE``); None for the others (``tool_expression``)."""
        return tool_expression(example.data["entry"])

    @classmethod
    def tool_solutions_missing(cls, params: ReasoningGymParams) -> str | None:
        """Why no problem of ``params`` has a tool solution (none of its generators has), or
        None."""
        names = [spec.name for spec in params.specs()]
        if any(name in TOOL_SOLVABLE for name in names):
            return None
        return (
            f"no generator of this task ({', '.join(names)}) has tool solutions; those that do:"
            f" {', '.join(sorted(TOOL_SOLVABLE))}"
        )

    def process_reward(self, completion: str, example: Example) -> float:
        """The generator's partial score (e.g. countdown's 0.01 for a well-formed wrong
        expression; the default's share of the answer that is the reference)."""
        return self.score(completion, example)


# --------------------------------------------------------------------------------------------
# Tool solutions: the expression a tool computes the answer with (the sft kind's tool traces)
# --------------------------------------------------------------------------------------------

# Generators whose items carry the expression of their answer (metadata "expression").
TOOL_SOLVABLE = frozenset({"basic_arithmetic", "chain_sum", "products"})
MAX_EXPRESSION_CHARS = 1000


def tool_expression(entry: dict[str, Any]) -> str | None:
    """The item's expression as Python evaluates it to the reference answer, or None.

    The generators write their expression in Python's syntax except for division: basic_arithmetic
    computes ``/`` as floor division (its ``eval_floordiv``), and without parentheses
    (``allow_parentheses: false``) it computes left to right, ignoring precedence, and sometimes
    multiplies where it wrote ``/``. So the candidates (``/`` as ``//``, as written then
    folded left to right) are each evaluated here, and the first whose value is the reference
    answer is the solution; an item neither matches has none."""
    metadata = entry.get("metadata", {})
    expression = metadata.get("expression")
    if metadata.get("source_dataset") not in TOOL_SOLVABLE or not isinstance(expression, str):
        return None
    try:
        answer = int(str(entry["answer"]).strip())
    except ValueError:
        return None
    floor = expression.replace("//", "/").replace("/", "//")
    for candidate in (floor, _left_to_right(floor)):
        if candidate is None:
            continue
        value = safe_eval(candidate, max_chars=MAX_EXPRESSION_CHARS, floor_division=True)
        if value == answer:
            return candidate
    return None


def _left_to_right(expression: str) -> str | None:
    """``a op b op c`` → ``(a op b) op c``: each operation on the result so far; None unless the
    expression is space-separated numbers and operators."""
    parts = expression.split()
    numbers, operators = parts[::2], parts[1::2]
    if len(parts) % 2 == 0 or not all(re.fullmatch(r"-?\d+", n) for n in numbers):
        return None
    if not all(op in ("+", "-", "*", "//") for op in operators):
        return None
    folded = numbers[0]
    for op, number in zip(operators, numbers[1:], strict=True):
        folded = f"({folded} {op} {number})"
    return folded if len(numbers) > 1 else None
