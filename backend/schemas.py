"""Request and response models of the REST API (docs/api.md)."""

from __future__ import annotations

import math
import unicodedata
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictBool,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticSerializationError, core_schema, to_json
from typing_extensions import TypeAliasType

from backend.runs.progress import eta_s
from backend.runs.rows import arm_of, run_label
from backend.runs.scheduling import Cluster, describe_needs, machine_of, resources_of
from conspo.config import RunConfig, names_in
from conspo.input_checks import (
    LABEL,
    MAX_JSON_DEPTH,
    MAX_JSON_KEY_CHARS,
    TEXT,
    anchored,
    json_problem,
    loc_text,
)
from conspo.registry import JOB_KINDS

if TYPE_CHECKING:
    from backend.models import Run

INT32_MAX = 2**31 - 1
MAX_LOG_POINTS = 10_000
MAX_LOG_PROMPTS = 10_000  # prompt rows per logging call
PROMPT_KEY = r"[A-Za-z0-9_.:-]{1,64}"  # a hash in hex, or a task example's id
NAME_MAX = 200  # runs.name


def _storable_json(value: dict[str, Any]) -> dict[str, Any]:
    if (problem := json_problem(value)) is not None:
        loc, message = problem
        raise ValueError(f"{message} (at {loc_text(loc)})" if loc else message)
    return value


def _nfc(value: Any) -> Any:
    # One spelling per tag: "é" as one code point or as e + combining accent look the same, so
    # they must be the same tag to filter on.
    return unicodedata.normalize("NFC", value) if isinstance(value, str) else value


# Every string of every request is a ``Text`` (no NUL, no unpaired surrogate) or, shown on one
# line, a ``Label`` (no control characters either): conspo.input_checks says why. Every
# free-form JSON object is a ``FreeJSON``: finite numbers, bounded depth, size and keys.
Text = Annotated[str, TEXT]
Label = Annotated[str, Field(min_length=1, max_length=NAME_MAX), LABEL]
Name = Label
Tag = Annotated[str, Field(min_length=1, max_length=100), BeforeValidator(_nfc), LABEL]
MetricKey = Label
# FreeJSON's JSON schema states what _storable_json accepts, but for its depth and size: text
# without NUL, keys of at most MAX_JSON_KEY_CHARS, integers within 64 bits, finite numbers (only
# the JSON schema uses these types; _storable_json walks a value faster, and iteratively). It
# cannot say all of it: to JSON Schema 1e30 is the integer 10**30, which the API takes as the
# number it was written as, and refuses only spelled in digits.
StorableText = Annotated[str, TEXT]
StorableKey = Annotated[str, Field(max_length=MAX_JSON_KEY_CHARS), TEXT]
StorableInt = Annotated[int, Field(ge=-(2**63), lt=2**63)]
JSONValue = TypeAliasType(
    "JSONValue",
    "None | bool | StorableInt | float | StorableText | list[JSONValue]"
    " | dict[StorableKey, JSONValue]",
)


class _JSONSchemaOf:
    """An annotation that gives a type the JSON schema of another."""

    def __init__(self, shape: Any) -> None:
        self._adapter = TypeAdapter(shape)

    def __get_pydantic_json_schema__(
        self, _: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(self._adapter.core_schema)


FreeJSON = Annotated[
    dict[str, Any],
    AfterValidator(_storable_json),
    _JSONSchemaOf(dict[StorableKey, JSONValue]),
]
# NaN and ±Infinity are accepted where they are data (a metric value, a rollout's score) and
# stored as NULL; everywhere else a number must be finite (``_Body``).
DataFloat = Annotated[float, Field(allow_inf_nan=True)]


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Request bodies are strict (``_Body``): a boolean is no number, 1 is no boolean and "5" no
# integer, as their JSON schema says, though pydantic's lax mode would take all three. But 5.0
# is an integer to JSON Schema, and so to every integer field of a body (``INTEGRAL`` after the
# field's bounds, so its schema keeps them).
INTEGRAL = BeforeValidator(_integral)
Int = Annotated[int, INTEGRAL]
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX), INTEGRAL]
Seed = Int32
Step = Int32
RunStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class _Submission(_Body):
    """What creating and cloning share: seeds, and a name that each seed's run suffixes."""

    seeds: list[Seed] | None = Field(
        None, max_length=64, description="One run per seed (config.seed replaced)."
    )
    name: Name | None = None

    @field_validator("name")
    @classmethod
    def _fits_with_seed_suffix(cls, name: str | None, info: ValidationInfo) -> str | None:
        # With 2+ seeds each run is named "<name>-s<seed>", which must fit the column too.
        seeds = set(info.data.get("seeds") or ())
        if name and len(seeds) > 1 and len(longest := f"{name}-s{max(seeds)}") > NAME_MAX:
            raise ValueError(
                f"with {len(seeds)} seeds the runs are named '<name>-s<seed>', up to"
                f" {len(longest)} characters; the limit is {NAME_MAX}"
            )
        return name


class RunCreate(_Submission):
    config: RunConfig
    tags: list[Tag] = Field(default_factory=list, max_length=50)


NOTE_MAX = 20_000  # characters of a note (Markdown)
Note = Annotated[str, Field(max_length=NOTE_MAX), TEXT]


class NotePatch(_Body):
    """A study's or a pipeline's note (Markdown; "" clears it)."""

    note: Note


def _one_given(schema: dict[str, Any]) -> None:
    """At least one of the fields is given, and not null (the model's own rule, in the schema)."""
    schema["anyOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in schema["properties"]
    ]


class RunPatch(_Body):
    """What a run's owner may change after submitting: its note, its tags and whether its model
    is shared. At least one."""

    model_config = ConfigDict(json_schema_extra=_one_given)

    note: Note | None = Field(None, description='Markdown (raw HTML is shown as text); "" clears.')
    tags: list[Tag] | None = Field(None, max_length=50, description="Replaces the run's tags.")
    model_shared: StrictBool | None = Field(
        None,
        description="True: other users may start from its checkpoints and rollouts"
        " (model.from_run, DPO's kind_params.from_run) and export what they train from it.",
    )

    @model_validator(mode="after")
    def _something(self) -> RunPatch:
        if self.note is None and self.tags is None and self.model_shared is None:
            raise ValueError("give note, tags, model_shared or several of them")
        return self


class RunClone(_Submission):
    overrides: FreeJSON = Field(
        default_factory=dict, description="Partial RunConfig, deep-merged into the source's."
    )
    tags: list[Tag] | None = Field(None, max_length=50)


class PipelineCreate(_Body):
    name: Name = Field(description="The pipeline's name; its stages' runs are named after it.")
    stages: list[RunConfig] = Field(
        min_length=1,
        max_length=16,
        description="Stage configs in order. Each stage after the first starts from the"
        " previous stage's run (model.from_run is set for it; model.step chooses the"
        " checkpoint, default last) and is queued when that run succeeds.",
    )
    tags: list[Tag] = Field(default_factory=list, max_length=50)


class ExternalRunCreate(_Body):
    name: Name
    config: FreeJSON = Field(default_factory=dict)
    algorithm: Annotated[str, Field(min_length=1, max_length=100), LABEL]
    task: Annotated[str, Field(min_length=1, max_length=100), LABEL]
    model: Annotated[str, Field(min_length=1, max_length=300), LABEL]
    tags: list[Tag] = Field(default_factory=list, max_length=50)
    total_steps: Int32 | None = None


class RunOut(BaseModel):
    id: int
    name: str
    owner: str | None
    status: RunStatusName
    cancel_requested: bool
    kind: str = Field(
        description="What it trains: a registered job kind (GET /api/presets).",
        json_schema_extra=names_in(JOB_KINDS),
    )
    algorithm: str | None = Field(description="Its algorithm; None for a kind that trains none.")
    label: str = Field(description='What it trains, for people: "rl · grpo", "sft".')
    task: str
    model: str
    config: dict[str, Any]
    seed: int
    group_id: str | None
    tags: list[str]
    note: str = Field("", description="The owner's Markdown note.")
    model_shared: bool = Field(
        False,
        description="Its owner lets other users start from its checkpoints and rollouts, and"
        " export what they train from it (PATCH sets it).",
    )
    note_html: str | None = Field(
        None, description="The note rendered (raw HTML escaped); in a single run's read only."
    )
    step: int
    total_steps: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    worker_host: str | None
    device: str | None = Field(description='Where it trained, e.g. "cuda:0 (NVIDIA H200)", "cpu".')
    dtype: str | None = Field(description="The compute dtype it trained in, e.g. bfloat16.")
    error: str | None
    summary: dict[str, float | None]
    external: bool
    attempt: int
    worker_deaths: int = Field(
        description="Attempts that ended with their worker gone (killed, out of memory, ...)."
    )
    last_worker_death: str | None = Field(description="What the reaper found the last time.")
    arm: str | None = Field(
        None, description="A study's run: the arm it was made for (compare groups by it)."
    )
    pace_s: float | None = Field(
        None,
        description="Seconds per step lately (about the last 30 steps, evaluations and"
        " checkpoints included); null before its first step.",
    )
    eta_s: float | None = Field(
        None,
        description="Seconds until it ends at that pace, as of this response; null unless it is"
        " running (not being cancelled) with a pace.",
    )
    order_value: float | str | None = Field(
        None,
        description="In a list with order_by: this run's value of what it is ordered by (the"
        " summary, e.g. max(sep/gap), or the config field); null otherwise or where it has none.",
    )
    phase: Literal["training", "evaluating"] | None = Field(
        None,
        description="What a running run is doing between steps: training, or evaluating on the"
        " held-out split (minutes may pass with no step logged); null when it is not running or"
        " is still setting up.",
    )
    resumed_from_step: int | None = Field(
        None,
        description="The checkpoint step the latest attempt resumed from (steps after it were"
        " trained again, each stored once); null when the run never resumed.",
    )
    cloned_from: int | None = Field(None, description="The run this one was cloned from.")
    pipeline_id: int | None = Field(None, description="The pipeline this run is a stage of.")
    pipeline_stage: int | None = Field(None, description="Its stage in the pipeline (0-based).")
    queue_position: int | None = Field(
        None, description="Queued runs: 1 for the next to start, in the order they were sent."
    )
    ray_job_id: str | None = Field(
        None,
        description="Multi-node runs: the Ray job and Ray Train run of the latest attempt.",
    )
    waiting_reason: str | None = Field(
        None,
        description="Queued runs: why no worker has taken it yet, from the live workers (e.g."
        ' "needs 8 GPUs; largest idle worker has 4 GPUs"); None when one is about to.',
    )
    resources_text: str = Field(
        "",
        description='What the run occupies, in the terms of the machine that holds it: "1 GPU",'
        ' "1 CPU process", "2 nodes × 8 GPUs" (where it trained once started, else what the'
        ' live workers offer); "external" for a run logged from elsewhere.',
    )


# Deeper than anything validation accepts, and well inside the ~250 levels JSON encoders allow.
RENDER_DEPTH = 2 * MAX_JSON_DEPTH


def renderable(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that always renders: NaN and ±Infinity as null, unpaired surrogates as
    U+FFFD, other objects as their text, nesting past ``RENDER_DEPTH`` cut to a marker string.

    Validation keeps such values out of the database; this keeps a row that holds one anyway
    (written by hand, or by an older version) from failing every list, page and stream that
    shows it, and a 422 from failing to echo what it refused.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict | list | tuple):
        if depth >= RENDER_DEPTH:
            return f"<nested deeper than {RENDER_DEPTH} levels>"
        if isinstance(value, dict):
            return {_valid_unicode(str(k)): renderable(v, depth + 1) for k, v in value.items()}
        return [renderable(v, depth + 1) for v in value]
    return _valid_unicode(value if isinstance(value, str) else str(value))


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:  # a lone surrogate: UTF-16 round trip replaces it, keeps pairs
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def run_out(run: Run, cluster: Cluster | None = None) -> dict[str, Any]:
    """A ``runs`` row as the API's ``RunOut`` (times as unix seconds, the owner by name),
    always renderable: one bad row never breaks a list or a stream. With ``cluster`` (the live
    workers), a queued run says why it waits."""
    out = _run_fields(run)
    if cluster is not None and run.status == "queued" and not run.external:
        out["waiting_reason"] = cluster.why_waiting(resources_of(run.config))
    out["resources_text"] = (
        "external"
        if run.external
        else describe_needs(resources_of(run.config), machine_of(run.device, cluster))
    )
    return out if _renders(out) else renderable(out)


# A response nests a row a few levels down (RunList > items > RunOut > config) and pydantic's
# encoder stops at a fixed depth, so the probe keeps this much headroom.
_RESPONSE_NESTING = 8


def _renders(value: Any) -> bool:
    """Whether the API's JSON encoder (pydantic's, for responses and streams) renders ``value``
    inside a response: an unpaired surrogate, or nesting near its depth limit, fail (NaN does
    not: it renders as null). Asking it costs a fifth of walking the value in Python."""
    for _ in range(_RESPONSE_NESTING):
        value = [value]
    try:
        to_json(value)
    except PydanticSerializationError:
        return False
    return True


def _run_fields(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "owner": run.owner.name if run.owner is not None else None,
        "status": run.status,
        "cancel_requested": run.cancel_requested,
        "kind": run.kind,
        "algorithm": run.algorithm,
        "label": run_label(run.kind, run.algorithm),
        "task": run.task,
        "model": run.model,
        "config": run.config,
        "seed": run.seed,
        "group_id": run.group_id,
        "tags": list(run.tags or []),
        "note": run.note or "",
        "model_shared": bool(run.model_shared),
        "cloned_from": run.cloned_from,
        "pipeline_id": run.pipeline_id,
        "pipeline_stage": run.pipeline_stage,
        "step": run.step,
        "total_steps": run.total_steps,
        "created_at": _ts(run.created_at),
        "started_at": _ts(run.started_at),
        "finished_at": _ts(run.finished_at),
        "heartbeat_at": _ts(run.heartbeat_at),
        "worker_host": run.worker_host,
        "device": run.device,
        "dtype": run.dtype,
        "error": run.error,
        "summary": run.summary or {},
        "external": run.external,
        "attempt": run.attempt,
        "worker_deaths": run.worker_deaths,
        "last_worker_death": run.last_worker_death,
        "resumed_from_step": run.resumed_from_step,
        "arm": arm_of(run.tags),
        "pace_s": run.pace_s,
        "eta_s": eta_s(run),
        "phase": run.phase if run.status == "running" else None,
        "ray_job_id": run.ray_job_id,
        "waiting_reason": None,
    }


class RunsCreated(BaseModel):
    group_id: str | None
    runs: list[RunOut]
    warnings: list[str] = Field(
        default_factory=list,
        description="What is worth a second look in the accepted config (a held-out split"
        " under 32 problems): said, not refused.",
    )


class RunList(BaseModel):
    items: list[RunOut]
    total: int


class LogStep(_Body):
    step: Step
    metrics: dict[MetricKey, DataFloat | None] = Field(default_factory=dict)
    wall_time: float | None = None


class RolloutRow(_Body):
    step: Step
    group: Int32
    index: Int32
    reward: DataFloat | None = None
    score: DataFloat | None = None
    length: Int32 = 0
    truncated: bool = False
    # Stored at most ROLLOUT_TEXT_CHARS characters each (longer text is cut, not refused).
    prompt: Annotated[str, Field(max_length=100_000)] = ""
    completion: Annotated[str, Field(max_length=100_000)] = ""


class PromptRow(_Body):
    """One prompt at one step: ``n`` rollouts sampled from it, ``correct`` of them verified
    correct. ``key`` names the prompt the same way at every step (``conspo.sink.prompt_key`` of
    its text, or the example's id)."""

    step: Step
    key: Annotated[str, anchored(PROMPT_KEY)]
    n: Annotated[int, Field(ge=1, le=INT32_MAX), INTEGRAL]
    correct: Int32

    @field_validator("correct")
    @classmethod
    def _at_most_n(cls, correct: int, info: ValidationInfo) -> int:
        n = info.data.get("n")
        if n is not None and correct > n:
            raise ValueError(f"correct ({correct}) is more than n ({n})")
        return correct


class LogBatch(_Body):
    steps: list[LogStep] = Field(default_factory=list, max_length=MAX_LOG_POINTS)
    rollouts: list[RolloutRow] = Field(default_factory=list, max_length=MAX_LOG_POINTS)
    prompts: list[PromptRow] = Field(default_factory=list, max_length=MAX_LOG_PROMPTS)
    status: Literal["running", "succeeded", "failed"] | None = None
    error: Annotated[str, Field(max_length=100_000), TEXT] | None = None


class LogResult(BaseModel):
    written: int


class Series(BaseModel):
    steps: list[int]
    values: list[float | None]
    min: list[float | None]
    max: list[float | None]
    wall_time: list[float]
    sampled: bool
    total_points: int


class MetricKeys(BaseModel):
    keys: list[str]


class RunSeries(BaseModel):
    run_id: int
    series: dict[str, Series]


class CompareSeries(BaseModel):
    series: dict[str, Series]


class Compare(BaseModel):
    runs: dict[str, CompareSeries]


class RolloutOut(BaseModel):
    step: int
    group: int
    index: int
    reward: float | None
    score: float | None
    length: int
    truncated: bool
    prompt: str | None = Field(None, description="With text=true: the prompt, ≤ 2,000 chars.")
    completion: str | None = Field(None, description="With text=true: the response, ≤ 2,000.")
    episode: dict[str, Any] | None = Field(
        None,
        description="With text=true: the environment episode the rollout played, null when it"
        " played none: {first_observation, turns: [{action, observation, reward, done, seconds,"
        " error, cut_chars, info, info_dropped}], final_reward, failure, truncated, turn_count,"
        " total_reward, succeeded}; each action and observation ≤ 1,000 chars.",
    )
    critique: str | None = Field(
        None,
        description="With text=true: the critique a reward gave with the rollout's value (a"
        " judge reward's first judgement), ≤ 2,000 chars; null when none did.",
    )


class RolloutList(BaseModel):
    items: list[RolloutOut]


class PromptDifficulty(BaseModel):
    """Per step with prompt data (``backend.storage.prompts`` defines each count): prompts
    sampled by pass-rate band, and prompts seen so far by fate."""

    steps: list[int]
    zero: list[int]  # pass rate 0
    low: list[int]  # (0, 0.5)
    high: list[int]  # [0.5, 1)
    one: list[int]  # 1
    learned: list[int]
    forgotten: list[int]
    never_solved: list[int]
    always_solved: list[int]
    seen: list[int]  # distinct prompts sampled up to the step
    next_step_min: int | None  # the next page's step_min; None: this is the last page


class NamedPreset(BaseModel):
    name: str
    description: str


class ModelPreset(NamedPreset):
    """A built-in model, and the run settings to start from with it (the form applies them)."""

    recommended: dict[str, Any] = Field(
        default_factory=dict,
        description="Run config sections merged over the form's when the model is chosen; {}:"
        " the defaults fit it.",
    )
    recommended_why: str = ""


class RegisteredPreset(NamedPreset):
    """An algorithm or a task: its parameters' JSON schema, and the defaults of those with one."""

    params_schema: dict[str, Any]
    defaults: dict[str, Any]
    plugin: str | None = Field(
        None, description="The users' plugin that registered it (conspo.plugins); null: built in."
    )


class RewardPreset(RegisteredPreset):
    default_weight: float = Field(description="Its weight when the config gives none.")
    tasks: list[str] = Field(
        description="The registered tasks a run may have it with (a reward may need a method of"
        " the task's, e.g. process its process signal); the config refuses it with the others."
    )


class KindPreset(RegisteredPreset):
    sections: list[str] = Field(
        description="The config sections only some kinds train with (algorithm, sampling,"
        " rewards) that this kind does; the form hides the others."
    )


class ToolPreset(NamedPreset):
    tag: str = Field(description="The model calls it by writing <tag>…</tag>.")
    sandboxed: bool = Field(
        description="It runs model-written code, in a worker's sandbox: a run with it needs a"
        " live worker whose capabilities say sandbox: bwrap."
    )


class ObservationFormat(BaseModel):
    """How a tool's output appears in a rollout's text: ``before`` + output + ``after``."""

    before: str
    after: str


class Presets(BaseModel):
    kinds: list[KindPreset] = Field(
        description="Job kinds (config.kind) with their kind_params schema and defaults."
    )
    algorithms: list[RegisteredPreset]
    tasks: list[RegisteredPreset]
    environments: list[RegisteredPreset] = Field(
        description="Environments the task `environment` may play (its params.environment), with"
        " the schema and defaults of their params (its params.environment_params)."
    )
    rewards: list[RewardPreset] = Field(
        description="Reward functions (config.rewards[].name) with their params schema, defaults,"
        " default weight and the tasks they apply to."
    )
    models: list[ModelPreset]
    config_schema: dict[str, Any]
    defaults: dict[str, Any] = Field(
        description="The form's starting config: the demo's settings (conspo.demo.DEMO_CONFIG) "
        "resolved, so a run from an untouched form is comparable with the demo's runs."
    )
    prompt_templates: dict[str, str] = Field(description="prompt.template's named templates.")
    tools: list[ToolPreset] = Field(
        description="Tools a rollout may call (config.tools.names): each one's tag and whether"
        " it runs code in the sandbox."
    )
    tool_observation: ObservationFormat = Field(
        description="The block a tool call's output is appended to the rollout as (the rollout"
        " viewer splits a response into turns at it)."
    )
    tool_timeout_max_s: float = Field(
        description="The longest tools.timeout_s this platform accepts"
        " (CONSPO_SANDBOX_MAX_TIMEOUT_S)."
    )


class WorkerOut(BaseModel):
    name: str = Field(description="host:pid")
    host: str
    started_at: float
    seen_at: float = Field(description="When its reaper last marked it alive.")
    gpus: list[dict[str, Any]] = Field(description="[{index, name, memory_bytes}]; [] on CPU.")
    capabilities: dict[str, Any] = Field(
        description="{engines: generation engines it can run, flash_attn: bool, torch: version,"
        " cuda: version or null, sandbox: bwrap or none (whether it can run model-written"
        " code: runs with a tool such as python need one that can)}, probed when it started."
    )


class LiveStreams(BaseModel):
    open: int = Field(description="Live streams (SSE) open on the API process that answered.")
    runs_watched: int = Field(
        description="Runs those streams follow (the process reads them all in one query a period)."
    )


class Health(BaseModel):
    status: Literal["ok", "degraded", "down"] = Field(
        description="down (HTTP 503): the database or the broker is unreachable; degraded: "
        "serving, but something needs attention (see reasons)."
    )
    database: str
    broker: str
    mode: Literal["embedded", "cluster"]
    version: str
    workers: list[WorkerOut] = Field(description="Live workers (seen recently).")
    stranded_runs: list[int] = Field(
        description="Queued runs sent long ago, unclaimed, whose job the queue seems to lack."
    )
    stale_runs: list[int] = Field(
        default_factory=list,
        description="Running runs whose heartbeat is older than the heartbeat timeout.",
    )
    reasons: list[str] = Field(description="Why the status is not ok, one line each.")
    live_streams: LiveStreams
    plugins: dict[str, list[dict[str, Any]]] = Field(
        description="The users' plugins this API process loaded ({loaded, failed}: name,"
        " source, version, what each provides, why one failed); each worker's are in its"
        " capabilities."
    )


class StageStart(BaseModel):
    run: int | None = Field(description="The run this stage starts from (the previous stage's).")
    step: str | int = Field(description="Its checkpoint: last, best or a kept step.")
    base: str | None = Field(description="The model name of the stage's config.")


class EvalAt(BaseModel):
    step: int
    values: dict[str, float | None]


class StageEval(BaseModel):
    start: EvalAt | None = Field(
        description="Its held-out evaluation at step 0, before it trained; null when it did not"
        " evaluate its start (eval.at_start off)."
    )
    end: EvalAt = Field(description="The last evaluated step's held-out evaluation.")


class StageOut(BaseModel):
    stage: int
    kind: str
    algorithm: str | None
    label: str = Field(description='What the stage trains, for people: "rl · grpo", "sft".')
    name: str | None
    run: RunOut | None = Field(description="Its run, once released.")
    waiting_for: int | None = Field(description="The stage whose success releases this one.")
    skipped: bool = Field(description="The pipeline ended before this stage had a run.")
    start: StageStart = Field(alias="from", serialization_alias="from")
    eval: StageEval | None

    model_config = ConfigDict(populate_by_name=True)


class LogChunkOut(BaseModel):
    seq: int = Field(description="Pass the last one seen as `since` to read on from it.")
    attempt: int = Field(description="The attempt that printed it (a resumed run has several).")
    wall_time: float
    text: str = Field(description="Whole lines, secrets redacted.")
    cut: bool = Field(description="A marker: the text says how much of the middle was cut.")


class RunLogOut(BaseModel):
    run_id: int
    chunks: list[LogChunkOut] = Field(description="After `since`, oldest first.")
    next: int = Field(description="The `since` of the next read (the last chunk's seq).")
    lines: list[str] | None = Field(None, description="With `tail`: the run's last lines.")


class PipelineOut(BaseModel):
    id: int
    name: str
    status: str = Field(description="queued, running, succeeded, failed or cancelled.")
    released: int = Field(description="Stages that have a run (-1: cancelled).")
    created_at: float
    note: str = Field("", description="The owner's Markdown note.")
    note_html: str = Field("", description="The note rendered (raw HTML escaped).")
    stages: list[StageOut]


class PipelineList(BaseModel):
    pipelines: list[PipelineOut]


class StudyProgress(BaseModel):
    """A study's progress against its planned work, the same on the studies list, the study
    page and the runs list's study row (``backend.studies.progress``)."""

    runs: int = Field(
        description="Runs planned: every (arm, seed) row, released or not (one the study"
        " cancelled before releasing it counts as a cancelled run)."
    )
    started: int = Field(description="Runs released so far.")
    ended: int = Field(description="Runs ended: succeeded, failed or cancelled (released or not).")
    steps: int = Field(description="Steps done, all its runs.")
    total_steps: int = Field(
        description="Steps planned, all its runs (a run that ended early keeps its plan)."
    )
    counts: dict[str, int] = Field(
        description="Runs per status: a released run's, else the row's (pending, cancelled)."
    )


STUDY_STATUS = (
    "active (runs pending, queued or running), done (every run finished: the verdict is final)"
    " or cancelled (stopped by its cancel, or by one of its runs cancelled from outside it: no"
    " more runs are released; those already queued or running are left to finish unless the"
    " study's own cancel stopped them)."
)


class StudySummary(BaseModel):
    id: int
    name: str
    status: str = Field(description=STUDY_STATUS)
    owner: str | None
    created_at: float
    note: str = Field("", description="The owner's Markdown note.")
    baseline: str | None
    arms: list[str]
    seeds: list[int]
    search: bool = Field(description="An Optuna search (its arms are its trials).")
    progress: StudyProgress | None = Field(None, description="Against the planned work.")


class StudyList(BaseModel):
    items: list[StudySummary]
    total: int


class StudyPlan(BaseModel):
    """What ``POST /api/studies`` would create, nothing stored."""

    arms: list[str]
    tasks: list[str]
    seeds: list[int]
    tuning_seeds: list[int] = Field(description="The seeds tuned arms' trials run on.")
    runs: int = Field(description="Runs in all: tuning_runs + final_runs.")
    tuning_runs: int = Field(description="Trials × tuning seeds, over the tuned arms.")
    final_runs: int = Field(description="Arms (or a search's trials) × tasks × seeds.")
    tokens: int = Field(
        description="At most this many generated tokens: each run's steps × prompts_per_step ×"
        " group_size × max_new_tokens, summed (a tuned arm's trials at the arm's own config)."
    )
    seconds: float | None = Field(
        description="Training time one run at a time, from the pace of earlier runs of the same"
        " model and shape (only with a token; None when some config has none)."
    )
    text: str = Field(description="The budget in words.")
    baseline: str | None


class StudyRunOut(BaseModel):
    arm: str
    task: str | None
    seed: int
    state: str = Field(
        description="pending (waiting for a slot), released (its run exists), cancelled (the"
        " study stopped before releasing it) or stopped (released, then stopped by the study:"
        " its cancel, a search's pruner)."
    )
    trial: int | None
    run_id: int | None
    name: str
    status: str = Field(description="Its run's status, else the row's state.")
    step: int
    total_steps: int | None
    objective: float | None = Field(description="The run's objective, once it succeeded.")


class StudyOut(BaseModel):
    """The study page's view: arms, runs, each finished run's objective, the statistics
    (``backend.studies.stats``) and the verdict."""

    id: int
    name: str
    owner: str | None
    status: str = Field(description=STUDY_STATUS)
    created_at: float
    note: str = Field("", description="The owner's Markdown note.")
    note_html: str = Field("", description="The note rendered (raw HTML escaped).")
    spec: dict[str, Any] = Field(description="The study as submitted (StudyCreate).")
    baseline: str
    concurrency: int
    objective: dict[str, Any]
    group_id: str = Field(description="Its runs' group id.")
    arms: list[dict[str, Any]] = Field(description="Per arm: its summary statistics.")
    pairs: list[dict[str, Any]] = Field(description="Each arm against the baseline.")
    verdict: list[str]
    separation: dict[str, dict[str, dict[str, Any]]]
    bounds: dict[str, list[float]] = Field(
        default_factory=dict, description="The range of each bounded key (a fraction: [0, 1])."
    )
    runs: list[StudyRunOut]
    counts: dict[str, int] = Field(description="Runs per status (``progress.counts``).")
    progress: StudyProgress = Field(description="As the studies list shows it.")
    seeds: list[int]
    tasks: dict[str, Any] | None = Field(None, description="Across tasks (a study over tasks).")
    curves: dict[str, Any] | None = Field(None, description="Per key and arm: mean ± 95% band.")
    search: dict[str, Any] | None = Field(None, description="A search's trials and importances.")
    tuning: dict[str, Any] | None = Field(
        None,
        description="A tuned study's first phase: per tuned arm its trials on the tuning seeds"
        " (parameters, value, state, runs) and its pick (trial, parameters, value, how sure);"
        " arms, pairs, verdict and runs are the final phase's alone.",
    )
    stopped_by: list[int] = Field(
        default_factory=list,
        description="A cancelled study stopped by its runs: those cancelled from outside it"
        " (the runs list, the run page, the API); empty when its own cancel stopped it.",
    )


# --- alerts (backend.alerts) ----------------------------------------------------------------

AlertEvent = Literal["failed", "finished", "stalled", "metric"]
RowId = Annotated[int, Field(ge=1, le=INT32_MAX), INTEGRAL]


class AlertRuleCreate(_Body):
    """An alert: an event of the runs in its scope, told to a webhook. The scope is ``run_id``,
    else ``study_id``, else every run of the caller."""

    name: Annotated[str, Field(max_length=NAME_MAX), LABEL] = ""
    run_id: RowId | None = None
    study_id: RowId | None = None
    event: AlertEvent = Field(
        description="failed; finished (succeeded, failed or cancelled); stalled (running, no step"
        " for stall_minutes); metric (a point of `metric` below or above `threshold`, or"
        " non-finite). Each rule fires at most once per run."
    )
    metric: MetricKey | None = Field(None, description="event=metric: the metric's key.")
    comparison: Literal["below", "above", "nonfinite"] | None = Field(
        None, description="event=metric: a point below or above threshold, or NaN/±Inf."
    )
    threshold: float | None = Field(None, description="event=metric, below or above.")
    stall_minutes: float | None = Field(
        None, gt=0, le=10_080, description="event=stalled: minutes without a step (default 10)."
    )
    webhook: Annotated[str, Field(min_length=1, max_length=2000), LABEL] = Field(
        description="An http(s) URL called with a JSON POST; a secret: answers show only its"
        " scheme and host."
    )
    format: Literal["slack", "discord", "json"] = Field(
        "slack",
        description="slack: {text}; discord: {content}; json: {text, alert: {id, rule_id,"
        " run_id, event, step, value, ...}}.",
    )


class AlertRuleOut(BaseModel):
    id: int
    name: str
    owner: str | None
    run_id: int | None
    study_id: int | None
    scope: str
    event: str
    metric: str | None
    comparison: str | None
    threshold: float | None
    stall_minutes: float | None
    webhook: str = Field(description="Its scheme and host only.")
    format: str
    created_at: datetime
    fired: int = Field(description="Runs it fired for.")
    delivered: int
    failed: int


class AlertRuleList(BaseModel):
    rules: list[AlertRuleOut]


class AlertFiringOut(BaseModel):
    id: int
    rule_id: int
    rule_name: str
    run_id: int
    event: str
    message: str
    step: int | None
    value: float | None
    created_at: datetime
    state: Literal["pending", "sending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime | None = Field(description="pending: when it is called again.")
    delivered_at: datetime | None
    last_error: str | None = Field(description="What the last call met (never the URL).")


class AlertFiringList(BaseModel):
    firings: list[AlertFiringOut]


class AlertTestOut(BaseModel):
    delivered: bool
    error: str | None


# --- Rollouts across runs (GET /api/compare/rollouts) ---------------------------------------


class AcrossRollout(BaseModel):
    group: int
    index: int
    reward: float | None
    score: float | None
    length: int
    truncated: bool
    completion: str = Field(description='≤ 2,000 chars as stored; "" when none was stored.')
    episode: dict[str, Any] | None = Field(description="As GET /api/runs/{id}/rollouts?text=true.")
    critique: str | None


class AcrossColumn(BaseModel):
    run_id: int
    groups: list[int] = Field(description="The run's groups of this prompt ([]: missing).")
    n: int
    rewarded: int = Field(description="Rollouts with reward > 0.")
    mean_reward: float | None
    score_gap: float | None = Field(
        description="Mean score of the rewarded rollouts − that of the unrewarded ones (reward"
        " ≤ 0); null unless both exist."
    )
    solved: bool | None = Field(description="A rewarded rollout; null: no rollout with a reward.")
    rollouts: list[AcrossRollout]


class AcrossPrompt(BaseModel):
    key: str | None = Field(description="prompt_key of the stored prompt; null: none stored.")
    prompt: str
    missing: list[int] = Field(description="Runs with no rollout of this prompt at the step.")
    disagree: bool = Field(description="A run solved it and another, with rewards, did not.")
    columns: list[AcrossColumn] = Field(description="One per run, in the order asked.")


class AcrossRun(BaseModel):
    id: int
    name: str
    algorithm: str | None
    arm: str | None
    seed: int
    status: str
    rollouts: int = Field(description="Its rollouts at the step.")
    prompts: int = Field(description="Its prompts at the step.")
    cut: bool = Field(description="Its step held more rollouts than were read (4,096).")


class AcrossLimits(BaseModel):
    runs: int
    rows: int
    text_chars: int


class RolloutsAcross(BaseModel):
    step: int
    steps: list[int] = Field(description="Steps every run sampled (≤ 2,000 listed, thinned).")
    steps_in_common: int
    runs: list[AcrossRun]
    prompts: int = Field(description="Prompts of the step, over every run.")
    paired: int = Field(description="Prompts every run sampled at the step.")
    disagree: int = Field(description="Prompts some run solved and another did not.")
    items: list[AcrossPrompt]
    left_out: int = Field(description="Prompts not in this answer (over its limits).")
    limits: AcrossLimits
