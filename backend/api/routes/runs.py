"""Runs: create (one per seed), list, read, cancel, delete, clone."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from backend import markdown
from backend.api.body import JSONBodyRoute
from backend.api.deps import (
    ClusterDep,
    CurrentUser,
    InSessionDep,
    JobsDep,
    OwnedRunDep,
    RunDep,
    SessionDep,
    SettingsDep,
)
from backend.api.query import JSONBytes, parse_ids, parse_order, parse_where
from backend.config import Settings
from backend.errors import InvalidInput
from backend.models import Run, RunStatus
from backend.runs import inputs as run_inputs
from backend.runs import lifecycle
from backend.runs import where as run_where
from backend.runs.rows import name_base
from backend.runs.scheduling import Cluster
from backend.runs.submit import Submitted, refuse_unfit
from backend.schemas import (
    INT32_MAX,
    FreeJSON,
    Label,
    RunClone,
    RunCreate,
    RunList,
    RunLogOut,
    RunOut,
    RunPatch,
    RunsCreated,
    RunStatusName,
    Tag,
    run_out,
)
from backend.storage import run_logs
from backend.storage import runs as storage_runs
from backend.storage.runs import RunFilter, RunSort
from conspo.config import RunConfig, with_overrides

router = APIRouter(prefix="/runs", tags=["runs"], route_class=JSONBodyRoute)

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
    refuse_unfit(session, settings, [Submitted(("body", "config"), body.config)])
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
    micro_batch_tokens: int | None = Field(
        None,
        description="Tokens per micro-batch the gradient pass is split into to keep within"
        " optim.memory_budget (0: one pass; None: unknown).",
    )
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
async def list_runs(
    in_session: InSessionDep,
    settings: SettingsDep,
    status_: Annotated[RunStatusName | None, Query(alias="status")] = None,
    kind: ShortText | None = None,
    algorithm: ShortText | None = None,
    task: ShortText | None = None,
    tag: Annotated[Tag | None, Query()] = None,
    group_id: ShortText | None = None,
    q: ShortText | None = None,
    ids: Annotated[
        str | None, Query(max_length=20_000, description="Comma-separated run ids (≤ 500).")
    ] = None,
    where: Annotated[
        str | None,
        Query(
            max_length=run_where.MAX_LENGTH,
            description="Conditions on config fields and metric summaries, ANDed:"
            ' `params.tau>=5 AND best(eval/accuracy)>0.2` (docs/api.md, "Finding runs").',
        ),
    ] = None,
    order_by: Annotated[
        str | None,
        Query(
            max_length=300,
            description="A config path or a metric summary to order by, before `sort`; `-`"
            " first for the largest first: `-max(system/peak_rss_gib)`, `params.tau`. Runs"
            " without it come last.",
        ),
    ] = None,
    sort: RunSort = "-created_at",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> Response:
    where_ = RunFilter(
        status=status_, kind=kind, algorithm=algorithm, task=task, tag=tag, group_id=group_id,
        name_contains=q, ids=parse_ids(ids, "ids", 500) if ids is not None else None,
        conditions=parse_where(where) if where and where.strip() else (),
        order=parse_order(order_by) if order_by and order_by.strip() else None,
    )  # fmt: skip
    return JSONBytes(await in_session(_runs_page, settings, where_, sort, limit, offset))


RUN_LIST = TypeAdapter(RunList)


def _runs_page(
    session: Session, settings: Settings, where: RunFilter, sort: RunSort, limit: int, offset: int
) -> bytes:
    rows, total = storage_runs.list_runs(session, where, sort, limit, offset)
    # What only some rows show is read only when one of them is on the page: the live workers
    # (what a run that is not external needs of them), the queue (a queued run's place).
    show_cluster = any(not r.external for r in rows)
    cluster = Cluster.load(session, settings) if show_cluster else None
    queued = any(r.status == RunStatus.queued for r in rows)
    places = storage_runs.queue_positions(session) if queued else {}
    page = {"items": [with_place(run_out(r, cluster), places) for r in rows], "total": total}
    return RUN_LIST.dump_json(RUN_LIST.validate_python(page), by_alias=True)


@router.get("/{run_id}", response_model=RunOut)
def read(run: RunDep, session: SessionDep, cluster: ClusterDep) -> dict[str, Any]:
    return single(run, session, cluster)


def single(run: Run, session: Session, cluster: Cluster | None = None) -> dict[str, Any]:
    """One run as its page reads it: with its place in the queue and its note rendered."""
    out = with_place(run_out(run, cluster), storage_runs.queue_positions(session))
    out["note_html"] = markdown.render(run.note or "")
    return out


def with_place(out: dict[str, Any], places: dict[int, int]) -> dict[str, Any]:
    out["queue_position"] = places.get(out["id"])
    return out


@router.get("/{run_id}/log", response_model=RunLogOut)
def read_log(
    run: RunDep,
    session: SessionDep,
    since: Annotated[int, Query(ge=0, le=INT32_MAX, description="Chunks after this seq.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    tail: Annotated[
        int | None, Query(ge=1, le=1000, description="Instead: the run's last N lines.")
    ] = None,
) -> dict[str, Any]:
    """What the run's training process printed (stdout and stderr, its ranks' too), secrets
    redacted, bounded (the first 256 KiB and the last 768 KiB; a ``cut`` chunk marks the
    middle). Follow it live by passing the last ``seq`` as ``since``; a reconnect resumes."""
    if tail is not None:
        lines = run_logs.tail_lines(session, run.id, tail)
        return {"run_id": run.id, "chunks": [], "next": since, "lines": lines}
    chunks = run_logs.read(session, run.id, since, limit)
    return {
        "run_id": run.id,
        "chunks": [
            {"seq": c.seq, "attempt": c.attempt, "wall_time": c.wall_time, "text": c.text,
             "cut": c.cut}
            for c in chunks
        ],
        "next": chunks[-1].seq if chunks else since,
    }  # fmt: skip


@router.patch("/{run_id}", response_model=RunOut)
def patch(run: OwnedRunDep, body: RunPatch, session: SessionDep) -> dict[str, Any]:
    """Set the run's note (Markdown) and/or replace its tags (the owner or an admin)."""
    return single(lifecycle.annotate(session, run, note=body.note, tags=body.tags), session)


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
    refuse_unfit(session, settings, [Submitted(("body", "overrides"), config)])
    name = body.name or (None if body.overrides else name_base(run.name))
    group_id, runs = lifecycle.queue_runs(
        session, jobs, user, config, seeds=body.seeds, tags=body.tags or [], name=name,
        cloned_from=run.id,
    )  # fmt: skip
    return {"group_id": group_id, "runs": [run_out(r, cluster) for r in runs]}


def cloned_config(source: Run, overrides: dict[str, Any]) -> RunConfig:
    """The source's config changed by ``overrides`` (``conspo.config.with_overrides``); the
    errors are located under overrides."""
    if source.external:
        raise lifecycle.Conflict(
            f"run {source.id} is external (logged from elsewhere) and cannot be cloned"
        )
    try:
        return RunConfig.model_validate(with_overrides(source.config, overrides))
    except ValidationError as exc:
        raise InvalidInput(exc.errors(include_url=False, include_context=False)).under(
            ("body", "overrides")
        ) from None
