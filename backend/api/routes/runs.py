"""Runs: create (one per seed), list, read, cancel, delete, clone."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import String, cast, func, select
from sqlalchemy.orm import Session

from backend import chaining, lifecycle, run_inputs
from backend.api.body import JSONBodyRoute
from backend.api.deps import (
    ClusterDep,
    CurrentUser,
    JobsDep,
    OwnedRunDep,
    RunDep,
    SessionDep,
    SettingsDep,
)
from backend.api.query import parse_ids
from backend.models import Run
from backend.schemas import (
    FreeJSON,
    Label,
    RunClone,
    RunCreate,
    RunList,
    RunOut,
    RunsCreated,
    RunStatusName,
    Tag,
    run_out,
)
from conspo.config import RunConfig, TaskConfig, deep_merge

router = APIRouter(prefix="/runs", tags=["runs"], route_class=JSONBodyRoute)

SORTS: dict[str, Any] = {
    "created_at": Run.created_at.asc(),
    "-created_at": Run.created_at.desc(),
    "name": Run.name.asc(),
    "status": Run.status.asc(),
    "id": Run.id.asc(),
}
ShortText = Annotated[Label, Query()]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RunsCreated)
def create(
    body: RunCreate,
    user: CurrentUser,
    session: SessionDep,
    jobs: JobsDep,
    settings: SettingsDep,
    cluster: ClusterDep,
) -> dict[str, Any]:
    """Queue one run per seed (``config.seed`` replaced); ``group_id`` ties 2+ seeds together."""
    run_inputs.refuse_missing_software(body.config, session, settings, ("body", "config"))
    run_inputs.refuse_unavailable(body.config, settings, ("body", "config"))
    chaining.refuse_bad_start(body.config, session, settings, ("body", "config"))
    group_id, runs = lifecycle.queue_runs(
        session, jobs, user, body.config, seeds=body.seeds, tags=body.tags, name=body.name
    )
    return {"group_id": group_id, "runs": [run_out(r, cluster) for r in runs]}


class EstimateRequest(BaseModel):
    # The form sends its whole request (seeds, tags, name too): only the config matters here.
    model_config = ConfigDict(extra="ignore")

    # Validated in the handler: a config still being typed gets a report, not a 422 (the form
    # asks after every edit, and shows the field errors only when submitting).
    config: FreeJSON


class MemoryReport(BaseModel):
    total_bytes: int | None = Field(description="Estimated peak bytes of a step (None: unknown).")
    parts: dict[str, int] | None = Field(
        description="state (held all run) plus the largest of sampling, evaluation, update."
    )
    limit_bytes: int = Field(description="What a run may use here (CONSPO_MAX_RUN_MEMORY_GIB).")
    fits: bool | None = Field(description="False: submitting this config is refused.")
    text: str


@router.post("/estimate", response_model=MemoryReport)
def estimate(body: EstimateRequest, settings: SettingsDep) -> dict[str, Any]:
    """The memory a run of ``config`` would need, by conspo.models.resources' estimate, and whether
    it is under the limit that submitting checks. Nothing is stored; an invalid config gets no
    numbers and the first problem as its text."""
    try:
        config = RunConfig.model_validate(body.config)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        return {
            "total_bytes": None,
            "parts": None,
            "limit_bytes": run_inputs.report_limit(settings),
            "fits": None,
            "text": f"not a valid config yet ({where}: {first['msg']})",
        }
    return run_inputs.memory_report(config, settings)


@router.get("", response_model=RunList)
def list_runs(
    session: SessionDep,
    cluster: ClusterDep,
    status_: Annotated[RunStatusName | None, Query(alias="status")] = None,
    algorithm: ShortText | None = None,
    task: ShortText | None = None,
    tag: Annotated[Tag | None, Query()] = None,
    group_id: ShortText | None = None,
    q: ShortText | None = None,
    ids: Annotated[
        str | None, Query(max_length=20_000, description="Comma-separated run ids (≤ 500).")
    ] = None,
    sort: Literal["created_at", "-created_at", "name", "status", "id"] = "-created_at",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> dict[str, Any]:
    stmt = select(Run)
    if status_:
        stmt = stmt.where(Run.status == status_)
    if algorithm:
        stmt = stmt.where(Run.algorithm == algorithm)
    if task:
        stmt = stmt.where(Run.task == task)
    if group_id:
        stmt = stmt.where(Run.group_id == group_id)
    if ids is not None:
        stmt = stmt.where(Run.id.in_(parse_ids(ids, "ids", 500)))
    if q:
        stmt = stmt.where(func.lower(Run.name).contains(q.lower(), autoescape=True))
    if tag:
        # tags is a JSON list; match the quoted element in its text (portable across dialects).
        stmt = stmt.where(cast(Run.tags, String).contains(json.dumps(tag), autoescape=True))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    order = [SORTS[sort], Run.id.desc() if sort == "-created_at" else Run.id.asc()]
    rows = session.scalars(stmt.order_by(*order).limit(limit).offset(offset)).unique()
    places = queue_positions(session)
    return {"items": [with_place(run_out(r, cluster), places) for r in rows], "total": total}


@router.get("/{run_id}", response_model=RunOut)
def read(run: RunDep, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    return with_place(run_out(run, cluster), queue_positions(session))


def queue_positions(session: Session) -> dict[int, int]:
    """Queued run id → its place in the queue (1 = next), in the order runs were sent."""
    ids = session.scalars(
        select(Run.id)
        .where(Run.status == "queued", Run.cancel_requested.is_(False))
        .order_by(Run.enqueued_at.is_(None), Run.enqueued_at, Run.id)
    )
    return {rid: i for i, rid in enumerate(ids, 1)}


def with_place(out: dict[str, Any], places: dict[int, int]) -> dict[str, Any]:
    out["queue_position"] = places.get(out["id"])
    return out


@router.post("/{run_id}/cancel", response_model=RunOut)
def cancel(run: OwnedRunDep, session: SessionDep) -> dict[str, Any]:
    """Queued: cancelled at once. Running: cancel requested; the worker stops within seconds."""
    return run_out(lifecycle.request_cancel(session, run))


@router.delete("/{run_id}", status_code=status.HTTP_204_NO_CONTENT)
def remove(run: OwnedRunDep, session: SessionDep) -> Response:
    """Delete the run and all its metrics and rollouts (a running run is cancelled first)."""
    lifecycle.delete_run(session, run)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{run_id}/clone", status_code=status.HTTP_201_CREATED, response_model=RunsCreated)
def clone(
    run: RunDep,
    body: RunClone,
    user: CurrentUser,
    session: SessionDep,
    jobs: JobsDep,
    settings: SettingsDep,
    cluster: ClusterDep,
) -> dict[str, Any]:
    """Re-queue a run's config with ``overrides`` deep-merged in (the caller owns the copies).

    A plain clone keeps the source's name with a new suffix (``x-s0`` → ``x-s0-2``); a clone
    with overrides is named from its own config, so its name does not claim the source's
    settings. Tags label the source run (``best``, ``baseline``): the copies get only the ones
    the body gives. Each copy records ``cloned_from``."""
    config = cloned_config(run, body.overrides)
    run_inputs.refuse_missing_software(config, session, settings, ("body", "overrides"))
    run_inputs.refuse_unavailable(config, settings, ("body", "overrides"))
    chaining.refuse_bad_start(config, session, settings, ("body", "overrides"))
    name = body.name or (None if body.overrides else lifecycle.name_base(run.name))
    group_id, runs = lifecycle.queue_runs(
        session, jobs, user, config, seeds=body.seeds, tags=body.tags or [], name=name,
        cloned_from=run.id,
    )  # fmt: skip
    return {"group_id": group_id, "runs": [run_out(r, cluster) for r in runs]}


def cloned_config(source: Run, overrides: dict[str, Any]) -> RunConfig:
    """The source's config with ``overrides`` deep-merged; 422s locate errors under overrides."""
    if source.external:
        raise lifecycle.Conflict(
            f"run {source.id} is external (logged from elsewhere) and cannot be cloned"
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
    try:
        return RunConfig.model_validate(deep_merge(base, overrides))
    except ValidationError as exc:
        raise RequestValidationError(
            [
                {**e, "loc": ("body", "overrides", *e["loc"])}
                for e in exc.errors(include_url=False, include_context=False)
            ]
        ) from None
