"""Studies: create (arms × seeds, or an Optuna search), list, read with the verdict, cancel,
and export (a self-contained HTML report, the per-seed objective as CSV)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse
from sqlalchemy import func, select

from backend import run_inputs
from backend.api.body import JSONBodyRoute
from backend.api.deps import (
    CurrentUser,
    JobsDep,
    SessionDep,
    SettingsDep,
    refuse_unless_owner,
)
from backend.models import Study
from backend.schemas import INT32_MAX
from backend.studies import report, search, service
from backend.studies.spec import StudyCreate, validate_arm
from conspo.config import RunConfig

router = APIRouter(prefix="/studies", tags=["studies"], route_class=JSONBodyRoute)

StudyId = Annotated[int, Path(ge=1, le=INT32_MAX, description="Study id.")]


def get_study(study_id: StudyId, session: SessionDep) -> Study:
    study = session.get(Study, study_id)
    if study is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"study {study_id} not found")
    return study


StudyDep = Annotated[Study, Depends(get_study)]


def get_owned_study(study: StudyDep, user: CurrentUser) -> Study:
    refuse_unless_owner(
        user,
        study.owner_id,
        lambda: (
            f"study {study.id} belongs to {study.owner.name if study.owner else 'nobody'};"
            " only its owner or an admin may change it"
        ),
    )
    return study


OwnedStudyDep = Annotated[Study, Depends(get_owned_study)]


def arm_configs(body: StudyCreate) -> list[tuple[str, RunConfig]]:
    """Every arm's validated RunConfig (one per task when the study crosses tasks); all the
    errors in one 422, nothing stored."""
    arms, errors = [], []
    for j, name in enumerate(body.tasks):
        _, problems = validate_arm(body.config, {"task.name": name}, ("body", "tasks", j))
        errors += [{**e, "loc": ("body", "tasks", j)} for e in problems[:1]]
    if errors:
        raise RequestValidationError(errors)
    # The base config's own problems are said once, on it, not under every arm's overrides.
    _, errors = validate_arm(body.config, {}, ("body", "config"))
    from_base = {(tuple(e["loc"][2:]), e["msg"]) for e in errors}
    # task-major, then arms: released seed by seed in this order, a study cut short still has
    # every arm of a (task, seed) to pair
    tasks: list[str | None] = [*body.tasks] or [None]
    for task in tasks:
        for i, arm in enumerate(body.arms):
            overrides = {**arm.overrides, "task.name": task} if task else arm.overrides
            config, problems = validate_arm(
                body.config, overrides, ("body", "arms", i, "overrides")
            )
            errors += [
                e
                for e in problems
                if e not in errors and (tuple(e["loc"][4:]), e["msg"]) not in from_base
            ]
            if config is not None:
                arms.append((arm.name, config))
    if errors:
        raise RequestValidationError(errors)
    return arms


def check_study(
    body: StudyCreate, session: SessionDep, settings: SettingsDep
) -> list[tuple[str, RunConfig]]:
    """Every check ``create`` makes before storing anything: 422 with each field's error."""
    if body.search is not None:
        search.check_space(body)
        return []
    arms = arm_configs(body)
    for i, (_, config) in enumerate(arms):
        loc = ("body", "arms", i, "overrides")
        run_inputs.refuse_missing_software(config, session, settings, loc)
        run_inputs.refuse_unavailable(config, settings, loc)
    return arms


@router.post("/check")
def check(body: StudyCreate, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """Validate a study as ``POST /api/studies`` would, storing nothing (the study form checks
    as you type): 422 located at the field, or the runs it would plan."""
    arms = check_study(body, session, settings)
    trials = body.search.trials if body.search is not None else len(arms)  # arms × tasks
    return {
        "arms": list(dict.fromkeys(name for name, _ in arms)),
        "tasks": body.tasks,
        "seeds": body.seeds,
        "runs": trials * len(body.seeds),
        "baseline": body.baseline or (arms[0][0] if arms else None),
    }


@router.post("", status_code=status.HTTP_201_CREATED)
def create(
    body: StudyCreate, user: CurrentUser, session: SessionDep, jobs: JobsDep, settings: SettingsDep
) -> dict[str, Any]:
    """Store the study and its pending runs (one transaction); queue the first ``concurrency``.
    The rest are released as runs finish."""
    if body.search is not None:
        study = search.create_search_study(session, jobs, user, body, settings)
    else:
        arms = check_study(body, session, settings)
        study = service.create_study(session, jobs, user, body, arms)
    return service.study_view(session, study, curves=False)


@router.get("")
def list_studies(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> dict[str, Any]:
    total = session.scalar(select(func.count()).select_from(Study)) or 0
    rows = list(
        session.scalars(
            select(Study).order_by(Study.id.desc()).limit(limit).offset(offset)
        ).unique()
    )
    progress = service.planned_progress(session, [s.id for s in rows])
    items = [
        {
            "id": s.id,
            "name": s.name,
            "status": s.status,
            "owner": s.owner.name if s.owner else None,
            "created_at": s.created_at.timestamp(),
            "baseline": s.baseline,
            "arms": [a["name"] for a in s.spec.get("arms", [])],
            "seeds": s.spec.get("seeds", []),
            "search": s.spec.get("search") is not None,
            "progress": progress[s.id],
        }
        for s in rows
    ]
    return {"items": items, "total": total}


@router.get("/{study_id}")
def read(
    study: StudyDep,
    session: SessionDep,
    curves: Annotated[bool, Query(description="Include the grouped curves.")] = True,
) -> dict[str, Any]:
    """Arms, runs, the objective of every finished run, the statistics and the verdict."""
    view = service.study_view(session, study, curves=curves)
    if study.spec.get("search"):
        view["search"] = search.search_view(session, study)
    return view


@router.post("/{study_id}/cancel")
def cancel(study: OwnedStudyDep, session: SessionDep) -> dict[str, Any]:
    """Pending runs are dropped, queued ones cancelled, running ones asked to stop."""
    return service.study_view(session, service.cancel_study(session, study), curves=False)


@router.get("/{study_id}/objective.csv", response_class=PlainTextResponse)
def objective_csv(study: StudyDep, session: SessionDep) -> PlainTextResponse:
    view = service.study_view(session, study, curves=False)
    return PlainTextResponse(
        service.objective_csv(view),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="study-{study.id}-objective.csv"'},
    )


@router.get("/{study_id}/report.html", response_class=HTMLResponse)
def report_html(study: StudyDep, session: SessionDep) -> HTMLResponse:
    """One self-contained HTML file (Plotly inlined): it makes no network request."""
    view = service.study_view(session, study)
    if study.spec.get("search"):
        view["search"] = search.search_view(session, study)
    return HTMLResponse(
        report.study_report(view),
        headers={"Content-Disposition": f'inline; filename="study-{study.id}.html"'},
    )
