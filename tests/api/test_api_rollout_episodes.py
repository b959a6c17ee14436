"""A sampled rollout's environment episode, from the trainer's record through the database sink to
``GET /api/runs/{id}/rollouts?text=true``, on SQLite and PostgreSQL: its turns in order, texts
clipped, a large ``info`` dropped, hostile text kept as written, and a lone surrogate (which no
database or JSON response takes) replaced rather than failing the write or the read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from backend.config import Settings
from backend.db import Database
from backend.storage.rollouts import query_rollouts
from backend.storage.writes import RolloutPoint, StepPoints, write_points
from conspo.environments.base import Episode, Turn
from conspo.sink import (
    EPISODE_INFO_CHARS,
    EPISODE_TEXT_CHARS,
    RolloutRecord,
    StepRecord,
    episode_json,
)
from tests.api.conftest import Api
from tests.api.test_api_db_sink import new_run
from worker.db_sink import DbSink

SCRIPT = "<script>alert(1)</script>"

WON = Episode(
    turns=(
        Turn(SCRIPT, "not a number \ud800: guess again", 0.0, False, 0.01, info={"hint": "\ud800"}),
        Turn("4", "4 is wrong: my number is higher.", 0.0, False, 0.02, info={"big": "x" * 2000}),
        Turn("6" * 3000, "6 is right!", 1.0, True, 0.03),
    ),
    first_observation=f"I am thinking of a number from 1 to 8. {SCRIPT}",
)
FAILED = Episode(
    turns=(Turn("3", "", 0.0, True, 0.5, error="step raised ValueError: <b>boom</b> \ud800"),),
    failure="step raised ValueError: <b>boom</b> \ud800",
    first_observation="I am thinking of a number from 1 to 8.\x00",  # NUL: JSON escapes it
)


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


def record(step: int, episodes: list[dict[str, Any] | None]) -> StepRecord:
    return StepRecord(
        step=step,
        total_steps=10,
        wall_time=1.7e9 + step,
        metrics={"optim/loss": 0.5},
        rollouts=[
            RolloutRecord(0, i, float(i == 0), -0.5, 7, False, "prompt", f"completion {i}", e)
            for i, e in enumerate(episodes)
        ],
    )


def rollouts(api: Api, run_id: int, **params: Any) -> list[dict[str, Any]]:
    r = api.get(f"/api/runs/{run_id}/rollouts", params=params)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def test_episode_json_clips_texts_drops_large_info_and_replaces_lone_surrogates() -> None:
    won = episode_json(WON)
    assert won["first_observation"] == WON.first_observation  # kept as written: it is text
    first, second, last = won["turns"]
    assert first["action"] == SCRIPT
    assert first["observation"] == "not a number \ufffd: guess again"
    assert first["info"] == {"hint": "\ufffd"} and first["info_dropped"] is False
    assert second["info"] == {} and second["info_dropped"] is True  # > EPISODE_INFO_CHARS
    assert len(last["action"]) == EPISODE_TEXT_CHARS and last["action"].endswith("…")
    assert (last["reward"], last["done"], won["succeeded"], won["total_reward"]) == (
        1.0,
        True,
        True,
        1.0,
    )
    assert won["turn_count"] == 3 and EPISODE_INFO_CHARS < 2000
    failed = episode_json(FAILED)
    assert (
        failed["failure"]
        == failed["turns"][0]["error"]
        == ("step raised ValueError: <b>boom</b> \ufffd")
    )
    assert failed["succeeded"] is False and failed["first_observation"].endswith("\x00")


def test_episodes_round_trip_from_the_sink_to_the_api(api: Api, db: Database) -> None:
    run_id = new_run(db)
    sink = DbSink(db, run_id, attempt=1)
    # Row 2 holds Episode.as_dict() as it is, lone surrogates and all (a producer that skipped
    # episode_json): the writer still stores what the database and a response take.
    raw = WON.as_dict()
    sink.log_step(record(1, [episode_json(WON), episode_json(FAILED), raw, None]))
    sink.flush()

    items = rollouts(api, run_id, text=True)
    assert [(r["step"], r["index"]) for r in items] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    won, failed, unclean, plain = (r["episode"] for r in items)
    assert won == episode_json(WON)
    assert [t["action"] for t in won["turns"]] == [SCRIPT, "4", "6" * 999 + "…"]
    assert [t["observation"] for t in won["turns"]] == [
        "not a number \ufffd: guess again",
        "4 is wrong: my number is higher.",
        "6 is right!",
    ]
    assert failed == episode_json(FAILED)
    assert failed["turns"][0]["error"].startswith("step raised ValueError: <b>boom</b>")
    assert unclean["turns"][0]["observation"] == "not a number \ufffd: guess again"
    assert unclean["turns"][0]["info"] == {"hint": "\ufffd"}
    assert plain is None  # a rollout that played no environment
    assert items[3]["completion"] == "completion 3"
    # without text=true a read carries no text and no episode
    assert all("episode" not in r for r in rollouts(api, run_id))

    # A re-emitted step (a resumed attempt) overwrites: the episode goes with its rollout.
    sink.log_step(record(1, [None, episode_json(WON)]))
    sink.flush()
    again = rollouts(api, run_id, text=True)
    assert again[0]["episode"] is None and again[1]["episode"] == episode_json(WON)
    assert again[2]["episode"] is not None  # not sent again: kept


def test_a_rollout_with_only_an_episode_is_stored(db: Database) -> None:
    """A rollout whose producer kept no prompt or completion text still keeps its episode."""
    run_id = new_run(db)
    point = RolloutPoint(
        step=1, group=0, index=0, reward=1.0, score=-0.1, length=3, truncated=False,
        episode=episode_json(WON),
    )  # fmt: skip
    with db.session() as s:
        write_points(s, run_id, [StepPoints(1, {"optim/loss": 1.0})], [point])
        s.commit()
    with db.session() as s:
        (item,) = query_rollouts(s, run_id, None, None, 10, text=True)
    assert item["prompt"] == item["completion"] == ""
    assert item["episode"] == episode_json(WON)
