"""Bodies are strict where a run config enters too (issue 49), as docs/api.md promises: a
boolean is no number, "5" no integer and "10" no τ, in the config's sections and in the
registered params alike. A submit refuses them with a 422 naming the field, the estimate reports
them at the same place, and JSON's numbers stay numbers (5.0 an integer, 1 a float)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services

BAD: list[tuple[dict[str, Any], tuple[str | int, ...]]] = [
    ({"steps": True}, ("steps",)),  # was a 201 that trained one step
    ({"steps": "5"}, ("steps",)),
    ({"params": {"clip_high": "0.2"}}, ("params", "clip_high")),
    ({"optim": {"lr": "3e-5"}}, ("optim", "lr")),
    (
        {"task": {"name": "arith", "eval_size": 4, "params": {"digits": "2"}}},
        ("task", "params", "digits"),
    ),
]


@pytest.mark.parametrize(("change", "loc"), BAD)
def test_a_mistyped_value_is_refused_at_its_field(
    api: Api, change: dict[str, Any], loc: tuple[str | int, ...]
) -> None:
    config = {**tiny_config(2), **change}
    refused = api.post("/api/runs", json={"config": config})
    assert refused.status_code == 422, refused.text[:300]
    assert ["body", "config", *loc] in [e["loc"] for e in refused.json()["detail"]]
    report = api.post("/api/runs/estimate", json={"config": config})
    assert report.status_code == 200 and report.json()["total_bytes"] is None
    assert ["body", "config", *loc] in [e["loc"] for e in report.json()["errors"]]


def test_tau_as_text_is_refused_for_conspo(api: Api) -> None:
    config = {**tiny_config(2), "algorithm": "conspo", "params": {"tau": "10"}}
    refused = api.post("/api/runs", json={"config": config})
    assert refused.status_code == 422
    assert ["body", "config", "params", "tau"] in [e["loc"] for e in refused.json()["detail"]]


def test_a_clones_overrides_are_strict_too(api: Api) -> None:
    source = api.post("/api/runs", json={"config": tiny_config(2)}).json()["runs"][0]
    refused = api.post(f"/api/runs/{source['id']}/clone", json={"overrides": {"steps": True}})
    assert refused.status_code == 422
    assert any(e["loc"][-1] == "steps" for e in refused.json()["detail"]), refused.text[:300]


def test_json_numbers_are_accepted_as_json_has_them(api: Api) -> None:
    config = {**tiny_config(2), "steps": 3.0, "optim": {"lr": 1}, "params": {"clip_high": 1}}
    created = api.post("/api/runs", json={"config": config})
    assert created.status_code == 201, created.text[:300]
    stored = created.json()["runs"][0]["config"]
    assert (
        stored["steps"] == 3
        and stored["optim"]["lr"] == 1.0
        and stored["params"]["clip_high"] == 1.0
    )
    report = api.post("/api/runs/estimate", json={"config": config}).json()
    assert report["errors"] is None and report["total_bytes"] > 0
