"""Real Celery worker processes: end to end, cancel, and kill -9 mid-run with resume.

Cluster mode (PostgreSQL + Redis) and embedded mode (SQLite + kombu's SQLAlchemy transport) each
get a worker subprocess running ``conspo-lab worker`` on the tiny model; the end-to-end one
has the example plugin (examples/plugins/) loaded by the worker and trains its task and reward.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.db import Database
from backend.main import create_app
from backend.migrate import migrate
from backend.models import Metric, RolloutStep
from conspo import metrics as M
from conspo import plugins
from conspo_lab.client import Run
from tests.api.conftest import (
    Api,
    create_pg_database,
    drop_pg_database,
    make_settings,
    make_tokens,
    tiny_config,
    wait_for,
)
from tests.api.test_api_plugins import (  # noqa: F401
    EXAMPLE,
    PLAYS_PLUGIN,
    PLUGIN,
    USES_PLUGIN,
    example_plugin,
)

pytestmark = [pytest.mark.slow, pytest.mark.services]

FINISHED = {"succeeded", "failed", "cancelled"}


def mode_api(mode: str, tmp: Path, request: pytest.FixtureRequest) -> Api:
    if mode == "cluster":
        # A database of the test's own: the session's holds runs other tests left "running",
        # which this worker's reaper would re-queue and train ahead of the test's run.
        db, broker = create_pg_database(), request.getfixturevalue("redis_url")
        request.addfinalizer(lambda: drop_pg_database(db))
    else:
        db, broker = f"sqlite:///{tmp / 'conspo.db'}", f"sqla+sqlite:///{tmp / 'broker.db'}"
    migrate(db)
    settings = make_settings(tmp, db, broker)
    client = TestClient(create_app(settings))
    return Api(client, settings, make_tokens(settings))


def submit(api: Api, config: dict[str, Any]) -> int:
    r = api.post("/api/runs", json={"config": config})
    assert r.status_code == 201, r.text
    return r.json()["runs"][0]["id"]


def run_state(api: Api, run_id: int) -> dict[str, Any]:
    return api.get(f"/api/runs/{run_id}").json()


def finished(api: Api, run_id: int, timeout: float, wp: Any) -> dict[str, Any]:
    try:
        return wait_for(
            lambda: (s := run_state(api, run_id))["status"] in FINISHED and s, timeout, "run end"
        )
    except AssertionError:
        pytest.fail(f"run {run_id} did not finish: {run_state(api, run_id)}\n{wp.tail()}")


def assert_steps_once(api: Api, run_id: int, n: int) -> None:
    db = Database(api.settings)
    with db.session() as s:
        steps = s.scalars(
            select(Metric.step).where(Metric.run_id == run_id, Metric.key == M.LOSS)
        ).all()
        assert sorted(steps) == list(range(1, n + 1))
        per_step = s.execute(
            select(RolloutStep.step, RolloutStep.group, RolloutStep.index).where(
                RolloutStep.run_id == run_id
            )
        ).all()
        assert sorted(r[0] for r in per_step) == list(range(1, n + 1))  # a row per step, once
        for _, groups, indices in per_step:  # no rollout twice within its step
            assert len(set(zip(groups, indices, strict=True))) == len(groups)
        assert len({len(r[1]) for r in per_step}) == 1  # the same sample size every step
    db.dispose()


@pytest.mark.parametrize("mode", ["cluster", "embedded"])
def test_worker_runs_a_job_end_to_end_and_cancels(
    mode: str, tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    request.getfixturevalue("example_plugin")  # the API process (this one) loads it
    api = mode_api(mode, tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.env |= {
        plugins.ENV_VAR: PLUGIN,
        "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{wp.env['PYTHONPATH']}",
    }
    wp.start()
    run_id = submit(api, tiny_config(4, checkpoint_every=2))
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["step"] == 4 and run["attempt"] == 1 and run["device"] == "cpu"
    assert run["worker_host"] and run["started_at"] <= run["finished_at"]
    assert M.LOSS in run["summary"] and "sep/gap" in run["summary"]
    assert_steps_once(api, run_id, 4)
    assert (api.settings.run_dir(run_id) / "checkpoints").is_dir()

    # A user's own task and reward (the example plugin, which the worker loaded too).
    plugin_run = finished(api, submit(api, tiny_config(1, **USES_PLUGIN)), 300, wp)
    assert plugin_run["status"] == "succeeded", plugin_run["error"]
    assert plugin_run["task"] == "count_letter" and "reward/brevity" in plugin_run["summary"]
    # and its environment, played turn by turn in the worker
    env_run = finished(api, submit(api, tiny_config(1, **PLAYS_PLUGIN)), 300, wp)
    assert env_run["status"] == "succeeded", env_run["error"]
    assert {"env/turns", "reward/few_turns"} <= set(env_run["summary"])

    long_id = submit(api, tiny_config(400))
    wait_for(lambda: run_state(api, long_id)["step"] >= 2, 300, "two steps")
    cancelled = api.post(f"/api/runs/{long_id}/cancel").json()
    assert cancelled["cancel_requested"] is True
    run = finished(api, long_id, 120, wp)
    assert run["status"] == "cancelled" and run["step"] < 400
    api.client.close()


def test_kill9_mid_run_then_a_new_worker_resumes(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    """Embedded mode: the killed worker's message is gone; the reaper re-queues the stale run."""
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    first = wp.start()
    n = 16
    run_id = submit(api, tiny_config(n, checkpoint_every=3))
    wait_for(lambda: run_state(api, run_id)["step"] >= 5, 300, "a step after a checkpoint")
    wp.kill9(first)
    at_kill = run_state(api, run_id)
    assert at_kill["status"] == "running" and at_kill["step"] < n
    wp.start()
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 2 and run["step"] == n
    assert_steps_once(api, run_id, n)
    # where it picked up, for the run page and `conspo-lab runs` (issue 37 item 3)
    resumed = run["resumed_from_step"]
    assert resumed is not None and resumed % 3 == 0 and 3 <= resumed <= at_kill["step"], run
    assert run["worker_deaths"] == 1
    said = Run.model_validate(run).attempts_text
    assert said == f"attempt 2 · 1 worker death · resumed from step {resumed}", said
    api.client.close()


def test_an_interrupted_run_resumes_before_a_later_queued_one(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    """Issue 37: the restarted worker ran a later queued run first, the interrupted one waited
    behind it (its job was sent again, to the back of the queue)."""
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    first = wp.start()
    n = 16
    interrupted = submit(api, tiny_config(n, checkpoint_every=3))
    wait_for(lambda: run_state(api, interrupted)["step"] >= 4, 300, "a step after a checkpoint")
    later = submit(api, tiny_config(4))  # queued behind it: its job is sent now
    wp.kill9(first)
    # the reaper of the next worker re-queues the interrupted run: its job goes after `later`'s
    wp.start()
    a = finished(api, interrupted, 300, wp)
    b = finished(api, later, 300, wp)
    assert a["status"] == b["status"] == "succeeded", (a["error"], b["error"])
    assert a["attempt"] == 2 and b["attempt"] == 1
    assert a["finished_at"] <= b["started_at"], (a, b)  # one worker: it ran first, whole
    assert "was interrupted and waits; it resumes first" in wp.tail(400)
    api.client.close()
