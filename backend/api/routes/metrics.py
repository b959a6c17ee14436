"""Metric series: keys, downsampled series with a since_step cursor, and multi-run compare."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic_core import to_json

from backend.api.deps import RunDep, SessionDep, found_runs
from backend.api.query import CommaList, parse_ids, parse_keys
from backend.schemas import INT32_MAX, Compare, MetricKeys, RunSeries
from backend.storage.series import cached_series, metric_keys
from conspo.metrics import Catalogue, catalogue

router = APIRouter(tags=["metrics"])

MaxPoints = Annotated[int, Query(ge=2, le=10_000, description="Most points per series.")]


class JSONBytes(Response):
    media_type = "application/json"


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


@router.get("/runs/{run_id}/metrics", response_model=RunSeries)
def series(
    run: RunDep,
    session: SessionDep,
    keys: CommaList,
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
    wanted = parse_keys(keys, "keys", 200)
    data = cached_series(session, [run.id], wanted, max_points, since_step, step_max)
    return JSONBytes(to_json({"run_id": run.id, "series": data[run.id]}))


@router.get("/compare", response_model=Compare)
def compare(
    session: SessionDep, runs: CommaList, keys: CommaList, max_points: MaxPoints = 1000
) -> Response:
    run_ids = parse_ids(runs, "runs", 50)
    wanted = parse_keys(keys, "keys", 50)
    found_runs(session, run_ids)
    data = cached_series(session, run_ids, wanted, max_points)
    return JSONBytes(to_json({"runs": {str(r): {"series": data[r]} for r in run_ids}}))
