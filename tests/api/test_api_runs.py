"""Runs: create / list / read / clone / cancel / delete, auth and ownership, bad input → 4xx."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from backend.main import create_app
from conspo.config import RunConfig
from conspo.demo import DEMO_CONFIG
from conspo.models.catalog import BUILTIN_MODELS
from conspo.registry import get_reward, get_task, reward_names, task_names
from tests.api.conftest import Api, make_settings, make_tokens, tiny_config


def locs(response) -> list[list]:  # type: ignore[no-untyped-def]
    return [d["loc"] for d in response.json()["detail"]]


def test_create_one_run_per_seed_and_read_back(api: Api) -> None:
    tag = uuid.uuid4().hex
    r = api.post("/api/runs", json={"config": tiny_config(4), "seeds": [3, 4, 5], "tags": [tag]})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["group_id"] and len(body["runs"]) == 3
    assert [run["seed"] for run in body["runs"]] == [3, 4, 5]
    assert [run["config"]["seed"] for run in body["runs"]] == [3, 4, 5]
    first = body["runs"][0]
    assert first["status"] == "queued" and first["owner"].startswith("alice")
    assert first["config"]["params"]["clip_low"] == 0.2  # resolved defaults are stored
    assert first["total_steps"] == 4 and first["external"] is False
    got = api.get(f"/api/runs/{first['id']}").json()
    assert got["id"] == first["id"] and got["group_id"] == body["group_id"]

    listed = api.get("/api/runs", params={"tag": tag, "sort": "id"}).json()
    assert listed["total"] == 3 and [x["seed"] for x in listed["items"]] == [3, 4, 5]
    grouped = api.get("/api/runs", params={"group_id": body["group_id"], "limit": 2}).json()
    assert grouped["total"] == 3 and len(grouped["items"]) == 2
    single = api.post("/api/runs", json={"config": tiny_config(2), "name": f"solo-{tag}"}).json()
    assert single["group_id"] is None and single["runs"][0]["name"] == f"solo-{tag}"
    assert api.get("/api/runs", params={"q": f"SOLO-{tag}"}).json()["total"] == 1
    picked = [body["runs"][2]["id"], single["runs"][0]["id"]]
    by_ids = api.get("/api/runs", params={"ids": f"{picked[0]}, {picked[1]}", "sort": "id"})
    assert [x["id"] for x in by_ids.json()["items"]] == sorted(picked)


def test_names_are_unique_and_a_plain_clone_keeps_the_base(api: Api) -> None:
    name = f"uniq-{uuid.uuid4().hex[:6]}"
    first = api.post("/api/runs", json={"config": tiny_config(4), "name": name}).json()["runs"]
    again = api.post("/api/runs", json={"config": tiny_config(4), "name": name}).json()["runs"]
    seeds = api.post(
        "/api/runs", json={"config": tiny_config(4), "name": name, "seeds": [0, 1]}
    ).json()["runs"]
    assert [r["name"] for r in first + again] == [name, f"{name}-2"]
    assert [r["name"] for r in seeds] == [f"{name}-s0", f"{name}-s1"]
    copy = api.post(f"/api/runs/{again[0]['id']}/clone", json={"overrides": {}}).json()["runs"][0]
    assert copy["name"] == f"{name}-3" and copy["cloned_from"] == again[0]["id"]
    assert api.get(f"/api/runs/{copy['id']}").json()["cloned_from"] == again[0]["id"]


def test_clone_deep_merges_overrides(api: Api) -> None:
    src = api.post("/api/runs", json={"config": tiny_config(4), "tags": ["a"]}).json()["runs"][0]
    r = api.post(
        f"/api/runs/{src['id']}/clone",
        user="bob",
        json={"overrides": {"algorithm": "conspo", "sampling": {"group_size": 6}}, "seeds": [7]},
    )
    assert r.status_code == 201, r.text
    run = r.json()["runs"][0]
    assert run["algorithm"] == "conspo" and run["config"]["params"]["tau"] == 10.0
    assert run["config"]["sampling"] == {**src["config"]["sampling"], "group_size": 6}
    # Tags label the source run; the copy records its lineage instead (issue 14).
    assert run["seed"] == 7 and run["tags"] == [] and run["owner"].startswith("bob")
    assert run["cloned_from"] == src["id"]
    bad = api.post(f"/api/runs/{src['id']}/clone", json={"overrides": {"params": {"clip_low": 2}}})
    assert bad.status_code == 422 and ["body", "overrides", "params", "clip_low"] in locs(bad)
    bad = api.post(
        f"/api/runs/{src['id']}/clone", json={"overrides": {"task": {"params": {"digits": 0}}}}
    )
    assert bad.status_code == 422
    assert ["body", "overrides", "task", "params", "digits"] in locs(bad)


def test_clone_to_another_task_drops_the_old_tasks_params(api: Api) -> None:
    config = tiny_config(4, task={"name": "arith", "params": {"operators": "*"}, "eval_size": 4})
    src = api.post("/api/runs", json={"config": config}).json()["runs"][0]
    task = {"name": "countdown"}
    run = api.post(f"/api/runs/{src['id']}/clone", json={"overrides": {"task": task}}).json()
    countdown = get_task("countdown").params().model_dump()
    assert run["runs"][0]["config"]["task"] == {**task, "params": countdown, "eval_size": 4}
    same_task = {"task": {"params": {"digits": 2}}}
    run = api.post(f"/api/runs/{src['id']}/clone", json={"overrides": same_task}).json()
    assert run["runs"][0]["config"]["task"]["params"] == {
        "digits": 2,
        "operators": "*",
        "num_operands": 2,
    }


def test_auth_and_ownership(api: Api) -> None:
    cfg = {"config": tiny_config(3)}
    assert api.post("/api/runs", user=None, json=cfg).status_code == 401
    bad = api.client.post("/api/runs", json=cfg, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "nope" not in bad.text
    run = api.post("/api/runs", json=cfg).json()["runs"][0]
    rid = run["id"]
    assert api.post(f"/api/runs/{rid}/cancel", user=None).status_code == 401
    assert api.post(f"/api/runs/{rid}/cancel", user="bob").status_code == 403
    assert api.delete(f"/api/runs/{rid}", user="bob").status_code == 403
    cancelled = api.post(f"/api/runs/{rid}/cancel", user="root")  # an admin may
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    other = api.post("/api/runs", json=cfg).json()["runs"][0]["id"]
    assert api.post(f"/api/runs/{other}/cancel").json()["status"] == "cancelled"  # the owner may
    assert api.delete(f"/api/runs/{rid}", user="root").status_code == 204
    assert api.get(f"/api/runs/{rid}").status_code == 404
    ext = api.external(user="alice")
    log = {"steps": [{"step": 1, "metrics": {"x": 1.0}}]}
    assert api.post(f"/api/runs/{ext['id']}/log", user="bob", json=log).status_code == 403
    assert api.post(f"/api/runs/{ext['id']}/log", user="root", json=log).status_code == 200


def test_reads_can_require_a_token(api: Api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = api.settings.model_copy(update={"reads_require_token": True})
    with TestClient(create_app(s)) as client:
        assert client.get("/api/runs").status_code == 401
        ok = client.get("/api/runs", headers=api.h("bob"))
        assert ok.status_code == 200
        assert client.get("/api/health").status_code == 200  # health stays open


def test_invalid_input_names_the_field(api: Api) -> None:
    cases = [
        ({"config": {"params": {"tau": -1}}}, ["body", "config", "params", "tau"]),
        ({"config": {"algorithm": "trpo"}}, ["body", "config", "algorithm"]),
        ({"config": {"sampling": {"group_size": 1}}}, ["body", "config", "sampling", "group_size"]),
        ({"config": {"nope": 1}}, ["body", "config", "nope"]),
        # params errors arrive together with the other sections' errors
        ({"config": {"steps": 0, "params": {"tau": 0}}}, ["body", "config", "params", "tau"]),
        ({"config": {"steps": 0, "params": {"tau": 0}}}, ["body", "config", "steps"]),
        ({"config": {"task": {"name": "sudoku"}}}, ["body", "config", "task", "name"]),
        (
            {"config": {"steps": 0, "task": {"params": {"digits": 0}}}},
            ["body", "config", "task", "params", "digits"],
        ),
        ({"config": {}, "seeds": [-1]}, ["body", "seeds", 0]),
        ({"config": {}, "seeds": [2**40]}, ["body", "seeds", 0]),
        ({"config": {}, "tags": ["a\x00b"]}, ["body", "tags", 0]),
        ({"config": {}, "extra": 1}, ["body", "extra"]),
        ({}, ["body", "config"]),
    ]
    for body, loc in cases:
        r = api.post("/api/runs", json=body)
        assert r.status_code == 422, (body, r.text)
        assert loc in locs(r), (body, locs(r))
    bad_json = api.post("/api/runs", content=b"{no", headers={"content-type": "application/json"})
    assert bad_json.status_code == 422
    assert api.get("/api/runs/0").status_code == 422
    assert api.get(f"/api/runs/{2**40}").status_code == 422
    assert api.get("/api/runs/abc").status_code == 422
    assert api.get("/api/runs/2147483647").status_code == 404
    for params, loc in [
        ({"limit": 501}, ["query", "limit"]),
        ({"sort": "bogus"}, ["query", "sort"]),
        ({"status": "done"}, ["query", "status"]),
        ({"q": "x\x00"}, ["query", "q"]),
        ({"offset": -1}, ["query", "offset"]),
        ({"ids": "1,x"}, ["query", "ids"]),
        ({"ids": ","}, ["query", "ids"]),
    ]:
        r = api.get("/api/runs", params=params)
        assert r.status_code == 422 and loc in locs(r), (params, r.text)
    big = b'{"config": {}, "name": "' + b"x" * (api.settings.max_request_bytes + 10) + b'"}'
    r = api.post("/api/runs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_failed_enqueue_leaves_nothing_queued(api: Api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dead = make_settings(
        api.settings.data_dir, api.settings.database_url, "redis://127.0.0.1:18199/0"
    )
    tag = uuid.uuid4().hex
    with TestClient(create_app(dead)) as client:
        tokens = make_tokens(dead)
        r = client.post(
            "/api/runs",
            json={"config": tiny_config(2), "seeds": [1, 2], "tags": [tag]},
            headers={"Authorization": f"Bearer {tokens['alice']}"},
        )
        assert r.status_code == 503 and "nothing was queued" in r.json()["detail"]
        assert client.get("/api/health").json()["broker"].startswith("error")
    assert api.get("/api/runs", params={"tag": tag}).json()["total"] == 0


def test_health_and_presets(api: Api) -> None:
    health = api.get("/api/health").json()
    assert health["database"] == "ok" and health["broker"] == "ok"
    # No worker serves this session's runs: degraded, saying why (tests/api/test_api_health.py).
    assert health["status"] == ("degraded" if health["reasons"] else "ok")
    assert health["mode"] == ("embedded" if api.settings.mode == "embedded" else "cluster")
    presets = api.get("/api/presets").json()
    names = {a["name"] for a in presets["algorithms"]}
    assert {"grpo", "conspo", "dapo", "dr_grpo"} <= names
    conspo = next(a for a in presets["algorithms"] if a["name"] == "conspo")
    assert conspo["defaults"]["tau"] == 10.0 and "tau" in conspo["params_schema"]["properties"]
    assert {"arith", "countdown", "jsonl"} <= {t["name"] for t in presets["tasks"]}
    assert "tiny" in {m["name"] for m in presets["models"]}
    assert presets["defaults"]["algorithm"] == "conspo" and "properties" in presets["config_schema"]


def test_presets_list_the_registered_tasks_with_their_params(api: Api) -> None:
    presets = api.get("/api/presets").json()
    tasks = {t["name"]: t for t in presets["tasks"]}
    assert list(tasks) == task_names()
    for name, preset in tasks.items():
        registered = get_task(name)
        assert preset["description"] == registered.description
        assert preset["params_schema"] == registered.params.model_json_schema()
        required = set(preset["params_schema"].get("required", []))
        assert set(preset["defaults"]) == set(registered.params.model_fields) - required
    assert tasks["arith"]["defaults"] == {"digits": 1, "operators": "+-", "num_operands": 2}
    assert tasks["jsonl"]["defaults"] == {"eval_path": None}  # path is the user's to give
    # The form starts from the demo's settings (conspo/demo.py), the task's other params filled.
    assert presets["defaults"]["task"]["params"] == {
        **tasks["arith"]["defaults"],
        "num_operands": 3,
    }
    assert presets["defaults"] == RunConfig.model_validate(DEMO_CONFIG).model_dump(mode="json")
    models = {m["name"]: m["description"] for m in presets["models"]}
    assert models == {name: m.description for name, m in BUILTIN_MODELS.items()}


def test_presets_list_the_registered_rewards_with_their_params(api: Api) -> None:
    rewards = {r["name"]: r for r in api.get("/api/presets").json()["rewards"]}
    assert list(rewards) == reward_names()
    for name, preset in rewards.items():
        registered = get_reward(name)
        assert preset["description"] == registered.description
        assert preset["params_schema"] == registered.params.model_json_schema()
        required = set(preset["params_schema"].get("required", []))
        assert set(preset["defaults"]) == set(registered.params.model_fields) - required
        assert preset["default_weight"] == registered.default_weight
        # the tasks a run may have it with: those that have the method it needs (the config
        # refuses the others: tests/conspo/test_registries.py)
        method = registered.task_method
        needs = [t for t in task_names() if method is None or hasattr(get_task(t).cls, method)]
        assert preset["tasks"] == needs, name
    assert rewards["length"]["defaults"] == {"buffer": 8}
    assert (
        rewards["process"]["default_weight"] == 0.2 and "jsonl" not in rewards["process"]["tasks"]
    )
