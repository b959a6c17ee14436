"""Runs with tools over HTTP: a run that makes a worker execute model-written code is accepted
only while a live worker advertises a sandbox (422 at the field otherwise), a tool call's
timeout is capped by the platform's setting at submit and by the worker's own before training,
the tools section's bounds are 422s at their fields, the presets list the tools, and a worker
never keeps the library's opt-out of the sandbox. Both databases."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import liveness
from backend.config import Settings
from backend.db import Database
from backend.liveness import WorkerIdentity
from backend.models import Worker, utcnow
from conspo.registry import TOOLS
from conspo.tools.base import OBSERVATION_TEMPLATE
from tests.api.conftest import ROOT, Api, tiny_config

pytestmark = pytest.mark.services

PYTHON = {"tools": {"names": ["python"], "max_turns": 2}}
CALCULATOR: dict[str, Any] = {"names": ["calculator"]}
SANDBOXED = {"engines": ["native", "hf"], "flash_attn": False, "sandbox": "bwrap"}
UNSANDBOXED = {**SANDBOXED, "sandbox": "none"}
NAMES = ("body", "config", "tools", "names", 0)
TIMEOUT = ("body", "config", "tools", "timeout_s")


def alive(settings: Settings, me: WorkerIdentity, seen_ago_s: float = 0) -> None:
    db = Database(settings)
    with db.session() as session:
        liveness.mark_alive(session, me)
        if seen_ago_s:
            row = session.get(Worker, me.name)
            assert row is not None
            row.seen_at = utcnow() - timedelta(seconds=seen_ago_s)
            session.commit()
    db.dispose()


def errors_at(response: Any) -> dict[tuple[str | int, ...], str]:
    assert response.status_code == 422, response.text
    return {tuple(e["loc"]): e["msg"] for e in response.json()["detail"]}


def submit(api: Api, **extra: Any) -> Any:
    return api.post("/api/runs", json={"config": tiny_config(1, **extra)})


def test_the_presets_list_the_tools_and_the_observation_format(api: Api) -> None:
    body = api.get("/api/presets").json()
    tools = {t["name"]: t for t in body["tools"]}
    assert set(tools) == set(TOOLS.names())
    assert tools["python"]["tag"] == "code" and tools["python"]["sandboxed"] is True
    assert tools["calculator"]["tag"] == "calc" and tools["calculator"]["sandboxed"] is False
    assert all(t["description"] for t in tools.values())
    observation = body["tool_observation"]
    assert observation["before"] + "42" + observation["after"] == OBSERVATION_TEMPLATE.format(
        output="42"
    )
    assert body["tool_timeout_max_s"] == api.settings.sandbox_max_timeout_s == 30


def test_code_execution_without_a_live_sandbox_is_refused_at_the_field(own_api: Api) -> None:
    settings = own_api.settings
    # No worker at all: nothing could run it (as with a package no worker has).
    msg = errors_at(submit(own_api, **PYTHON))[NAMES]
    assert msg.startswith("tool 'python' runs model-written code; no live worker has a sandbox")
    assert "a sandbox (0 alive; /api/health lists what each has)" in msg and "bubblewrap" in msg
    # A worker without a sandbox, and one with a sandbox that stopped renewing its row.
    alive(settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=UNSANDBOXED))
    gone = WorkerIdentity(host="cpu-2", pid=2, capabilities=SANDBOXED)
    alive(settings, gone, seen_ago_s=settings.worker_alive_s + 5)
    tools = {"tools": {"names": ["calculator", "python"]}}
    errors = errors_at(submit(own_api, **tools))
    second = ("body", "config", "tools", "names", 1)
    assert set(errors) == {second}  # the calculator runs no code
    assert "(sandbox: none on each of the 1 alive;" in errors[second]
    # A clone asking for the tool is refused the same way, under its overrides.
    run_id = submit(own_api).json()["runs"][0]["id"]
    clone = own_api.post(f"/api/runs/{run_id}/clone", json={"overrides": {"tools": ["python"]}})
    assert "runs model-written code" in errors_at(clone)[("body", "overrides", "tools", "names", 0)]
    # A tool that runs no code needs no sandbox.
    assert submit(own_api, tools=["calculator"]).status_code == 201
    # A live worker with a sandbox makes it acceptable; the config is stored as submitted.
    alive(settings, WorkerIdentity(host="cpu-3", pid=3, capabilities=SANDBOXED))
    r = submit(own_api, **PYTHON)
    assert r.status_code == 201, r.text
    stored = own_api.get(f"/api/runs/{r.json()['runs'][0]['id']}").json()["config"]["tools"]
    assert stored["names"] == ["python"] and stored["max_turns"] == 2


def test_a_code_task_and_humaneval_need_a_sandbox_too(own_api: Api) -> None:
    code = {"task": {"name": "code", "eval_size": 2}}
    humaneval = {"eval": {"every": 0, "benchmarks": [{"name": "he", "source": "humaneval"}]}}
    errors = errors_at(submit(own_api, **code, **humaneval))
    task, benchmark = (
        ("body", "config", "task", "name"),
        ("body", "config", "eval", "benchmarks", 0, "source"),
    )
    assert set(errors) == {task, benchmark}
    assert errors[task].startswith("task 'code' runs model-written code")
    assert errors[benchmark].startswith("benchmark 'he' runs model-written code")
    alive(own_api.settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=SANDBOXED))
    r = submit(own_api, **code, **humaneval)  # a built-in benchmark names no file to check
    assert r.status_code == 201, r.text


def test_a_tool_timeout_above_the_platform_limit_is_refused(own_api: Api) -> None:
    alive(own_api.settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=SANDBOXED))
    cap = own_api.settings.sandbox_max_timeout_s
    over = {"tools": {"names": ["python"], "timeout_s": cap + 1}}
    msg = errors_at(submit(own_api, **over))[TIMEOUT]
    assert f"at most {cap:g} s on this platform (CONSPO_SANDBOX_MAX_TIMEOUT_S)" in msg
    at_cap = {"tools": {"names": ["python"], "timeout_s": cap}}
    assert submit(own_api, **at_cap).status_code == 201
    # The limit is the sandbox's: a tool that runs no code is not held to it.
    calculator = {"tools": {"names": ["calculator"], "timeout_s": cap + 1}}
    assert submit(own_api, **calculator).status_code == 201


def test_the_limit_is_a_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSPO_SANDBOX_MAX_TIMEOUT_S", "12.5")
    assert Settings().sandbox_max_timeout_s == 12.5
    monkeypatch.setenv("CONSPO_SANDBOX_MAX_TIMEOUT_S", "121")  # above the library's ceiling
    with pytest.raises(ValueError, match="sandbox_max_timeout_s"):
        Settings()


@pytest.mark.parametrize(
    ("tools", "loc", "words"),
    [
        ({"names": ["python"], "max_turns": 0}, ("max_turns",), "greater than or equal to 1"),
        ({"names": ["python"], "max_turns": 17}, ("max_turns",), "less than or equal to 16"),
        ({"names": ["python", "shell"]}, ("names", 1), "shell"),
        ({"names": ["python"], "timeout_s": 121}, ("timeout_s",), "less than or equal to 120"),
        ({"names": ["python"], "timeout_s": 0}, ("timeout_s",), "greater than 0"),
        (
            CALCULATOR | {"params": {"calculator": {"max_digits": 0}}},
            ("params", "calculator", "max_digits"),
            "greater than or equal to 1",
        ),
        (
            CALCULATOR | {"params": {"calculator": {"digits": 9}}},
            ("params", "calculator", "digits"),
            "Extra inputs",
        ),
        (CALCULATOR | {"params": {"python": {}}}, ("params", "python"), "not in tools.names"),
    ],  # fmt: skip
)
def test_the_tools_section_bounds_are_422s_at_their_fields(
    api: Api, tools: dict[str, Any], loc: tuple[str | int, ...], words: str
) -> None:
    errors = errors_at(submit(api, tools=tools))
    assert words in errors[("body", "config", "tools", *loc)], errors


def test_a_run_sets_a_tools_parameters_and_stores_them_resolved(api: Api) -> None:
    params = {"calculator": {"max_digits": 100}}
    r = submit(api, tools=CALCULATOR | {"params": params})
    assert r.status_code == 201, r.text
    stored = api.get(f"/api/runs/{r.json()['runs'][0]['id']}").json()["config"]["tools"]
    assert stored["params"] == {"calculator": {"max_digits": 100, "max_chars": 500}}


def test_an_unknown_tool_is_named_with_the_registered_ones(api: Api) -> None:
    msg = errors_at(submit(api, tools=["shell"]))[("body", "config", "tools", "names", 0)]
    assert "shell" in msg and all(name in msg for name in TOOLS.names())


def test_the_worker_refuses_a_timeout_over_its_own_limit(own_api: Api) -> None:
    """The API accepted the run (its limit is 30 s); the worker's own setting is lower: the run
    fails before anything loads, its error saying which limit."""
    from backend.runs.queue import JobQueue, make_celery
    from worker.tasks import execute_run

    alive(own_api.settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=SANDBOXED))
    r = submit(own_api, tools={"names": ["python"], "timeout_s": 20})
    assert r.status_code == 201, r.text
    run_id = r.json()["runs"][0]["id"]
    strict = own_api.settings.model_copy(update={"sandbox_max_timeout_s": 10.0})
    db = Database(strict)
    try:
        execute_run(db, JobQueue(make_celery(strict), strict.queue), strict, run_id)
    finally:
        db.dispose()
    run = own_api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "failed" and run["step"] == 0
    first = run["error"].split("\n", 1)[0]
    assert first == (
        "refused by this worker: tools.timeout_s: a tool call may run at most 10 s on this"
        " worker (CONSPO_SANDBOX_MAX_TIMEOUT_S); tools.timeout_s is 20"
    )


def test_a_worker_drops_the_unsandboxed_opt_in_at_start(tmp_path: Path) -> None:
    """What ``conspo-lab worker`` and ``celery -A worker.celery_app`` load first: the library's
    opt-in to run model code without a sandbox is gone from the worker's environment (and so
    from every training process it starts), with a warning."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CONSPO_DATA_DIR": str(tmp_path),
        "CONSPO_UNSAFE_LOCAL_CODE": "1",
    }
    code = "import os, worker.celery_app; print(repr(os.environ.get('CONSPO_UNSAFE_LOCAL_CODE')))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
    assert "CONSPO_UNSAFE_LOCAL_CODE was set" in done.stderr
    env.pop("CONSPO_UNSAFE_LOCAL_CODE")
    quiet = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert quiet.returncode == 0 and "CONSPO_UNSAFE_LOCAL_CODE" not in quiet.stderr
