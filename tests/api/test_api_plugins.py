"""Plugins over HTTP: a run naming a plugin's task or reward is accepted only while a live
worker has loaded that plugin (a 422 at each field naming the plugin otherwise), /api/health
lists what the API process and each worker loaded, and the accepted run trains with the
worker's own code. Both databases."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.api.routes.presets import presets
from backend.liveness import WorkerIdentity
from conspo import plugins
from tests.api.conftest import Api, run_in_worker, tiny_config
from tests.api.test_api_tools import SANDBOXED, alive, errors_at

pytestmark = pytest.mark.services

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "conspo_example_plugin"
PLUGIN = "conspo_example_plugin"
USES_PLUGIN: dict[str, Any] = {
    "task": {"name": "count_letter", "eval_size": 4},
    "rewards": [{"name": "verifier"}, {"name": "brevity", "params": {"limit": 20}}],
}
# All three of the plugin's kinds of entry in one run: its task (built on the environment
# task), the environment it plays, and its reward that reads the played episode; turns credited
PLAYS_PLUGIN: dict[str, Any] = {
    "task": {"name": "nim_games", "eval_size": 4},
    "rewards": [{"name": "verifier"}, {"name": "few_turns", "params": {"max_turns": 4}}],
    "environment": {"max_turns": 4, "credit": "gigpo"},
}
TASK, REWARD = ("body", "config", "task", "name"), ("body", "config", "rewards", 1, "name")
ENVIRONMENT = ("body", "config", "task", "params", "environment")


def loaded(*names: str) -> dict[str, Any]:
    """A worker's capabilities with ``names`` among its loaded plugins."""
    return {**SANDBOXED, "plugins": {"loaded": [{"name": n} for n in names], "failed": []}}


@pytest.fixture
def example_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example package loaded in this process (the API's) and the task-check helpers it
    starts (processes of their own): CONSPO_PLUGINS names it, and it is on their path."""
    plugins.reset()
    presets.cache_clear()  # the form's presets, read from the registries once per process
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLE), *sys.path]))
    monkeypatch.setenv(plugins.ENV_VAR, PLUGIN)
    yield
    monkeypatch.delenv(plugins.ENV_VAR)
    plugins.reset()
    presets.cache_clear()


def test_a_run_needs_a_live_worker_that_loaded_its_plugin(
    example_plugin: None, own_api: Api
) -> None:
    settings = own_api.settings
    config = tiny_config(1, **USES_PLUGIN)
    errors = errors_at(own_api.post("/api/runs", json={"config": config}))
    assert set(errors) == {TASK, REWARD}
    assert errors[TASK].startswith(
        f"task 'count_letter' comes from the plugin '{PLUGIN}', which no live worker has loaded"
        " (0 alive; /api/health lists each worker's plugins)"
    )
    assert errors[REWARD].startswith(f"reward 'brevity' comes from the plugin '{PLUGIN}'")
    errors = errors_at(own_api.post("/api/runs", json={"config": tiny_config(1, **PLAYS_PLUGIN)}))
    assert set(errors) == {TASK, ENVIRONMENT, REWARD}
    assert errors[ENVIRONMENT].startswith(f"environment 'nim' comes from the plugin '{PLUGIN}'")
    # A worker that loaded other plugins (or none) does not count.
    alive(settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=loaded("someone_else")))
    assert "(1 alive;" in errors_at(own_api.post("/api/runs", json={"config": config}))[TASK]
    # A built-in-only run is not held to it.
    assert own_api.post("/api/runs", json={"config": tiny_config(1)}).status_code == 201

    alive(settings, WorkerIdentity(host="cpu-2", pid=2, capabilities=loaded(PLUGIN)))
    health = own_api.get("/api/health").json()
    (mine,) = health["plugins"]["loaded"]
    assert mine["name"] == PLUGIN and mine["provides"] == {
        "environment": ["nim"],
        "reward": ["brevity", "few_turns"],
        "task": ["count_letter", "nim_games"],
    }
    assert health["plugins"]["failed"] == []
    workers = {w["host"]: w["capabilities"].get("plugins") for w in health["workers"]}
    assert workers["cpu-2"]["loaded"] == [{"name": PLUGIN}]

    presets = own_api.get("/api/presets").json()
    tasks = {t["name"]: t["plugin"] for t in presets["tasks"]}
    assert tasks["count_letter"] == PLUGIN and tasks["arith"] is None

    run = run_in_worker(own_api, config)  # the worker's code, with the plugin loaded here
    assert run["status"] == "succeeded", run["error"]
    assert run["task"] == "count_letter"
    keys = own_api.get(f"/api/runs/{run['id']}/metrics/keys").json()["keys"]
    assert "reward/brevity" in keys
    # the plugin's task, environment and reward in one run, played turn by turn
    played = run_in_worker(own_api, tiny_config(1, **PLAYS_PLUGIN))
    assert played["status"] == "succeeded", played["error"]
    assert played["task"] == "nim_games"
    keys = own_api.get(f"/api/runs/{played['id']}/metrics/keys").json()["keys"]
    assert {"reward/few_turns", "env/turns", "env/success", "time/env_s"} <= set(keys)
