"""CSV over REST (issue 49): a run's metrics as CSV at a path of its own, and ``?format=csv`` on
an endpoint that answers JSON only is a 422 at ``query.format`` instead of JSON, silently."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.services


def test_a_runs_metrics_download_as_csv(api: Api) -> None:
    run = api.external(name="csv-metrics")
    steps = [
        {"step": 1, "metrics": {"eval/accuracy": 0.25, "loss": 1.5}},
        {"step": 2, "metrics": {"loss": "NaN", "=cmd": 3}},  # NaN is stored null
    ]
    body = json.dumps({"steps": steps}).replace('"NaN"', "NaN")
    logged = api.post(
        f"/api/runs/{run['id']}/log", content=body, headers={"content-type": "application/json"}
    )
    assert logged.status_code == 200, logged.text
    r = api.get(f"/api/runs/{run['id']}/metrics.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert f"run-{run['id']}-metrics.csv" in r.headers["content-disposition"]
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows == [
        ["key", "step", "value"],
        ["'=cmd", "2", "3.0"],  # a key a spreadsheet would run is neutralised
        ["eval/accuracy", "1", "0.25"],
        ["loss", "1", "1.5"],
        ["loss", "2", ""],
    ]
    only = api.get(f"/api/runs/{run['id']}/metrics.csv", params={"keys": "loss"})
    assert only.text.splitlines() == ["key,step,value", "loss,1,1.5", "loss,2,"]
    assert api.get("/api/runs/2147483647/metrics.csv").status_code == 404


@pytest.mark.parametrize(
    "path", ["/api/runs", "/api/runs/{id}", "/api/runs/{id}/metrics?keys=loss", "/api/studies"]
)
def test_format_on_a_json_endpoint_is_a_422(api: Api, path: str) -> None:
    run = api.external(name="csv-format")
    url = path.format(id=run["id"])
    r = api.get(url + ("&" if "?" in url else "?") + "format=csv")
    assert r.status_code == 422, r.text[:300]
    [error] = r.json()["detail"]
    assert error["loc"] == ["query", "format"] and "metrics.csv" in error["msg"]
    assert api.get(url).status_code == 200  # without it, as before
