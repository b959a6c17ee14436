"""Comparison reports: the compare page's runs, grouped, as one self-contained HTML file
(the study report's renderer, Plotly inlined: no network request) or as CSV of each run's
value over the last-N window. Both take the same query as the page's view."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from backend.api.contract import CSVText, refusals
from backend.api.deps import SessionDep, found_runs
from backend.api.query import metric_key_list, parse_ids, parse_keys, run_id_list
from backend.studies import report
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
