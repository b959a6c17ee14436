"""A run whose reward is a generative judge (the ``judge`` reward): the judge it names comes from
the same places as ``model.name``, refused at submit with a 422 at its field; and each sampled
rollout's critique goes from the trainer's record through the database sink to
``GET /api/runs/{id}/rollouts?text=true``, on SQLite and PostgreSQL (clipped, hostile text kept
as written, a lone surrogate replaced, absent without text=true)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from backend.config import Settings
from backend.db import Database
from conspo.sink import ROLLOUT_TEXT_CHARS, RolloutRecord, StepRecord
from tests.api.conftest import Api, tiny_config
from tests.api.test_api_db_sink import new_run
from worker.db_sink import DbSink

LOC = ["body", "config", "rewards", 1, "params", "model"]
SCRIPT = "<script>alert(1)</script> Score: 7"


def with_judge(name: str) -> dict[str, Any]:
    rewards = [{"name": "verifier"}, {"name": "judge", "params": {"model": name}}]
    return tiny_config(2, rewards=rewards)


def test_a_judge_the_sources_refuse_is_a_422_at_its_field(api: Api) -> None:
    for name in ("/no/such/judge", "Qwen/Qwen2.5-0.5B-Instruct"):
        r = api.post("/api/runs", json={"config": with_judge(name)})
        assert r.status_code == 422, r.text
        [found] = [d for d in r.json()["detail"] if d["loc"] == LOC]
        assert found["msg"].startswith(f"rewards[1].params.model {name!r} is not available here")
    # a built-in causal LM is one the sources give
    r = api.post("/api/runs", json={"config": with_judge("tiny-chat")})
    assert r.status_code == 201, r.text


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


def record(step: int, critiques: list[str | None]) -> StepRecord:
    return StepRecord(
        step=step,
        total_steps=10,
        wall_time=1.7e9 + step,
        metrics={"optim/loss": 0.5},
        rollouts=[
            RolloutRecord(0, i, 1.0, -0.5, 7, False, "prompt", f"completion {i}", critique=c)
            for i, c in enumerate(critiques)
        ],
    )


def rollouts(api: Api, run_id: int, **params: Any) -> list[dict[str, Any]]:
    r = api.get(f"/api/runs/{run_id}/rollouts", params=params)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def test_critiques_round_trip_from_the_sink_to_the_api(api: Api, db: Database) -> None:
    run_id = new_run(db)
    sink = DbSink(db, run_id, attempt=1)
    long = "x" * (ROLLOUT_TEXT_CHARS + 500)  # a producer that did not clip
    sink.log_step(record(1, [SCRIPT, None, long, "bad \ud800 Score: 3"]))
    sink.flush()

    items = rollouts(api, run_id, text=True)
    assert [r["critique"] for r in items] == [
        SCRIPT,
        None,
        "x" * (ROLLOUT_TEXT_CHARS - 1) + "…",
        "bad \ufffd Score: 3",
    ]
    assert items[1]["completion"] == "completion 1"
    assert all("critique" not in r for r in rollouts(api, run_id))  # only with text=true

    # A re-emitted step (a resumed attempt) overwrites: the critique goes with its rollout.
    sink.log_step(record(1, [None, "Score: 9"]))
    sink.flush()
    again = rollouts(api, run_id, text=True)
    assert [r["critique"] for r in again[:3]] == [None, "Score: 9", items[2]["critique"]]
