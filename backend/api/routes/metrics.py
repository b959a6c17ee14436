"""Metric series: keys, downsampled series with a since_step cursor, every point as CSV, and
multi-run compare."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response, status
from pydantic_core import to_json
from sqlalchemy.orm import Session

from backend.api.contract import CSVText, refusals
from backend.api.deps import InSessionDep, RunDep, RunId, SessionDep, require_runs
from backend.api.query import JSONBytes, metric_key_list, parse_ids, parse_keys, run_id_list
from backend.schemas import INT32_MAX, Compare, MetricKeys, RunSeries
from backend.storage.series import cached_series, metric_keys, series_versions, whole_series
from conspo.metrics import Catalogue, catalogue
from conspo.spreadsheet import csv_cell

router = APIRouter(tags=["metrics"])

MAX_KEYS, MAX_COMPARED, MAX_COMPARED_KEYS = 200, 50, 50  # keys of a run; runs and keys compared
MaxPoints = Annotated[int, Query(ge=2, le=10_000, description="Most points per series.")]


@router.get("/metrics/catalogue", response_model=Catalogue)
def metric_catalogue() -> Catalogue:
    """Every metric key the trainer logs: label, help, unit, chart, who logs it, direction.

    The pages draw their charts from this; keys not in it (logged by external runs) are charted
    on their own under "Other metrics".
    """
    return catalogue()


@router.get("/runs/{run_id}/metrics/keys", response_model=MetricKeys)
def keys(run: RunDep, session: SessionDep) -> dict[str, list[str]]:
    return {"keys": metric_keys(session, run.id)}


@router.get(
    "/runs/{run_id}/metrics",
    response_model=RunSeries,
    responses=refusals({404: "No run has this id."}),
)
async def series(
    run_id: RunId,
    in_session: InSessionDep,
    keys: Annotated[str, metric_key_list(MAX_KEYS)],
    max_points: MaxPoints = 1000,
    since_step: Annotated[
        int | None, Query(ge=-1, le=INT32_MAX, description="Only steps above this one.")
    ] = None,
    x: Literal["step", "wall_time"] = "step",
    step_max: Annotated[
        int | None,
        Query(
            ge=-1,
            le=INT32_MAX,
            description="Only steps up to this one (inclusive). With since_step it pages raw "
            "points: a range of at most max_points steps is never bucketed.",
        ),
    ] = None,
) -> Response:
    """Series bucketed by step above ``max_points`` (each bucket: last step, mean, min, max).

    ``x`` names the axis the caller plots; every series carries both steps and wall times.
    Steps in (``since_step``, ``step_max``] only.
    """
    body = await in_session(_series_json, run_id, keys, max_points, since_step, step_max)
    return JSONBytes(body)


def _series_json(
    session: Session,
    run_id: int,
    keys: str,
    max_points: int,
    since_step: int | None,
    step_max: int | None,
) -> bytes:
    versions = series_versions(session, [run_id])
    if run_id not in versions:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run_id} not found")
    wanted = parse_keys(keys, "keys", MAX_KEYS)
    data = cached_series(session, [run_id], wanted, max_points, since_step, step_max, versions)
    return to_json({"run_id": run_id, "series": data[run_id]})


@router.get(
    "/runs/{run_id}/metrics.csv",
    response_class=CSVText,
    responses=refusals({404: "No run has this id."}),
)
def series_csv(
    run: RunDep,
    session: SessionDep,
    keys: Annotated[
        str | None,
        metric_key_list(MAX_KEYS, description="Comma-separated metric keys; default: all."),
    ] = None,
) -> CSVText:
    """Every stored point of the run's metrics (not bucketed), long format, in key then step
    order: ``key,step,value``; a value stored as null (NaN, ±Infinity) is an empty cell."""
    wanted = (
        parse_keys(keys, "keys", MAX_KEYS) if keys is not None else metric_keys(session, run.id)
    )
    points = whole_series(session, [run.id], wanted)
    lines = ["key,step,value"]
    for key in wanted:
        steps, values = points[(run.id, key)]
        lines += (
            ",".join(csv_cell(c) for c in (key, step, "" if value is None else value))
            for step, value in zip(steps, values, strict=True)
        )
    return CSVText(
        "\n".join(lines) + "\n",
        headers={"Content-Disposition": f'attachment; filename="run-{run.id}-metrics.csv"'},
    )


@router.get("/compare", response_model=Compare, responses=refusals({404: "A run does not exist."}))
async def compare(
    in_session: InSessionDep,
    runs: Annotated[str, run_id_list(MAX_COMPARED)],
    keys: Annotated[str, metric_key_list(MAX_COMPARED_KEYS)],
    max_points: MaxPoints = 1000,
) -> Response:
    return JSONBytes(await in_session(_compare_json, runs, keys, max_points))


def _compare_json(session: Session, runs: str, keys: str, max_points: int) -> bytes:
    ids = parse_ids(runs, "runs", MAX_COMPARED)
    wanted = parse_keys(keys, "keys", MAX_COMPARED_KEYS)
    versions = series_versions(session, ids)
    require_runs(ids, versions)
    data = cached_series(session, ids, wanted, max_points, versions=versions)
    return to_json({"runs": {str(r): {"series": data[r]} for r in ids}})
