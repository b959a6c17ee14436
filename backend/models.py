"""The schema (SQLAlchemy 2 typed ORM). Alembic (migrations/) is the only way it changes.

* ``runs``: one row per training job, status machine queued → running → succeeded|failed|cancelled
  (every transition is in ``backend.runs.lifecycle``).
* ``metrics``: long format, primary key (run_id, key, step) → value (NULL for NaN/Inf): the key
  serves both the idempotent upsert and the (run, key, step-range) reads. ``seq`` is the run's
  ``write_seq`` of the write that last touched the point (the live stream's cursor).
* ``metrics``, ``rollout_steps`` and ``metric_rollups`` have no foreign key to ``runs``: PostgreSQL
  checks one with a query per inserted row (half the cost of a bulk write). Writers lock the
  run row first (``storage.writes.write_points``, ``storage.series._cache_rollups``) and
  ``lifecycle.delete_run`` deletes the run row before its points.
* ``rollout_steps``: a bounded per-step sample of (group, index, reward, score, length,
  truncated), one row per step holding an array per field.
* ``users`` / ``api_tokens``: bearer tokens stored as sha256 hex digests only.
* ``pipelines``: ordered stage configs; ``runs.pipeline_id``/``pipeline_stage`` place a run in one.
* ``workers``: one row per live worker process, renewed by its reaper (``backend.liveness``),
  with the GPUs and optional packages it has.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from conspo.config import RunConfig

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both dialects (SQLite stores naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


DEFAULT_KIND: str = RunConfig.model_fields["kind"].default  # a run whose config names no kind

MAX_ABS_VALUE = 1e290  # larger magnitudes could overflow a bucket's sum; stored as NULL too


def finite(value: float | None) -> float | None:
    """NaN/Inf are stored as NULL (JSON has no spelling for them), as are |x| > 1e290."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) <= MAX_ABS_VALUE else None


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


FINISHED = (RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex
    label: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)

    user: Mapped[User] = relationship(lazy="joined")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_status_heartbeat", "status", "heartbeat_at"),
        Index("ix_runs_created_at", "created_at"),
        # No two runs share a name (run_rows.unique_names picks a free suffix; this index makes
        # two concurrent submissions of one name collide instead of both succeeding).
        Index("ux_runs_name", "name", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), index=True
    )
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.queued)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the run trains (RunConfig.kind: rl, sft, distill, dpo; external runs are rl), and
    # the algorithm it trains with: None for a kind that trains none (RegisteredJobKind).
    kind: Mapped[str] = mapped_column(String(32), default=DEFAULT_KIND, server_default=DEFAULT_KIND)
    algorithm: Mapped[str | None] = mapped_column(String(100))
    task: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(String(300))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    group_id: Mapped[str | None] = mapped_column(String(64), index=True)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    worker_host: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(100))  # e.g. "cuda:0 (NVIDIA H200)", "cpu"
    dtype: Mapped[str | None] = mapped_column(String(20))  # the compute dtype, e.g. "bfloat16"
    # Multi-node runs: the Ray job / Ray Train run of the latest attempt ("<job id>/<run name>").
    ray_job_id: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    external: Mapped[bool] = mapped_column(Boolean, default=False)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped by every metric write, under this row's lock: per run, it orders writes as they
    # committed, so the live stream can use it as a cursor.
    write_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Attempts that ended with their worker gone (heartbeat stale: killed, out of memory, ...);
    # at ``max_attempts`` the run fails. A worker that stops cleanly (SIGTERM, a long database
    # outage) hands the run back without counting one.
    worker_deaths: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_worker_death: Mapped[str | None] = mapped_column(Text)  # what the reaper found
    # The checkpoint step the latest attempt resumed from (null: it never resumed).
    resumed_from_step: Mapped[int | None] = mapped_column(Integer)
    # Its pace: seconds per step over about its last PACE_WINDOW steps (evaluations and
    # checkpoints included), and when its latest step was logged (unix time); the ETA's inputs
    # (backend.runs.progress), kept up by every write that advances the step.
    pace_s: Mapped[float | None] = mapped_column(Float)
    last_step_at: Mapped[float | None] = mapped_column(Float)
    # What the running attempt is doing between steps (the trainer's "phase" events): "training"
    # or "evaluating"; null before its first event (setting up). Reset by every claim.
    phase: Mapped[str | None] = mapped_column(String(16))
    cloned_from: Mapped[int | None] = mapped_column(Integer)  # the run this one was cloned from
    # A pipeline's stage (0-based): created when the stage before it succeeded (lifecycle.finish).
    pipeline_id: Mapped[int | None] = mapped_column(Integer, index=True)
    pipeline_stage: Mapped[int | None] = mapped_column(Integer)
    note: Mapped[str] = mapped_column(Text, default="", server_default="")  # Markdown
    # Its owner lets other users start from its checkpoints and rollouts (model.from_run, a job
    # kind's input runs) and export what they train from it (backend.runs.sharing).
    model_shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    owner: Mapped[User | None] = relationship(lazy="joined")


class Pipeline(Base):
    """Stage configs submitted as one unit (``POST /api/pipelines``). Stage 0's run is queued at
    once; stage k+1's run is created, starting from stage k's last checkpoint, when stage k's
    run succeeds. ``released`` counts the stages that have a run: the conditional update on it
    is what makes that release happen once, whoever finishes the run; a cancelled pipeline holds
    ``pipelines.stages.STOPPED`` (-1) there, so no release matches."""

    __tablename__ = "pipelines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    stages: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    released: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    note: Mapped[str] = mapped_column(Text, default="", server_default="")  # Markdown
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    owner: Mapped[User | None] = relationship(lazy="joined")


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_run_seq", "run_id", "seq"),)

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)
    wall_time: Mapped[float] = mapped_column(Float)
    seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


# A column of numbers per row: a PostgreSQL array, a JSON list on SQLite (no array type). A NULL
# element is None in Python.
def _array_of(element: Any) -> Any:
    return JSON().with_variant(postgresql.ARRAY(element), "postgresql")


class RolloutStep(Base):
    """One step's sampled rollouts: element i of each array is one rollout, in (group, index)
    order, each (group, index) once, at least one per row.

    One row per step rather than one per rollout: a write stores a row per step (the primary
    key's index and the per-row costs of a bulk write, paid once per step instead of 64 times).
    """

    __tablename__ = "rollout_steps"

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    group: Mapped[list[int]] = mapped_column(_array_of(Integer))
    index: Mapped[list[int]] = mapped_column(_array_of(Integer))
    reward: Mapped[list[float | None]] = mapped_column(_array_of(Float))
    score: Mapped[list[float | None]] = mapped_column(_array_of(Float))  # normalised log-prob
    length: Mapped[list[int]] = mapped_column(_array_of(Integer))  # response tokens incl. EOS
    truncated: Mapped[list[bool]] = mapped_column(_array_of(Boolean))  # no EOS by the limit


class RolloutText(Base):
    """The text of a sampled rollout (``conspo.sink.RolloutRecord``'s prompt and completion,
    each at most ``ROLLOUT_TEXT_CHARS``, its episode and its critique), beside its numbers in
    ``rollout_steps``: a table of its own so the numeric writes and the distribution reads
    never carry text."""

    __tablename__ = "rollout_texts"

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    group: Mapped[int] = mapped_column(Integer, primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)
    # A rollout that played an environment: its episode (``conspo.sink.episode_json``: the
    # first observation, each turn, the outcome); NULL for one that played none.
    episode: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # The critique a reward gave with the rollout's value (``conspo.sink.RolloutRecord
    # .critique``: a judge's first judgement, clipped); NULL where none did.
    critique: Mapped[str | None] = mapped_column(Text, nullable=True)


class PromptStat(Base):
    """How one prompt did at one step: its rollouts and how many were verified correct.

    ``prompt_key`` is ``conspo.sink.prompt_key`` of the prompt text (16 hex digits), so the same
    prompt has the same key at every step it is sampled; the per-prompt views are built from it.
    """

    __tablename__ = "prompt_stats"

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    correct: Mapped[int] = mapped_column(Integer)


class RunLogChunk(Base):
    """What a run's training process printed (stdout and stderr, its ranks' too), in chunks of
    whole lines as the worker captured them (``worker.run_log``), secrets redacted. Bounded per
    run (``backend.storage.run_logs``): past the cap the middle is cut and one ``cut`` chunk
    says how much went, so the head (how it started) and the tail (how it ended) stay."""

    __tablename__ = "run_logs"

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)  # 1, 2, ... per run
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    wall_time: Mapped[float] = mapped_column(Float)
    text: Mapped[str] = mapped_column(Text)
    lines: Mapped[int] = mapped_column(Integer, default=0)
    nbytes: Mapped[int] = mapped_column(Integer, default=0)  # of text, UTF-8
    cut: Mapped[bool] = mapped_column(Boolean, default=False)  # a marker: text says what went


class MetricRollup(Base):
    """A cache of bucket aggregates for downsampled reads, filled by writes and readers.

    Bucket ``bucket`` of width ``width`` (a power of two) covers steps
    ``[bucket*width, (bucket+1)*width - 1]`` (``hi_step`` is the last). Only buckets that lie
    wholly before a series' last step are cached; every metric write deletes the rows of its
    keys whose ``hi_step`` reaches its first step, so a rewritten step never serves a stale
    aggregate, then stores the buckets of the charts' widths afresh
    (``backend.storage.series.refresh_rollups``).
    """

    __tablename__ = "metric_rollups"
    __table_args__ = (Index("ix_metric_rollups_run_hi", "run_id", "hi_step"),)

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    width: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hi_step: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(Integer)  # points in the bucket
    n_valid: Mapped[int] = mapped_column(Integer)  # non-NULL values
    v_sum: Mapped[float | None] = mapped_column(Float)
    v_min: Mapped[float | None] = mapped_column(Float)
    v_max: Mapped[float | None] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(Integer)
    last_wall: Mapped[float] = mapped_column(Float)


class Worker(Base):
    """A live worker process: each worker's reaper thread renews ``seen_at`` every pass.

    In the database (not the broker) because both deployments read it the same way, it
    survives a broker restart, and ``/api/health`` reads it with one query instead of a
    broadcast round trip (kombu's SQLAlchemy transport has no broadcast at all).
    """

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # host:pid
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # What it can run, probed at start (``worker.capabilities``): [{index, name, memory_bytes}]
    # and {engines, flash_attn, torch, cuda}.
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list, server_default="[]")
    capabilities: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")


class StudyStatus(StrEnum):
    active = "active"  # runs pending, queued or running
    done = "done"  # every run finished
    # stopped by its own cancel (its queued and running runs cancelled too), or by one of its
    # runs cancelled from outside it (its other runs are left to finish); no run is released
    cancelled = "cancelled"


class Study(Base):
    """Arms × seeds of ordinary runs and the objective that turns each run into one number.

    ``spec`` is the study as submitted (``backend.studies.spec.StudyCreate``). Its runs are
    ``study_runs`` rows: ``pending`` ones wait for a free slot under ``concurrency`` and become
    runs (``run_id`` set, ``released``) as earlier runs finish (``backend.studies.service``).
    """

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), index=True
    )
    status: Mapped[str] = mapped_column(String(16), default=StudyStatus.active, index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    baseline: Mapped[str | None] = mapped_column(String(100))
    concurrency: Mapped[int] = mapped_column(Integer, default=4)
    note: Mapped[str] = mapped_column(Text, default="", server_default="")  # Markdown
    # A tuned study's picks (``backend.studies.tuned``): written once, when every tuned arm's
    # search has finished and its final runs are planned; NULL while it tunes (and for others).
    tuning: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    owner: Mapped[User | None] = relationship(lazy="joined")


class StudyRunState(StrEnum):
    pending = "pending"  # waiting for a slot; no run yet
    released = "released"  # its run exists (queued, running or finished)
    cancelled = "cancelled"  # the study was cancelled before it was released
    stopped = "stopped"  # released, then stopped by the study itself (its cancel, a pruner)


class StudyRun(Base):
    __tablename__ = "study_runs"
    __table_args__ = (
        Index("ix_study_runs_study_state", "study_id", "state"),
        Index("uq_study_runs_arm_seed", "study_id", "arm", "seed", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    arm: Mapped[str] = mapped_column(String(100))
    seed: Mapped[int] = mapped_column(BigInteger)
    position: Mapped[int] = mapped_column(Integer)  # release order: seed-major, arms interleaved
    state: Mapped[str] = mapped_column(String(16), default=StudyRunState.pending)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the validated RunConfig of this run
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True
    )
    trial: Mapped[int | None] = mapped_column(Integer)  # the Optuna trial number (search studies)


class AlertRule(Base):
    """When to tell someone, and where (``backend.alerts``): an event of the runs in its scope
    (one run, a study's runs, or every run of its owner) delivered to a webhook. The URL is a
    secret (a Slack or Discord webhook's path is its key): no page, answer or log shows more
    than its scheme and host."""

    __tablename__ = "alert_rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="", server_default="")
    # The scope: run_id, else study_id, else every run its owner owns.
    run_id: Mapped[int | None] = mapped_column(Integer, index=True)
    study_id: Mapped[int | None] = mapped_column(Integer, index=True)
    event: Mapped[str] = mapped_column(String(16))  # failed, finished, stalled, metric
    metric_key: Mapped[str | None] = mapped_column(String(200))
    comparison: Mapped[str | None] = mapped_column(String(16))  # below, above, nonfinite
    threshold: Mapped[float | None] = mapped_column(Float)
    stall_s: Mapped[float | None] = mapped_column(Float)  # stalled: no step for this long
    webhook_url: Mapped[str] = mapped_column(Text)
    webhook_format: Mapped[str] = mapped_column(String(16), default="slack")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AlertFiring(Base):
    """A rule that fired for a run: once per (rule, run), whichever process saw it first (the
    unique index), and its webhook delivery, claimed by one process at a time (``state``
    ``sending`` until ``claimed_until``) and retried with backoff until ``next_attempt_at``."""

    __tablename__ = "alert_firings"
    __table_args__ = (
        Index("ux_alert_firings_rule_run", "rule_id", "run_id", unique=True),
        Index("ix_alert_firings_state_next", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule_id: Mapped[int] = mapped_column(ForeignKey("alert_rules.id", ondelete="CASCADE"))
    run_id: Mapped[int] = mapped_column(Integer, index=True)
    event: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    state: Mapped[str] = mapped_column(String(16), default="pending")  # sending delivered failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)


class EvalAnswer(Base):
    """One held-out or benchmark problem at one evaluation of a run (``conspo.sink
    .AnswerRecord``): its answer, whether it was right, its s_θ and the pass@k draws, so runs
    can be compared problem by problem. ``problem_key`` (the prompt's hash) pairs the same
    problem across runs; ``position`` is its index in the run's split. A run keeps at most
    ``storage.answers.MAX_EVALUATIONS`` evaluations per source, thinned evenly."""

    __tablename__ = "eval_answers"
    __table_args__ = (Index("ix_eval_answers_run_source_key", "run_id", "source", "problem_key"),)

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # runs.id (no FK: see above)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(100), primary_key=True)  # held_out or a benchmark
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_key: Mapped[str] = mapped_column(String(64))
    prompt: Mapped[str] = mapped_column(Text)
    reference: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    solved: Mapped[bool] = mapped_column(Boolean)
    score: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    samples_correct: Mapped[int] = mapped_column(Integer)
    episode: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
