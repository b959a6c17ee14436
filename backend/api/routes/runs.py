"""Runs: create (one per seed), list, read, cancel, delete, clone."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from backend import markdown, task_checks
from backend.api.body import JSONBodyRoute
from backend.api.contract import (
    BAD_TOKEN,
    BUSY,
    OPTIONAL_TOKEN,
    QUEUE_DOWN,
    STARTS_FROM_UNSHARED,
    refusals,
)
from backend.api.deps import (
    ClusterDep,
    Credentials,
    CurrentUser,
    DatabaseDep,
    InSessionDep,
    JobsDep,
    OwnedRunDep,
    RunDep,
    SessionDep,
    SettingsDep,
    check_token,
)
from backend.api.errors import checks_model_name
from backend.api.query import ORDER, JSONBytes, parse_ids, parse_order, parse_where, run_id_list
from backend.config import Settings
from backend.db import Database
from backend.errors import Busy, InvalidInput
from backend.models import Run, RunStatus
from backend.runs import inputs as run_inputs
from backend.runs import lifecycle
from backend.runs import where as run_where
from backend.runs.progress import pace_of_like
from backend.runs.rows import name_base
from backend.runs.scheduling import Cluster
from backend.runs.submit import (
    MIN_HELD_OUT,
    Submitted,
    held_out_problems,
    held_out_warning,
    refuse_unfit,
)
from backend.runs.submit import warnings as submit_warnings
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
    Seed,
    Tag,
    run_out,
)
from backend.storage import run_logs
from backend.storage import runs as storage_runs
from backend.storage.runs import RunFilter, RunSort
from conspo.config import RunConfig, with_overrides
from conspo.tasks.probe import TaskRefused, probed

router = APIRouter(prefix="/runs", tags=["runs"], route_class=JSONBodyRoute)

ShortText = Annotated[Label, Query()]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RunsCreated,
    responses=refusals({403: STARTS_FROM_UNSHARED, 503: QUEUE_DOWN}),
)
@checks_model_name
def create(
    body: RunCreate,
    user: CurrentUser,
    session: SessionDep,
    jobs: JobsDep,
    settings: SettingsDep,
    cluster: ClusterDep,
) -> dict[str, Any]:
    """Queue one run per seed (``config.seed`` replaced); ``group_id`` ties 2+ seeds together."""
    refuse_unfit(session, settings, [Submitted(("body", "config"), body.config)], user)
    warned = submit_warnings(body.config, settings)
    group_id, runs = lifecycle.queue_runs(
        session, jobs, user, body.config, seeds=body.seeds, tags=body.tags, name=body.name
    )
    return {"group_id": group_id, "runs": [run_out(r, cluster) for r in runs], "warnings": warned}


class EstimateRequest(BaseModel):
    # The form sends its whole request (seeds, tags, name too): only the config matters here.
    model_config = ConfigDict(extra="ignore")

    # Validated in the handler: a config still being typed gets a report, not a 422 (the form
    # asks after every edit and marks the fields the report's errors name as you type).
    config: FreeJSON
    seeds: Any = None  # checked in the handler, as a submit would (the form sends what is typed)


class TaskCheck(BaseModel):
    """What building the task said (``backend.task_checks``), for a caller with a token."""

    checked: bool = Field(description="False: not built now (the task-check helpers were busy).")
    refused: bool = Field(description="True: submitting this config is refused for its task.")
    held_out: int | None = Field(
        None, description="Distinct held-out problems found, up to task.eval_size (None: unknown)."
    )
    asked: int = Field(description="task.eval_size.")
    text: str
    longest_prompt: int | None = Field(
        None,
        description="Characters of the longest problem drawn: an sft run's rows are sized by it"
        " in the memory estimate beside (else by a default question).",
    )


class PaceOfLike(BaseModel):
    """How fast runs like this one stepped (``backend.runs.progress.pace_of_like``)."""

    seconds_per_step: float = Field(description="The median pace of the latest runs like it.")
    runs: int = Field(description="How many runs it is the median of (at most 10).")
    devices: list[str] = Field(description="Where they ran.")


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
    errors: list[dict[str, Any]] | None = Field(
        None,
        description="What submitting would refuse in the config and seeds, as its 422 says it"
        " ({loc: [body, config, ...], msg, type}): the form marks those fields as you type;"
        " None when there is nothing.",
    )
    pace: PaceOfLike | None = Field(
        None,
        description="Seconds per step of earlier runs of the same model and shape (only with a"
        " token; None when there are none).",
    )
    task: TaskCheck | None = Field(
        None,
        description="The task built and drawn from under a budget, as submitting does: only"
        " with a token (building a task costs what its config sets) and for procedural tasks.",
    )


@router.post(
    "/estimate",
    response_model=MemoryReport,
    responses=refusals({401: BAD_TOKEN, 503: BUSY}),
    openapi_extra=OPTIONAL_TOKEN,
)
async def estimate(
    body: EstimateRequest, settings: SettingsDep, db: DatabaseDep, credentials: Credentials
) -> dict[str, Any]:
    """The memory a run of ``config`` would need, by conspo.models.resources' estimate, and whether
    it is under the limit that submitting checks; with a token, also what building its task
    says (held-out problems, a task refused). Nothing is stored; an invalid config gets no
    numbers and the first problem as its text. Never builds a task for an anonymous caller,
    and never on a request thread."""
    auto = await anyio.to_thread.run_sync(_auto_device, db, settings)
    config, report = await anyio.to_thread.run_sync(_memory_estimate, body.config, settings, auto)
    seeds = _seed_errors(body.seeds)
    if seeds:
        report["errors"] = [*(report.get("errors") or []), *seeds]
    if config is None or credentials is None:
        return report
    await anyio.to_thread.run_sync(check_token, db, credentials)  # a bad token: 401
    report["task"] = await anyio.to_thread.run_sync(_task_check, config, settings)
    if config.kind == "sft" and (chars := (report["task"] or {}).get("longest_prompt")):
        # An sft step's rows are its problems: the check drew them, so size the rows by them
        # (without, a default question; issue 49: arith's 4-token questions read 48).
        measured = await anyio.to_thread.run_sync(
            run_inputs.memory_report, config, settings, chars, auto
        )
        report.update({k: v for k, v in measured.items() if k != "errors"})
    validated = config.model_dump(mode="json")  # as runs store it: every default filled in
    report["pace"] = await anyio.to_thread.run_sync(_pace_of_like, db, validated)
    return report


def _pace_of_like(db: Database, config: dict[str, Any]) -> dict[str, Any] | None:
    with db.read_sessions() as session:
        return pace_of_like(session, config)


def _auto_device(db: Database, settings: Settings) -> str:
    with db.read_sessions() as session:
        return run_inputs.auto_device(session, settings)


def _memory_estimate(
    raw: Any, settings: Settings, auto: str = "auto"
) -> tuple[RunConfig | None, dict[str, Any]]:
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"])
        found = [
            {"loc": ["body", "config", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in errors[:MAX_REPORTED_ERRORS]
        ]
        return None, {
            "total_bytes": None,
            "parts": None,
            "limit_bytes": run_inputs.report_limit(settings),
            "fits": None,
            "text": f"not a valid config yet ({where}: {first['msg']})",
            "errors": [*_model_error(raw, settings), *found][:MAX_REPORTED_ERRORS],
        }
    report = run_inputs.memory_report(config, settings, auto=auto)
    if model_errors := _model_error(raw, settings):
        report["errors"] = model_errors  # what Start would refuse, marked as you type
    return config, report


def _model_error(raw: Any, settings: Settings) -> list[dict[str, Any]]:
    """A ``model.name`` that names no model here, located as a submit's 422 locates it."""
    problem = run_inputs.unlocated_model(raw, settings)
    if problem is None:
        return []
    where, message, _ = problem
    return [{"loc": ["body", "config", *where], "msg": message, "type": "value_error"}]


MAX_REPORTED_ERRORS = 50  # a report names this many problems at most (a form has fewer fields)
_SEEDS = TypeAdapter(Annotated[list[Seed], Field(max_length=64)] | None)  # as a submit's


def _seed_errors(raw: Any) -> list[dict[str, Any]]:
    """The seeds' problems as a submit's 422 names them (body.seeds.<i>)."""
    try:
        _SEEDS.validate_python(raw, strict=True)
    except ValidationError as exc:
        return [
            {"loc": ["body", "seeds", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ][:MAX_REPORTED_ERRORS]
    return []


def _task_check(config: RunConfig, settings: Settings) -> dict[str, Any] | None:
    """The estimate's account of the task's check; busy helpers are said, not a 503 (the
    memory estimate beside it still stands). A held-out split under ``MIN_HELD_OUT`` problems
    is said as the submit will say it (a task reading small files: only then)."""
    asked = config.task.eval_size
    if not probed(config.task):
        limit = min(asked, MIN_HELD_OUT)
        counted = held_out_problems(config, settings, limit)
        if counted is None or counted >= limit:
            return None
        text = held_out_warning(counted)
        return {
            "checked": True,
            "refused": False,
            "held_out": counted,
            "asked": asked,
            "text": text,
        }
    try:
        found = task_checks.for_settings(settings).probe(config.task, asked)
    except TaskRefused as exc:
        return {"checked": True, "refused": True, "asked": asked, "text": f"task.params: {exc}"}
    except Busy as exc:
        return {"checked": False, "refused": False, "asked": asked, "text": str(exc)}
    short = task_checks.held_out_problem(found)
    if short is not None and task_checks.at_default_eval_size(config.task):
        short = None  # the default, not an ask: the run scores those there are
        text = f"{found.held_out} distinct held-out problems (fewer than the default {asked})"
    elif short is not None:
        text = f"task.eval_size: {short[1]}"
    elif found.held_out is None:
        text = (
            f"held-out problems not counted within {settings.task_check_seconds:g} s: the run"
            f" scores those it finds, up to {asked}"
        )
    elif found.held_out >= asked:  # the probe stops counting at eval_size: not the task's size
        text = f"{asked} distinct held-out problems, all that task.eval_size asks"
        text += " (the task may hold more)"
    else:
        text = f"{found.held_out} distinct held-out problems"
    if short is None and found.held_out is not None and found.held_out < min(asked, MIN_HELD_OUT):
        text = held_out_warning(found.held_out)
    return {
        "checked": True,
        "refused": short is not None,
        "held_out": found.held_out,
        "asked": asked,
        "text": text,
        "longest_prompt": found.longest_prompt,
    }


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
    ids: Annotated[str | None, run_id_list(500)] = None,
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
            json_schema_extra={"pattern": ORDER},
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


def _check_names(session: Session, where: RunFilter) -> None:
    """A config path of ``where`` or ``order_by`` that no config defines and no run holds, or a
    metric key that the catalogue does not declare and no run has stored, is a 422 at that
    parameter, naming the closest known ones (``backend.runs.where``): either would match
    nothing, silently."""

    def stored(path: run_where.ConfigPath) -> bool:
        return storage_runs.config_path_stored(session, path.names)

    def key_stored(key: str) -> bool:
        return storage_runs.metric_key_stored(session, key)

    def known_keys() -> set[str]:
        return storage_runs.recent_metric_keys(session)

    for param, conditions, order in (
        ("where", where.conditions, None),
        ("order_by", (), where.order),
    ):
        try:
            run_where.check_paths(run_where.config_paths_of(conditions, order), stored)
            run_where.check_metrics(
                run_where.metric_summaries_of(conditions, order), key_stored, known_keys
            )
        except run_where.WhereError as exc:
            raise InvalidInput.at(("query", param), str(exc)) from None


def _runs_page(
    session: Session, settings: Settings, where: RunFilter, sort: RunSort, limit: int, offset: int
) -> bytes:
    _check_names(session, where)
    rows, total = storage_runs.list_runs(session, where, sort, limit, offset)
    # What only some rows show is read only when one of them is on the page: the live workers
    # (what a run that is not external needs of them), the queue (a queued run's place).
    show_cluster = any(not r.external for r in rows)
    cluster = Cluster.load(session, settings) if show_cluster else None
    queued = any(r.status == RunStatus.queued for r in rows)
    places = storage_runs.queue_positions(session) if queued else {}
    items = [with_place(run_out(r, cluster), places) for r in rows]
    if where.order is not None:  # each row says the value it is ordered by (max, not last)
        values = storage_runs.order_values(session, where.order, [r.id for r in rows])
        for item in items:
            item["order_value"] = values.get(item["id"])
    page = {"items": items, "total": total}
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
    """Set the run's note (Markdown), replace its tags and/or share its model (the owner or an
    admin)."""
    run = lifecycle.annotate(
        session, run, note=body.note, tags=body.tags, model_shared=body.model_shared
    )
    return single(run, session)


@router.post(
    "/{run_id}/cancel",
    response_model=RunOut,
    responses=refusals({409: "The run has finished (its status is named): nothing to cancel."}),
)
def cancel(run: OwnedRunDep, session: SessionDep) -> dict[str, Any]:
    """Queued: cancelled at once. Running: cancel requested; the worker stops within seconds.
    Finished (succeeded, failed, cancelled): 409 naming the status."""
    return run_out(lifecycle.request_cancel(session, run))


@router.delete("/{run_id}", status_code=status.HTTP_204_NO_CONTENT)
def remove(run: OwnedRunDep, session: SessionDep) -> Response:
    """Delete the run and all its metrics and rollouts (a running run is cancelled first)."""
    lifecycle.delete_run(session, run)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{run_id}/clone",
    status_code=status.HTTP_201_CREATED,
    response_model=RunsCreated,
    responses=refusals(
        {
            403: STARTS_FROM_UNSHARED,
            409: "The run is external: it has no config to clone.",
            503: QUEUE_DOWN,
        }
    ),  # fmt: skip
)
def clone(
    user: CurrentUser,  # before the run: a request without a token is a 401, never a 404
    run: RunDep,
    body: RunClone,
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
    refuse_unfit(session, settings, [Submitted(("body", "overrides"), config)], user)
    warned = submit_warnings(config, settings)
    name = body.name or (None if body.overrides else name_base(run.name))
    group_id, runs = lifecycle.queue_runs(
        session, jobs, user, config, seeds=body.seeds, tags=body.tags or [], name=name,
        cloned_from=run.id,
    )  # fmt: skip
    return {"group_id": group_id, "runs": [run_out(r, cluster) for r in runs], "warnings": warned}


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
