"""Run operations shared by the routes, the CLI (demo runs) and the tests."""

from __future__ import annotations

import copy
import logging
import uuid
from typing import Any

from celery import Celery
from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINISHED, Metric, MetricRollup, Rollout, Run, RunStatus, User, utcnow
from backend.queue import send_run
from conspo.config import RunConfig, TaskConfig

log = logging.getLogger(__name__)


def ts(value: Any) -> float | None:
    return value.timestamp() if value is not None else None


def run_out(run: Run) -> dict[str, Any]:
    """The API's ``Run`` (times as unix seconds)."""
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
        "created_at": ts(run.created_at),
        "started_at": ts(run.started_at),
        "finished_at": ts(run.finished_at),
        "heartbeat_at": ts(run.heartbeat_at),
        "worker_host": run.worker_host,
        "device": run.device,
        "error": run.error,
        "summary": run.summary or {},
        "external": run.external,
        "attempt": run.attempt,
    }


def default_name(config: RunConfig) -> str:
    return config.name or f"{config.algorithm}-{config.task.name}-s{config.seed}"


def create_runs(
    session: Session,
    celery: Celery,
    settings: Settings,
    owner: User,
    config: RunConfig,
    *,
    seeds: list[int] | None = None,
    tags: list[str] | None = None,
    name: str | None = None,
) -> tuple[str | None, list[Run]]:
    """Insert one queued run per seed, commit, then publish each.

    The rows are committed before publishing so a worker never receives an id it cannot see. If
    publishing fails, the unsent rows are deleted and the caller gets a 503; a process dying
    between commit and publish leaves rows with ``enqueued_at`` NULL, which the worker's reaper
    re-sends after ``unsent_grace_s``.
    """
    seed_list = list(dict.fromkeys(seeds)) if seeds else [config.seed]
    group_id = uuid.uuid4().hex if len(seed_list) >= 2 else None
    runs: list[Run] = []
    for seed in seed_list:
        cfg = config.model_copy(update={"seed": seed})
        if name:
            cfg = cfg.model_copy(
                update={"name": name if len(seed_list) == 1 else f"{name}-s{seed}"}
            )
        run = Run(
            name=default_name(cfg),
            owner_id=owner.id,
            status=RunStatus.queued,
            algorithm=cfg.algorithm,
            task=cfg.task.name,
            model=cfg.model.name,
            config=cfg.model_dump(mode="json"),
            seed=seed,
            group_id=group_id,
            tags=list(dict.fromkeys(tags or [])),
            total_steps=cfg.steps,
            summary={},
        )
        session.add(run)
        runs.append(run)
    session.commit()
    sent: list[Run] = []
    try:
        for run in runs:
            send_run(celery, settings, session, run.id)
            sent.append(run)
    except Exception as exc:  # broker down: leave nothing queued that no worker will get
        session.rollback()
        unsent = [r.id for r in runs if r not in sent]
        session.execute(delete(Run).where(Run.id.in_(unsent)))
        session.commit()
        log.warning("enqueue failed for runs %s: %s", unsent, type(exc).__name__)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"the job queue is unavailable ({type(exc).__name__}); nothing was queued",
        ) from None
    for run in runs:
        session.refresh(run)
    return group_id, runs


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def cloned_config(source: Run, overrides: dict[str, Any]) -> RunConfig:
    """The source's config with ``overrides`` deep-merged; 422s locate errors under overrides."""
    if source.external:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"run {source.id} is external (logged from elsewhere) and cannot be cloned",
        )
    base = dict(source.config)
    new_algorithm = overrides.get("algorithm")
    if new_algorithm and new_algorithm != base.get("algorithm") and "params" not in overrides:
        base.pop("params", None)  # the old algorithm's params would not validate
    base_task, new_task = base.get("task"), overrides.get("task")
    if (
        isinstance(base_task, dict)
        and isinstance(new_task, dict)
        and new_task.get("name", base_task.get("name")) != base_task.get("name")
        and "params" not in new_task
    ):  # nor would the old task's (under params, or flat in a config stored before tasks had them)
        shared = TaskConfig.model_fields.keys() - {"params"}
        base["task"] = {k: v for k, v in base_task.items() if k in shared}
    base.pop("name", None)
    merged = deep_merge(base, overrides)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise RequestValidationError(
            [
                {
                    "type": e["type"],
                    "loc": ("body", "overrides", *e["loc"]),
                    "msg": e["msg"],
                    "input": e.get("input"),
                }
                for e in exc.errors(include_url=False, include_context=False)
            ]
        ) from None


def cancel_run(session: Session, run: Run) -> Run:
    """queued → cancelled at once; running → cancel_requested (the worker stops within seconds)."""
    now = utcnow()
    if run.status == RunStatus.queued:
        done = session.execute(
            update(Run)
            .where(Run.id == run.id, Run.status == RunStatus.queued)
            .values(
                status=RunStatus.cancelled, cancel_requested=True, finished_at=now, updated_at=now
            )
        ).rowcount  # type: ignore[attr-defined]
        if not done:  # a worker claimed it meanwhile
            session.execute(
                update(Run).where(Run.id == run.id).values(cancel_requested=True, updated_at=now)
            )
    elif run.status == RunStatus.running:
        if run.external:
            session.execute(
                update(Run)
                .where(Run.id == run.id)
                .values(
                    status=RunStatus.cancelled,
                    cancel_requested=True,
                    finished_at=now,
                    updated_at=now,
                )
            )
        else:
            session.execute(
                update(Run).where(Run.id == run.id).values(cancel_requested=True, updated_at=now)
            )
    session.commit()
    session.refresh(run)
    return run


def delete_run(session: Session, run: Run) -> None:
    """Cancel if active, then remove the run and everything logged for it."""
    if run.status not in FINISHED:
        cancel_run(session, run)
    # The run row first: it waits for a writer holding the row's lock to commit, and a writer
    # that comes later finds no run and writes nothing (metrics and rollouts have no foreign
    # key to cascade), so the deletes below catch every point.
    session.execute(delete(Run).where(Run.id == run.id))
    for model in (Metric, MetricRollup, Rollout):
        session.execute(delete(model).where(model.run_id == run.id))
    session.commit()
