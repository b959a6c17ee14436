"""The estimate names what a submit would refuse, as its 422 names it, so the form can mark the
fields as you type (issue 37 item 12); a valid request has no errors."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services


def test_the_estimate_reports_a_submits_errors_field_by_field(api: Api) -> None:
    bad = {**tiny_config(2), "steps": -3, "sampling": {"group_size": 1}}
    report = api.post("/api/runs/estimate", json={"config": bad, "seeds": [0, "one"]}).json()
    assert report["total_bytes"] is None
    locs = {tuple(e["loc"]) for e in report["errors"]}
    assert ("body", "config", "steps") in locs
    assert ("body", "config", "sampling", "group_size") in locs
    assert ("body", "seeds", 1) in locs
    # the submit refuses the same fields
    refused = api.post("/api/runs", json={"config": bad, "seeds": [0, 1]})
    assert refused.status_code == 422
    assert {tuple(e["loc"]) for e in refused.json()["detail"]} <= locs
    good = api.post("/api/runs/estimate", json={"config": tiny_config(2), "seeds": [0, 1]})
    assert good.status_code == 200 and good.json()["errors"] is None
    many = api.post("/api/runs/estimate", json={"config": tiny_config(2), "seeds": ["x"] * 500})
    assert many.status_code == 200 and len(many.json()["errors"]) == 1  # too long: one error


def test_a_bad_model_name_comes_with_the_other_errors(api: Api) -> None:
    """Issue 37 item 12: a model that is not here was named only once every other field was
    fixed (it is checked after validation). The estimate and the submit name it at once."""
    model = {"name": "no-such-model-here"}
    bad = {**tiny_config(2), "steps": -3, "model": model}
    where = ("body", "config", "model", "name")
    report = api.post("/api/runs/estimate", json={"config": bad}).json()
    locs = {tuple(e["loc"]) for e in report["errors"]}
    assert {where, ("body", "config", "steps")} <= locs
    refused = api.post("/api/runs", json={"config": bad})
    assert refused.status_code == 422
    found = {tuple(e["loc"]): e["msg"] for e in refused.json()["detail"]}
    assert ("body", "config", "steps") in found and "no-such-model-here" in found[where]
    # alone (a valid config otherwise) the estimate marks it as the submit refuses it
    alone = api.post("/api/runs/estimate", json={"config": {**tiny_config(2), "model": model}})
    assert [tuple(e["loc"]) for e in alone.json()["errors"]] == [where]
    # a name that is not a name at all is validation's to refuse, once
    control = {**bad, "model": {"name": "a\x00b"}}
    detail = api.post("/api/runs", json={"config": control}).json()["detail"]
    assert [tuple(e["loc"]) for e in detail].count(where) == 1
    # other routes' 422s are unchanged (nothing is looked up for them)
    study = api.post("/api/studies", json={"name": "x", "config": bad, "arms": []})
    assert study.status_code == 422


def test_the_estimate_gives_the_pace_of_runs_like_it(api: Api) -> None:
    """Issue 37 item 6: a seconds-per-step estimate beside the memory one, from the pace of the
    latest runs of the same model and shape (median), for a caller with a token."""
    from sqlalchemy import update

    from backend.db import Database
    from backend.models import Run

    config = {**tiny_config(2), "sampling": {**tiny_config(2)["sampling"], "max_new_tokens": 5}}
    ids = [api.post("/api/runs", json={"config": config}).json()["runs"][0]["id"] for _ in range(3)]
    db = Database(api.settings)
    with db.session() as session:
        for run_id, pace in zip(ids, (4.0, 6.0, 50.0), strict=True):
            session.execute(update(Run).where(Run.id == run_id).values(pace_s=pace, device="cpu"))
        session.commit()
    db.dispose()
    pace = api.post("/api/runs/estimate", json={"config": config}).json()["pace"]
    assert pace == {"seconds_per_step": 6.0, "runs": 3, "devices": ["cpu"]}
    other = {**config, "sampling": {**config["sampling"], "max_new_tokens": 7}}
    assert api.post("/api/runs/estimate", json={"config": other}).json()["pace"] is None


def test_a_generators_parameters_for_the_form(api: Api) -> None:
    found = api.get("/api/presets/generators/gcd").json()
    by_name = {p["name"]: p for p in found["parameters"]}
    assert by_name["max_value"] == {
        "name": "max_value", "type": "integer", "default": 1000, "min": -10000, "max": 10000
    }  # fmt: skip
    assert "seed" not in by_name and "size" not in by_name  # the task sets those
    missing = api.get("/api/presets/generators/no_such_generator")
    assert missing.status_code == 404 and "no_such_generator" in missing.json()["detail"]
    assert api.get("/api/presets/generators/..%2Fetc").status_code in (404, 422)


def test_an_sft_estimate_sizes_its_rows_by_the_problems_its_task_check_drew(api: Api) -> None:
    """Issue 49: without its task built, an sft step's rows were sized by a default question of
    48 tokens (arith's are "12+7=": the estimate read 2.6x its peak). With a token the task
    check draws the problems, and the update is sized by the longest of them."""
    sft = {
        **tiny_config(2),
        "algorithm": None,
        "kind": "sft",
        "kind_params": {"batch_size": 32},
        "model": {"name": "smollm2-135m-instruct"},
    }
    anonymous = api.post("/api/runs/estimate", user=None, json={"config": sft}).json()
    checked = api.post("/api/runs/estimate", json={"config": sft}).json()
    assert checked["task"]["longest_prompt"] > 0
    assert checked["parts"]["update"] < 0.8 * anonymous["parts"]["update"]
    assert checked["total_bytes"] == sum(checked["parts"][k] for k in ("process", "state")) + max(
        checked["parts"][k] for k in ("sampling", "evaluation", "update")
    )
    # the same rows where no task is built to measure them: an rl run's are its answers
    rl = api.post("/api/runs/estimate", json={"config": tiny_config(2)}).json()
    assert rl["task"] is None or "longest_prompt" in rl["task"]
