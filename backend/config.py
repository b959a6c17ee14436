"""Settings of the platform, read from ``CONSPO_*`` environment variables (pydantic-settings).

One code path, two deployments, chosen only by URLs:

* embedded (the default): SQLite under ``data_dir`` and Celery over kombu's SQLAlchemy transport
  on another SQLite file, so nothing but this process and one worker process is needed;
* cluster: ``CONSPO_DATABASE_URL=postgresql+psycopg://…`` and ``CONSPO_BROKER_URL=redis://…``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from conspo.config import MAX_TOOL_TIMEOUT_S

try:
    VERSION = version("conspo-lab")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0+source"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONSPO_", extra="ignore")

    data_dir: Path = Field(Path("data"), description="Where SQLite files, run workdirs live.")
    database_url: str = Field(
        "", description="SQLAlchemy URL; default sqlite:///<data_dir>/conspo.db."
    )
    broker_url: str = Field(
        "", description="Celery broker URL; default sqla+sqlite:///<data_dir>/broker.db."
    )
    model_store: Path | None = Field(
        None, description="conspo model store root; default <data_dir>/models."
    )
    queue: str = Field("gpu", description="Celery queue training jobs go to.")
    reads_require_token: bool = Field(False, description="Require a Bearer token on GETs too.")
    ui_token_inject: bool = Field(
        False, description="Inject the local admin token into HTML pages (embedded default)."
    )
    heartbeat_interval_s: float = Field(
        2.0, gt=0, description="Worker heartbeat / cancel-check period."
    )
    heartbeat_timeout_s: float = Field(
        60.0, gt=0, description="A running run whose heartbeat is older is re-queued."
    )
    task_check_slots: int = Field(
        2,
        ge=1,
        le=64,
        description="Probe helpers per API process that build a submitted procedural task"
        " (drawing problems, counting held-out ones) off the request threads.",
    )
    task_check_wait_s: float = Field(
        10.0,
        gt=0,
        le=120,
        description="A submit waits this long for a free probe helper, then 503 (a helper's"
        " first start imports for seconds on a busy machine).",
    )
    task_check_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Time a task may take to build and draw its first problems at submit time.",
    )
    task_check_memory_mib: int = Field(
        1024, ge=16, le=1_048_576, description="Memory a task may allocate while it is built."
    )
    cancel_grace_s: float = Field(
        30.0,
        gt=0,
        description="A running run still running this long after its cancel was requested (its"
        " trainer stops at the next step boundary, normally within seconds) is recorded"
        " cancelled and its training process killed (worker.watchdog).",
    )
    reaper_interval_s: float = Field(
        0.0, ge=0, description="Period of each worker's reaper thread (0: heartbeat_timeout/2)."
    )
    unsent_grace_s: float = Field(
        30.0, gt=0, description="A queued run never handed to the broker is re-sent after this."
    )
    unclaimed_resend_s: float = Field(
        300.0,
        gt=0,
        description="A queued run sent this long ago and still unclaimed is re-sent when the "
        "broker's queue holds fewer jobs than runs waiting (its message was lost).",
    )
    max_attempts: int = Field(
        3, ge=1, description="A run whose worker died this many times fails (out of memory?)."
    )
    db_retry_limit_s: float = Field(
        300.0,
        gt=0,
        description="A worker retries database errors this long, then stops the attempt (the "
        "run is handed back to the queue and resumes from its checkpoint).",
    )
    sqlite_busy_timeout_s: float = Field(
        30.0, gt=0, description="How long a SQLite write waits for another writer's lock."
    )
    max_request_bytes: int = Field(16 * 1024 * 1024, gt=0, description="Larger bodies get 413.")
    stream_poll_s: float = Field(
        0.1,
        gt=0,
        description="SSE database polling period. One query of a few columns reads every watched"
        " run, so a short period stays cheap (bench/sse_load.py); with the worker's 0.2 s write"
        " delay it keeps a step's arrival in the browser under 0.5 s at p95 (bench/freshness.py).",
    )
    stream_keepalive_s: float = Field(15.0, gt=0, description="SSE heartbeat comment period.")
    stream_max_per_client: int = Field(
        64,
        gt=0,
        description="Open live streams per caller (the token's user, else the client address); "
        "one more gets 429.",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated addresses of reverse proxies whose X-Forwarded-For is"
        " believed (`conspo-lab serve` passes them to uvicorn); empty: none, the peer address"
        " is the client's.",
    )
    stream_max_total: int = Field(
        2000, gt=0, description="Open live streams per API process; one more gets 503."
    )
    stream_db_connections: int = Field(
        2,
        gt=0,
        description="Database connections the live streams' shared poller uses at most "
        "(however many streams are open).",
    )
    db_pool_size: int = Field(10, gt=0, description="Database connections kept open per process.")
    db_max_overflow: int = Field(
        20, ge=0, description="Connections opened beyond db_pool_size under load."
    )
    db_request_concurrency: int = Field(
        8,
        gt=0,
        description="Requests using the database at once per process (others wait their turn, "
        "cheaply): beyond a few per core, more threads only contend for the GIL and starve the "
        "event loop that serves every stream. Capped by the pool.",
    )
    db_pool_timeout_s: float = Field(
        3.0,
        gt=0,
        description="Wait at most this long for a free database connection; the API then "
        "answers 503.",
    )
    db_statement_timeout_s: float = Field(
        60.0,
        ge=0,
        description="PostgreSQL: an API statement running longer is cancelled (503); 0: no limit.",
    )
    db_idle_in_transaction_timeout_s: float = Field(
        120.0,
        ge=0,
        description="PostgreSQL: an API connection idle inside a transaction this long is closed "
        "by the server (a leaked transaction cannot pin rows or a pool slot); 0: never.",
    )
    health_timeout_s: float = Field(
        5.0,
        gt=0,
        description="/api/health answers within this long whatever the database does (a slow"
        " database makes it degraded).",
    )
    request_timeout_s: float = Field(
        30.0,
        ge=0,
        description="A GET whose response has not started after this long gets 503 (queued work "
        "is dropped, not run late); streams start at once and are not cut. 0: no limit.",
    )
    worker_cpu_processes: int = Field(
        2,
        ge=1,
        le=64,
        description="On a worker without GPUs: how many gloo processes one run may use there, so"
        " runs with resources.gpus up to this count are routed to it.",
    )
    ray_address: str = Field(
        "",
        description="Ray cluster this worker submits multi-node runs (resources.nodes > 1) to,"
        " e.g. auto or ray://head:10001; empty: this worker takes no such run.",
    )
    worker_pool: Literal["solo", "prefork", "threads"] = Field(
        "solo", description="Celery pool of `conspo-lab worker` (concurrency is always 1)."
    )
    # What a run's config may make a worker read, load or allocate (checked at submit and again
    # by the worker, whose settings are the ones that count): conspo.access,
    # conspo.models.resources.
    data_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated directories datasets (task.params.path) are read from;"
        " default <data_dir>/datasets.",
    )
    max_dataset_bytes: int = Field(256 * 2**20, gt=0, description="Size cap of a dataset file.")
    model_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated directories local models (model.name) load from, besides"
        " the model store.",
    )
    hub_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated Hugging Face hub ids workers may load, or prefixes ending"
        " in * (Qwen/*); empty: none.",
    )
    max_run_memory_gib: float = Field(
        0.0,
        ge=0,
        description="Runs estimated to need more memory are refused (0: this machine's memory;"
        " a worker also refuses more than its device has).",
    )
    # A study's budget (backend.studies.budget), estimated at its check and refused above these
    # at submit: a tuned study multiplies trials by seeds before its final seeds begin.
    study_max_runs: int = Field(
        200,
        ge=1,
        le=1_000,
        description="Most runs one study may plan, both phases of a tuned study counted.",
    )
    study_max_tokens: int = Field(
        2_000_000_000,
        ge=1,
        description="Most tokens one study may generate by its estimate (each run's steps ×"
        " prompts per step × rollouts per prompt × max_new_tokens, summed over its runs).",
    )

    # Model-written code (tools such as python, code tasks) runs only in a worker's sandbox
    # (worker.capabilities advertises it; conspo.sandbox).
    sandbox_max_timeout_s: float = Field(
        30.0,
        gt=0,
        le=MAX_TOOL_TIMEOUT_S,
        description="Longest wall-clock time one tool call may run in the sandbox: a run asking"
        " more (tools.timeout_s) is refused at submit, and by a worker whose own limit is lower.",
    )

    # Alerts (backend.alerts): rules checked by every API process, their webhooks called from
    # there, with these bounds.
    alert_poll_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="How often an API process checks alert rules and sends the deliveries due.",
    )
    public_url: str = Field(
        "",
        max_length=500,
        description="The address people open this platform's pages at (https://lab.example.org),"
        " for links in alerts; empty: alerts name runs by id only.",
    )
    alert_webhook_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated hosts alert webhooks may call (exact names, or *.suffix);"
        " empty: any public host.",
    )
    alert_allow_private: bool = Field(
        False,
        description="Let alert webhooks call loopback, private and link-local addresses (off: an"
        " alert cannot be made to reach the platform's own services).",
    )
    alert_timeout_s: float = Field(
        5.0, gt=0, le=60, description="One webhook call's limit (connect, send and answer)."
    )
    alert_max_attempts: int = Field(
        6,
        ge=1,
        le=50,
        description="Webhook calls per alert before it is marked failed; the"
        " waits between them double from 2 s.",
    )
    alert_per_minute: int = Field(
        60,
        ge=1,
        le=10_000,
        description="Webhook calls per API process per minute; the rest wait their turn.",
    )

    @field_validator(
        "data_roots", "model_roots", "hub_allow", "trusted_proxies", "alert_webhook_hosts",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        # Every directory is made absolute once, here, against the process's working directory:
        # the platform stores and passes these paths (a chained run's start model, a run's
        # workdir, the model roots a worker admits), and a relative one joined onto a root that
        # is itself relative (data/runs/10/start_model under data/runs/10) names nothing.
        self.data_dir = _absolute(self.data_dir)
        self.data_roots = [_absolute(root) for root in self.data_roots]
        self.model_roots = [_absolute(root) for root in self.model_roots]
        if self.model_store is not None:
            self.model_store = _absolute(self.model_store)
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'conspo.db'}"
        if not self.broker_url:
            self.broker_url = f"sqla+sqlite:///{self.data_dir / 'broker.db'}"
        if self.model_store is None:
            self.model_store = self.data_dir / "models"
        if not self.data_roots:
            self.data_roots = [self.data_dir / "datasets"]
        return self

    @property
    def mode(self) -> Literal["embedded", "cluster"]:
        return "embedded" if self.database_url.startswith("sqlite") else "cluster"

    @property
    def token_file(self) -> Path:
        return self.data_dir / "token"

    @property
    def reaper_period_s(self) -> float:
        return self.reaper_interval_s or self.heartbeat_timeout_s / 2

    @property
    def worker_alive_s(self) -> float:
        """A worker not seen for this long is dead (each reaper pass marks its worker alive)."""
        return max(self.heartbeat_timeout_s, 2 * self.reaper_period_s)

    def run_dir(self, run_id: int) -> Path:
        return self.data_dir / "runs" / str(run_id)


def _absolute(path: Path) -> Path:
    """``path`` with ``~`` expanded, made absolute (not resolved: a symlinked data dir keeps the
    name its operator gave it)."""
    return Path(os.path.abspath(path.expanduser()))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()  # fields come from the environment
