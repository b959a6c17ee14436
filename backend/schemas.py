"""Request and response models of the REST API (docs/api.md)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from conspo.config import RunConfig

if TYPE_CHECKING:
    from backend.models import Run

INT32_MAX = 2**31 - 1
MAX_LOG_POINTS = 10_000


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold NUL; refuse it as bad input rather than fail in the database.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)]
Tag = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_no_nul)]
MetricKey = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)]
Seed = Annotated[int, Field(ge=0, le=INT32_MAX)]
Step = Annotated[int, Field(ge=0, le=INT32_MAX)]
RunStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunCreate(_Body):
    config: RunConfig
    seeds: list[Seed] | None = Field(
        None, max_length=64, description="One run per seed (config.seed replaced)."
    )
    tags: list[Tag] = Field(default_factory=list, max_length=50)
    name: Name | None = None


class RunClone(_Body):
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Partial RunConfig, deep-merged into the source's."
    )
    seeds: list[Seed] | None = Field(None, max_length=64)
    tags: list[Tag] | None = Field(None, max_length=50)
    name: Name | None = None


class ExternalRunCreate(_Body):
    name: Name
    config: dict[str, Any] = Field(default_factory=dict)
    algorithm: Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_no_nul)]
    task: Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_no_nul)]
    model: Annotated[str, Field(min_length=1, max_length=300), AfterValidator(_no_nul)]
    tags: list[Tag] = Field(default_factory=list, max_length=50)
    total_steps: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class RunOut(BaseModel):
    id: int
    name: str
    owner: str | None
    status: RunStatusName
    cancel_requested: bool
    algorithm: str
    task: str
    model: str
    config: dict[str, Any]
    seed: int
    group_id: str | None
    tags: list[str]
    step: int
    total_steps: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    worker_host: str | None
    device: str | None
    error: str | None
    summary: dict[str, float | None]
    external: bool
    attempt: int
    worker_deaths: int = Field(
        description="Attempts that ended with their worker gone (killed, out of memory, ...)."
    )
    last_worker_death: str | None = Field(description="What the reaper found the last time.")


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def run_out(run: Run) -> dict[str, Any]:
    """A ``runs`` row as the API's ``RunOut`` (times as unix seconds, the owner by name)."""
    return {
        "id": run.id,
        "name": run.name,
        "owner": run.owner.name if run.owner is not None else None,
        "status": run.status,
        "cancel_requested": run.cancel_requested,
        "algorithm": run.algorithm,
        "task": run.task,
        "model": run.model,
        "config": run.config,
        "seed": run.seed,
        "group_id": run.group_id,
        "tags": list(run.tags or []),
        "step": run.step,
        "total_steps": run.total_steps,
        "created_at": _ts(run.created_at),
        "started_at": _ts(run.started_at),
        "finished_at": _ts(run.finished_at),
        "heartbeat_at": _ts(run.heartbeat_at),
        "worker_host": run.worker_host,
        "device": run.device,
        "error": run.error,
        "summary": run.summary or {},
        "external": run.external,
        "attempt": run.attempt,
        "worker_deaths": run.worker_deaths,
        "last_worker_death": run.last_worker_death,
    }


class RunsCreated(BaseModel):
    group_id: str | None
    runs: list[RunOut]


class RunList(BaseModel):
    items: list[RunOut]
    total: int


class LogStep(_Body):
    step: Step
    metrics: dict[MetricKey, float | None] = Field(default_factory=dict)
    wall_time: float | None = None


class RolloutRow(_Body):
    step: Step
    group: Annotated[int, Field(ge=0, le=INT32_MAX)]
    index: Annotated[int, Field(ge=0, le=INT32_MAX)]
    reward: float | None = None
    score: float | None = None
    length: Annotated[int, Field(ge=0, le=INT32_MAX)] = 0
    truncated: bool = False


class LogBatch(_Body):
    steps: list[LogStep] = Field(default_factory=list)
    rollouts: list[RolloutRow] = Field(default_factory=list, max_length=MAX_LOG_POINTS)
    status: Literal["running", "succeeded", "failed"] | None = None
    error: Annotated[str, Field(max_length=100_000), AfterValidator(_no_nul)] | None = None


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


class RolloutList(BaseModel):
    items: list[RolloutOut]


class NamedPreset(BaseModel):
    name: str
    description: str


class RegisteredPreset(NamedPreset):
    """An algorithm or a task: its parameters' JSON schema, and the defaults of those with one."""

    params_schema: dict[str, Any]
    defaults: dict[str, Any]


class Presets(BaseModel):
    algorithms: list[RegisteredPreset]
    tasks: list[RegisteredPreset]
    models: list[NamedPreset]
    config_schema: dict[str, Any]
    defaults: dict[str, Any]


class WorkerOut(BaseModel):
    name: str = Field(description="host:pid")
    host: str
    started_at: float
    seen_at: float = Field(description="When its reaper last marked it alive.")


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
    reasons: list[str] = Field(description="Why the status is not ok, one line each.")
