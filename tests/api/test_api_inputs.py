"""What a submitted config may make a worker read, load or allocate (backend/runs/inputs.py):
refused at submit with a 422 at the field, and again by a real worker with its own settings."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.main import create_app
from backend.migrate import migrate
from tests.api.conftest import (
    Api,
    create_pg_database,
    drop_pg_database,
    make_settings,
    make_tokens,
    tiny_config,
    wait_for,
)

MAXIMAL = {"prompts_per_step": 4096, "group_size": 256, "max_new_tokens": 32_768}
PATH_LOC = ["body", "config", "task", "params", "path"]


def jsonl_config(path: str, **params: Any) -> dict[str, Any]:
    task = {"name": "jsonl", "params": {"path": path, **params}, "eval_size": 4}
    return tiny_config(2, task=task)


def write_rows(path: Path, n: int = 40) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def data(api: Api, tmp_path: Path) -> dict[str, Any]:
    """A directory of this test inside the API's data root, and a readable file outside it."""
    root = api.settings.data_dir / "datasets"  # the default data root
    mine = f"t-{uuid.uuid4().hex[:8]}"
    write_rows(root / mine / "train.jsonl")
    write_rows(tmp_path / "secret.jsonl")
    return {"root": root, "dir": mine, "secret": tmp_path / "secret.jsonl"}


def refusal(r: Any, loc: list[Any]) -> str:
    assert r.status_code == 422, r.text
    found = [d for d in r.json()["detail"] if d["loc"] == loc]
    assert found, r.json()["detail"]
    return found[0]["msg"]


def test_a_dataset_inside_the_data_roots_is_accepted(api: Api, data: dict[str, Any]) -> None:
    r = api.post("/api/runs", json={"config": jsonl_config(f"{data['dir']}/train.jsonl")})
    assert r.status_code == 201, r.text
    absolute = str(data["root"] / data["dir"] / "train.jsonl")
    assert api.post("/api/runs", json={"config": jsonl_config(absolute)}).status_code == 201


def test_datasets_outside_the_roots_are_refused_alike(api: Api, data: dict[str, Any]) -> None:
    root, mine = data["root"], data["root"] / data["dir"]
    (mine / "escape.jsonl").symlink_to(data["secret"])
    (mine / "zeros.jsonl").symlink_to("/dev/zero")
    (mine / "a-directory").mkdir()
    depth = len(root.resolve().parts) - 1
    names = {
        "absolute, outside": str(data["secret"]),
        "dot-dot": f"../{data['secret'].parent.name}/secret.jsonl",
        "dot-dot to /": "/".join([".."] * depth) + str(data["secret"]),
        "symlink escape": f"{data['dir']}/escape.jsonl",
        "/dev/zero": "/dev/zero",
        "symlink to /dev/zero": f"{data['dir']}/zeros.jsonl",
        "a directory": f"{data['dir']}/a-directory",
        "missing": f"{data['dir']}/missing.jsonl",
        "/etc/passwd": "/etc/passwd",
    }
    messages = {}
    for case, name in names.items():
        r = api.post("/api/runs", json={"config": jsonl_config(name)})
        messages[case] = refusal(r, PATH_LOC).replace(repr(name), "NAME")
        held_out = jsonl_config(f"{data['dir']}/train.jsonl", eval_path=name)
        refusal(api.post("/api/runs", json={"config": held_out}), PATH_LOC[:-1] + ["eval_path"])
    # missing, outside and not-a-file read the same: the API is no oracle for the worker's files
    assert len(set(messages.values())) == 1, messages
    assert str(data["secret"].parent) not in json.dumps(messages)


def test_a_dataset_over_the_size_cap_is_refused(api: Api, data: dict[str, Any]) -> None:
    huge = data["root"] / data["dir"] / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(api.settings.max_dataset_bytes + 1)  # sparse: no disk used
    r = api.post("/api/runs", json={"config": jsonl_config(f"{data['dir']}/huge.jsonl")})
    assert "over the size cap" in refusal(r, PATH_LOC)


def test_clone_checks_the_merged_config(api: Api, data: dict[str, Any]) -> None:
    src = api.post("/api/runs", json={"config": jsonl_config(f"{data['dir']}/train.jsonl")})
    assert src.status_code == 201, src.text
    run_id = src.json()["runs"][0]["id"]
    overrides = {"task": {"params": {"path": str(data["secret"])}}}
    r = api.post(f"/api/runs/{run_id}/clone", json={"overrides": overrides})
    refusal(r, ["body", "overrides", "task", "params", "path"])
    r = api.post(f"/api/runs/{run_id}/clone", json={"overrides": {"sampling": MAXIMAL}})
    assert "needs about" in refusal(r, ["body", "overrides", "sampling"])


@contextmanager
def client_with(api: Api, **settings: Any) -> Iterator[TestClient]:
    """The API over the same database with other settings."""
    with TestClient(create_app(api.settings.model_copy(update=settings))) as client:
        yield client


def test_models_come_from_the_store_the_roots_or_allowed_hub_ids(api: Api, tmp_path: Path) -> None:
    def post(client: Any, model: str) -> Any:
        config = {**tiny_config(2), "model": {"name": model}}
        return client.post("/api/runs", json={"config": config}, headers=api.h("alice"))

    outside = tmp_path / "their-model"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    loc = ["body", "config", "model", "name"]
    for name in ("../../..", "..", str(outside), "Qwen/Qwen2.5-0.5B-Instruct", "gpt2"):
        msg = refusal(post(api.client, name), loc)
        assert "not available here" in msg and "none are" in msg, msg
    with client_with(api, hub_allow=["conspo-test/*"], model_roots=[tmp_path]) as client:
        assert post(client, "conspo-test/some-model").status_code == 201
        assert post(client, str(outside)).status_code == 201
        assert "conspo-test/*" in refusal(post(client, "Qwen/Qwen2.5-0.5B-Instruct"), loc)
        assert post(client, "tiny").status_code == 201


def test_the_maximal_sampling_config_is_refused_with_its_estimate(api: Api) -> None:
    r = api.post("/api/runs", json={"config": {**tiny_config(2), "sampling": MAXIMAL}})
    msg = refusal(r, ["body", "config", "sampling"])
    assert "needs about" in msg and "TiB" in msg and "sampling.max_new_tokens" in msg
    with client_with(api, max_run_memory_gib=0.001) as client:  # 1 MiB: not even the weights
        r = client.post("/api/runs", json={"config": tiny_config(2)}, headers=api.h("alice"))
        assert "over the 1.0 MiB" in refusal(r, ["body", "config", "model", "name"])


# ------------------------------------------------------------------------------------------------
# The worker checks again, with its own settings
# ------------------------------------------------------------------------------------------------


def own_api(mode: str, tmp: Path, request: pytest.FixtureRequest, **settings: Any) -> Api:
    """An API on a database of this test's own (the session's holds runs a worker would take)."""
    if mode == "cluster":
        db, broker = create_pg_database(), request.getfixturevalue("redis_url")
        request.addfinalizer(lambda: drop_pg_database(db))
    else:
        db, broker = f"sqlite:///{tmp / 'conspo.db'}", f"sqla+sqlite:///{tmp / 'broker.db'}"
    migrate(db)
    api_settings = make_settings(tmp, db, broker, **settings)
    return Api(TestClient(create_app(api_settings)), api_settings, make_tokens(api_settings))


@pytest.mark.slow
@pytest.mark.services
@pytest.mark.parametrize("mode", ["embedded", "cluster"])
def test_the_worker_refuses_what_its_own_settings_do_not_allow(
    mode: str, tmp_path: Path, request: pytest.FixtureRequest, workers: Any, model_store: Path
) -> None:
    api_only, shared = tmp_path / "api-only-data", tmp_path / "shared-data"
    write_rows(api_only / "train.jsonl")
    write_rows(shared / "train.jsonl")
    # A permissive API (as a misconfigured or older head node might be) ...
    api = own_api(
        mode, tmp_path, request, data_roots=[api_only, shared], hub_allow=["conspo-test/*"]
    )
    wp = workers(api.settings, model_store)
    # ... and a worker whose own settings are narrower: they are the ones that count.
    wp.env.update(
        {
            "CONSPO_DATA_ROOTS": str(shared),
            "CONSPO_HUB_ALLOW": "conspo-test/*",
            # room for the process (430 MiB by the estimate) and a tiny run, not for "big"
            "CONSPO_MAX_RUN_MEMORY_GIB": "0.6",
            "HF_HUB_OFFLINE": "1",
            "HF_ENDPOINT": "http://127.0.0.1:9",  # any download attempt would fail differently
        }
    )
    wp.start()
    big = {"prompts_per_step": 64, "group_size": 16, "max_new_tokens": 64}  # about 1.4 GiB
    configs = {
        "dataset outside the worker's roots": jsonl_config(str(api_only / "train.jsonl")),
        "hub id not in the cache, offline": {**tiny_config(2), "model": {"name": "conspo-test/x"}},
        "over the worker's memory limit": {**tiny_config(2), "sampling": big},
        "allowed everywhere": jsonl_config(str(shared / "train.jsonl")),
    }
    ids = {}
    for case, config in configs.items():
        r = api.post("/api/runs", json={"config": config})
        assert r.status_code == 201, (case, r.text)
        ids[case] = r.json()["runs"][0]["id"]

    def ended(run_id: int) -> dict[str, Any] | None:
        run = api.get(f"/api/runs/{run_id}").json()
        return run if run["status"] in {"succeeded", "failed", "cancelled"} else None

    try:
        runs = {case: wait_for(lambda i=i: ended(i), 180, case) for case, i in ids.items()}
    except AssertionError:
        pytest.fail(f"a run did not end\n{wp.tail()}")
    errors = {case: (run["status"], (run["error"] or "")[-300:]) for case, run in runs.items()}
    assert runs["allowed everywhere"]["status"] == "succeeded", errors
    expected = {
        "dataset outside the worker's roots": "not a readable regular file inside the data roots",
        "hub id not in the cache, offline": "HF_HUB_OFFLINE=1 forbids downloading it",
        "over the worker's memory limit": "this config needs about",
    }
    for case, text in expected.items():
        assert runs[case]["status"] == "failed", errors
        assert text in runs[case]["error"], errors
        assert runs[case]["step"] == 0
    assert "over the 614.4 MiB a run may use" in runs["over the worker's memory limit"]["error"]
    api.client.close()
    assert os.path.exists(shared / "train.jsonl")


def test_more_processes_than_groups_is_refused_at_submit(api: Api) -> None:
    """Data-parallel ranks train whole groups (conspo.distributed.collectives): each needs one."""
    config = tiny_config(2, resources={"gpus": 4})  # tiny_config samples 2 prompts per step
    r = api.post("/api/runs", json={"config": config})
    assert r.status_code == 422, r.text
    assert "sampling.prompts_per_step (2) must be at least resources.gpus" in r.text
