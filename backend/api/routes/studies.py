"""Studies: create (arms × seeds, or an Optuna search), list, read with the verdict, cancel,
and export (a self-contained HTML report, the per-seed objective as CSV)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, status
from fastapi.responses import HTMLResponse

from backend.api.body import JSONBodyRoute
from backend.api.contract import STARTS_FROM_UNSHARED, SUBMIT_BUSY, CSVText, refusals
from backend.api.deps import (
    CurrentUser,
    JobsDep,
    OptionalUser,
    OwnedStudyDep,
    SessionDep,
    SettingsDep,
    StudyDep,
)
from backend.api.query import RUN_ID, list_pattern, parse_ids
from backend.errors import InvalidInput
from backend.models import User
from backend.runs.submit import Submitted, refuse_unfit
from backend.schemas import NotePatch, StudyList, StudyOut, StudyPlan
from backend.storage import studies as stored
from backend.studies import budget, progress, report, search, service, tuned
from backend.studies.spec import StudyCreate
from conspo.config import RunConfig

MAX_IDS = 500
router = APIRouter(prefix="/studies", tags=["studies"], route_class=JSONBodyRoute)


def check_study(
    body: StudyCreate, session: SessionDep, settings: SettingsDep, caller: User | None
) -> tuple[list[tuple[str, RunConfig]], dict[str, Any]]:
    """Every check ``create`` makes before storing anything: 422 with each field's error (403
    at a field naming another user's run that is not shared, when the caller is known), and
    the study's budget (``backend.studies.budget``: 422 above the operator's caps).
    A search study's configs are its base, each value of its space alone, and its largest
    trial by memory; an arm study's are its arms (over every task it crosses), and a tuned
    arm's each value of its space alone over the arm's config."""
    arms: list[tuple[str, RunConfig]] = []
    if body.search is not None:
        submitted = search.check_space(body)
        largest = search.largest_trial(body, settings)
        submitted += [largest] if largest else []
    else:
        arms = service.arm_configs(body, ("body",))
        n = len(body.arms)  # arm_configs: task-major, then arms
        submitted = [
            Submitted(("body", "arms", k % n, "overrides"), config, body.arms[k % n].overrides)
            for k, (_, config) in enumerate(arms)
        ]
        submitted += tuned.check_tunes(body)
    plan = budget.study_budget(session if caller is not None else None, body, arms)
    if errors := budget.refusals(body, plan, settings):
        raise InvalidInput(errors)
    refuse_unfit(session, settings, submitted, caller)
    return arms, plan


@router.post(
    "/check",
    response_model=StudyPlan,
    responses=refusals({403: STARTS_FROM_UNSHARED, 503: SUBMIT_BUSY}),
)
def check(
    body: StudyCreate, session: SessionDep, settings: SettingsDep, caller: OptionalUser
) -> dict[str, Any]:
    """Validate a study as ``POST /api/studies`` would, storing nothing (the study form checks
    as you type): 422 located at the field, or the runs it would plan. With a token, a run the
    caller may not start from is the 403 the submit would answer."""
    arms, plan = check_study(body, session, settings, caller)
    return {
        "arms": list(dict.fromkeys(name for name, _ in arms)),
        "tasks": body.tasks,
        "seeds": body.seeds,
        "tuning_seeds": body.tuning_seeds,
        "baseline": body.baseline or (arms[0][0] if arms else None),
        **plan,
    }


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=StudyOut,
    responses=refusals({403: STARTS_FROM_UNSHARED, 503: SUBMIT_BUSY}),
)
def create(
    body: StudyCreate, user: CurrentUser, session: SessionDep, jobs: JobsDep, settings: SettingsDep
) -> dict[str, Any]:
    """Store the study and its pending runs (one transaction); queue the first ``concurrency``.
    The rest are released as runs finish."""
    arms, _ = check_study(body, session, settings, user)
    if body.search is not None:
        study = service.create_search_study(session, jobs, user, body)
    else:
        study = service.create_study(session, jobs, user, body, arms)
    return service.study_view(session, study, curves=False)


@router.get("", response_model=StudyList)
def list_studies(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    ids: Annotated[
        str | None,
        Query(
            max_length=10_000,
            description=f"Only these studies: comma-separated ids (at most {MAX_IDS}). The runs"
            " list asks for the studies of the runs it shows, however old they are.",
            json_schema_extra={"pattern": list_pattern(RUN_ID, MAX_IDS)},
        ),
    ] = None,
) -> dict[str, Any]:
    """Newest first, each with its ``progress`` (``backend.studies.progress``: the figures the
    study page and the runs list's study row show too)."""
    chosen = None if ids is None else parse_ids(ids, "ids", MAX_IDS, noun="study")
    studies, total = stored.list_studies(session, limit, offset, chosen)
    planned = progress.progress_of(session, [s.id for s in studies])
    items = [service.study_summary(s, planned[s.id]) for s in studies]
    return {"items": items, "total": total}


@router.get("/{study_id}", response_model=StudyOut)
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


@router.patch("/{study_id}", response_model=StudyOut)
def patch(study: OwnedStudyDep, body: NotePatch, session: SessionDep) -> dict[str, Any]:
    """Set the study's note (Markdown; the owner or an admin)."""
    study.note = body.note
    session.commit()
    return service.study_view(session, study, curves=False)


@router.post(
    "/{study_id}/cancel",
    response_model=StudyOut,
    responses=refusals({409: "The study is no longer active (its status is named)."}),
)
def cancel(study: OwnedStudyDep, session: SessionDep) -> dict[str, Any]:
    """Pending runs are dropped, queued ones cancelled, running ones asked to stop; a study no
    longer active (done, cancelled) is a 409."""
    return service.study_view(session, service.cancel_study(session, study), curves=False)


@router.get("/{study_id}/objective.csv", response_class=CSVText)
def objective_csv(study: StudyDep, session: SessionDep) -> CSVText:
    view = service.study_view(session, study, curves=False)
    return CSVText(
        service.objective_csv(view),
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
