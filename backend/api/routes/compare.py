"""Comparison reports: the compare page's runs, grouped, as one self-contained HTML file
(the study report's renderer, Plotly inlined: no network request) or as CSV of each run's
value over the last-N window. Both take the same query as the page's view. And the runs'
sampled rollouts at one step, side by side per prompt (``backend.studies.rollouts_across``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from backend.api.contract import CSVText, refusals
from backend.api.deps import SessionDep, found_runs
from backend.api.query import metric_key_list, parse_ids, parse_keys, run_id_list
from backend.schemas import INT32_MAX, RolloutsAcross
from backend.studies import report, rollouts_across
from backend.studies.comparison import comparison_csv, comparison_view
from backend.studies.spec import Objective
from conspo.input_checks import LABEL

router = APIRouter(prefix="/compare", tags=["metrics"])
MAX_RUNS = 200
MISSING_RUNS = {404: "A run does not exist (each missing one is named)."}


def comparison(
    session: SessionDep,
    runs: Annotated[str, run_id_list(MAX_RUNS)],
    key: Annotated[str, metric_key_list(1, 200, "The metric compared.")] = "eval/accuracy",
    group: Annotated[
        str,
        LABEL,
        Query(
            max_length=200,
            description="Group by algorithm, task, model or a config path (params.tau);"
            " empty: each run on its own.",
        ),
    ] = "",
    reduce: Annotated[
        Literal["last", "mean_last_k", "auc"], Query(description="How a run's series is reduced.")
    ] = "mean_last_k",
    k: Annotated[int, Query(ge=1, le=10_000, description="The last-N window.")] = 3,
    direction: Annotated[Literal["max", "min"], Query(description="Which way is better.")] = "max",
    baseline: Annotated[
        Annotated[str, LABEL] | None,
        Query(max_length=400, description="The baseline group's label, e.g. algorithm=grpo."),
    ] = None,
) -> dict[str, Any]:
    ids = parse_ids(runs, "runs", MAX_RUNS)
    metric = parse_keys(key, "key", 1)[0]
    return comparison_view(
        session,
        found_runs(session, ids),
        group=group.strip(),
        objective=Objective(metric=metric, reduce=reduce, k=k, direction=direction),
        baseline=baseline,
    )


ComparisonDep = Annotated[dict[str, Any], Depends(comparison)]


@router.get("/report.html", response_class=HTMLResponse, responses=refusals(MISSING_RUNS))
def report_html(view: ComparisonDep) -> HTMLResponse:
    """The grouped runs as one self-contained HTML file (Plotly inlined): it makes no network
    request. Each group is set against the baseline group, paired by seed where it can be."""
    return HTMLResponse(
        report.study_report(view),
        headers={"Content-Disposition": 'inline; filename="comparison.html"'},
    )


@router.get("/objective.csv", response_class=CSVText, responses=refusals(MISSING_RUNS))
def objective_csv(view: ComparisonDep) -> CSVText:
    """Per run: group, seed, status, the window reduced (first step, points) and its value."""
    return CSVText(
        comparison_csv(view),
        headers={"Content-Disposition": 'attachment; filename="comparison.csv"'},
    )


@router.get(
    "/rollouts",
    response_model=RolloutsAcross,
    responses=refusals(MISSING_RUNS),
)
def rollouts_side_by_side(
    session: SessionDep,
    runs: Annotated[str, run_id_list(rollouts_across.MAX_RUNS, max_length=200)],
    step: Annotated[
        int | None,
        Query(
            ge=0,
            le=INT32_MAX,
            description="A step every run sampled; omitted: the latest of them.",
        ),
    ] = None,
    disagree: Annotated[
        bool,
        Query(description="Only the prompts some run solved and another did not."),
    ] = False,
) -> dict[str, Any]:
    """The runs' sampled rollouts at one step, one item per prompt (paired by the prompt's
    text, not by group number) with a column per run; bounded in rollouts and text, what is
    left out counted. A 422 at ``runs`` when they share no sampled step, at ``step`` when it
    is not one they share (naming the nearest)."""
    ids = parse_ids(runs, "runs", rollouts_across.MAX_RUNS)
    return rollouts_across.rollouts_across(session, found_runs(session, ids), step, disagree)
