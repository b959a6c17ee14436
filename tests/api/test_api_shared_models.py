"""A run's model is its owner's until they share it (``backend.runs.sharing``), on SQLite and
PostgreSQL: starting from another user's run that is not shared (``model.from_run``, DPO's
``kind_params.from_run``) is a 403 at the field naming the run, from every route that takes a
config (runs, clones, studies, pipelines), and so is exporting a model trained from one; its owner
(or an admin) shares it with ``PATCH /api/runs/{id} {"model_shared": true}``, nobody else may;
an admin is never refused. Alice owns the source models, bob tries to use them, root is the admin.

The runs train for real, in this process, with the worker's own code (tiny model, 2 steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services


def train_as(api: Api, user: str, config: dict[str, Any]) -> dict[str, Any]:
    """Submit ``config`` as ``user`` and run its job with the worker's code, in this process."""
    from backend.db import Database
    from backend.runs.queue import JobQueue, make_celery
    from worker.tasks import execute_run

    r = api.post("/api/runs", user=user, json={"config": config})
    assert r.status_code == 201, r.text
    run_id = r.json()["runs"][0]["id"]
    db = Database(api.settings)
    try:
        execute_run(
            db, JobQueue(make_celery(api.settings), api.settings.queue), api.settings, run_id
        )
    finally:
        db.dispose()
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "succeeded", run["error"]
    return dict(run)


def from_run(run_id: int) -> dict[str, Any]:
    return tiny_config(1, model={"name": "tiny", "from_run": run_id})


def share(api: Api, run_id: int, shared: bool, user: str | None = "alice") -> Any:
    return api.patch(f"/api/runs/{run_id}", user=user, json={"model_shared": shared})


def refused_at(r: Any, loc: list[Any]) -> str:
    """The 403's message at ``loc`` (the body is the 422's shape: one error per field)."""
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert [e["loc"] for e in detail] == [loc], detail
    return str(detail[0]["msg"])


def counts(api: Api) -> tuple[int, int, int]:
    """Runs, studies and pipelines stored: a refused submit writes none."""
    return (
        api.get("/api/runs?limit=1").json()["total"],
        api.get("/api/studies").json()["total"],
        len(api.get("/api/pipelines").json()["pipelines"]),
    )


@pytest.fixture
def api(own_api: Api) -> Api:
    """A database and data dir of each test's own: the exports written here stay out of the
    session's data dir, where other tests count them."""
    return own_api


@pytest.fixture
def alices(api: Api) -> dict[str, Any]:
    """A finished run of alice's with its last checkpoint, not shared."""
    run = train_as(api, "alice", tiny_config(2))
    assert run["model_shared"] is False and run["owner"].startswith("alice")
    return run


def test_starting_from_another_users_model_needs_it_shared(
    api: Api, alices: dict[str, Any]
) -> None:
    source = alices["id"]
    before = counts(api)
    r = api.post("/api/runs", user="bob", json={"config": from_run(source)})
    msg = refused_at(r, ["body", "config", "model", "from_run"])
    assert f"run {source} belongs to alice" in msg and "model_shared" in msg
    assert r.json()["detail"][0]["input"] == source
    # DPO reads the run's rollouts: the same rule at its own field
    dpo = {**tiny_config(1), "kind": "dpo", "kind_params": {"from_run": source, "batch_size": 2}}
    r = api.post("/api/runs", user="bob", json={"config": dpo})
    assert f"run {source} belongs to alice" in refused_at(
        r, ["body", "config", "kind_params", "from_run"]
    )
    # a clone of anyone's run whose overrides start from it
    r = api.post(
        f"/api/runs/{source}/clone", user="bob", json={"overrides": {"model": {"from_run": source}}}
    )
    refused_at(r, ["body", "overrides", "model", "from_run"])
    assert counts(api) == before

    # its owner and an admin may
    for user in ("alice", "root"):
        r = api.post("/api/runs", user=user, json={"config": from_run(source)})
        assert r.status_code == 201, r.text

    shared = share(api, source, True)
    assert shared.status_code == 200 and shared.json()["model_shared"] is True
    assert api.get(f"/api/runs/{source}").json()["model_shared"] is True
    r = api.post("/api/runs", user="bob", json={"config": from_run(source)})
    assert r.status_code == 201, r.text
    assert api.post("/api/runs", user="bob", json={"config": dpo}).status_code == 201

    # un-shared: refused again from then on
    assert share(api, source, False).json()["model_shared"] is False
    r = api.post("/api/runs", user="bob", json={"config": from_run(source)})
    refused_at(r, ["body", "config", "model", "from_run"])


def test_studies_and_pipelines_refuse_another_users_unshared_model(
    api: Api, alices: dict[str, Any]
) -> None:
    source = alices["id"]
    before = counts(api)
    arms = {"name": "from-alice", "config": tiny_config(1), "seeds": [0, 1],
            "arms": [{"name": "a", "overrides": {}},
                     {"name": "b", "overrides": {"model.from_run": source}}]}  # fmt: skip
    for path in ("/api/studies", "/api/studies/check"):
        r = api.post(path, user="bob", json=arms)
        assert f"run {source}" in refused_at(r, ["body", "arms", 1, "overrides", "model.from_run"])
    base = {**arms, "config": from_run(source), "arms": [{"name": "a", "overrides": {}}]}
    # an arm study's submit checks are each arm's config (the base's value under the arm)
    r = api.post("/api/studies", user="bob", json=base)
    refused_at(r, ["body", "arms", 0, "overrides", "model", "from_run"])
    space = {"model.from_run": {"type": "categorical", "choices": [source]}}
    search = {**base, "config": tiny_config(1), "search": {"space": space, "sampler": "random",
                                                           "trials": 1}}  # fmt: skip
    del search["arms"]
    r = api.post("/api/studies", user="bob", json=search)
    refused_at(r, ["body", "search", "space", "model.from_run"])
    # a range of run ids would start trials from runs nobody checked: refused whoever asks
    ranged = {"model.from_run": {"type": "int", "low": source, "high": source + 5}}
    ranged_search = {**search, "search": {**search["search"], "space": ranged}}
    r = api.post("/api/studies", user="root", json=ranged_search)
    assert r.status_code == 422 and "categorical" in r.text, r.text
    pipeline = {"name": "from-alice", "stages": [from_run(source), tiny_config(1)]}
    r = api.post("/api/pipelines", user="bob", json=pipeline)
    refused_at(r, ["body", "stages", 0, "model", "from_run"])
    assert counts(api) == before

    assert share(api, source, True).status_code == 200
    assert api.post("/api/studies/check", user="bob", json=arms).status_code == 200
    assert api.post("/api/pipelines", user="bob", json=pipeline).status_code == 201


def test_a_derivative_is_exported_only_while_its_source_is_shared(
    api: Api, alices: dict[str, Any]
) -> None:
    source = alices["id"]
    share(api, source, True)
    derived = train_as(api, "bob", from_run(source))  # bob trains from it while it is shared
    share(api, source, False)
    exports = api.settings.data_dir / "exports"

    r = api.post(f"/api/models/{derived['id']}/export", user="bob", json={})
    assert r.status_code == 403, r.text
    assert (
        f"run {derived['id']} was trained from run {source}, which belongs to alice"
        in r.json()["detail"]
    )
    assert not list(exports.glob(f"run-{derived['id']}-*"))
    # nor may bob start from his derivative: it carries alice's model
    r = api.post("/api/runs", user="bob", json={"config": from_run(derived["id"])})
    assert f"trained from run {source}" in refused_at(r, ["body", "config", "model", "from_run"])
    # the registry says so, to each caller
    models = {m["run_id"]: m for m in api.get("/api/models", user="bob").json()["models"]}
    assert models[source]["owner"].startswith("alice") and not models[source]["model_shared"]
    assert not (models[source]["may_start_from"] or models[source]["may_share"])
    assert models[derived["id"]]["may_share"] and not models[derived["id"]]["may_export"]
    assert not models[derived["id"]]["may_start_from"]
    mine = {m["run_id"]: m for m in api.get("/api/models", user="alice").json()["models"]}
    assert (
        mine[source]["may_share"] and mine[source]["may_export"] and mine[source]["may_start_from"]
    )
    anonymous = {m["run_id"]: m for m in api.get("/api/models").json()["models"]}
    assert not anonymous[source]["may_start_from"] and not anonymous[source]["may_share"]

    assert share(api, source, True).status_code == 200
    r = api.post(f"/api/models/{derived['id']}/export", user="bob", json={})
    assert r.status_code == 200, r.text
    assert (Path(r.json()["path"]) / "config.json").is_file()
    models = {m["run_id"]: m for m in api.get("/api/models", user="bob").json()["models"]}
    assert models[derived["id"]]["may_export"] and models[derived["id"]]["may_start_from"]

    # an admin may export it unshared; the rule of the exported run's own owner stays
    share(api, source, False)
    assert api.post(f"/api/models/{derived['id']}/export", user="root", json={}).status_code == 200
    r = api.post(f"/api/models/{derived['id']}/export", user="alice", json={})
    assert r.status_code == 403 and "only its owner or an admin" in r.json()["detail"]


def test_only_the_owner_or_an_admin_sets_the_flag(api: Api, alices: dict[str, Any]) -> None:
    source = alices["id"]
    r = share(api, source, True, user="bob")
    assert r.status_code == 403 and "only its owner or an admin" in r.json()["detail"]
    assert share(api, source, True, user=None).status_code == 401
    assert api.get(f"/api/runs/{source}").json()["model_shared"] is False
    for bad in ("yes", 1, None):
        r = api.patch(f"/api/runs/{source}", json={"model_shared": bad})
        assert r.status_code == 422, r.text
    assert share(api, source, True, user="root").json()["model_shared"] is True
    listed = api.get(f"/api/runs?ids={source}").json()["items"]
    assert [run["model_shared"] for run in listed] == [True]
