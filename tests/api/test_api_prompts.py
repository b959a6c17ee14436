"""Per-prompt pass rates: stored with their step (SQLite and PostgreSQL), overwritten when a
step is re-emitted, logged by external runs within bounds, and read back as pass-rate bands and
learned / forgotten / never-solved / always-solved counts per step."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from backend.config import Settings
from backend.db import Database
from backend.models import PromptStat
from conspo import metrics as M
from conspo.sink import PromptRecord
from tests.api.conftest import Api, run_in_worker, tiny_config
from tests.api.test_api_db_sink import new_run, record, stored
from worker.db_sink import DbSink


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


def stored_prompts(db: Database, run_id: int) -> dict[tuple[int, str], tuple[int, int]]:
    with db.session() as s:
        rows = s.execute(
            select(PromptStat.step, PromptStat.prompt_key, PromptStat.n, PromptStat.correct).where(
                PromptStat.run_id == run_id
            )
        )
        return {(step, key): (n, c) for step, key, n, c in rows}


def with_prompts(step: int, counts: dict[str, int], scale: float = 1.0):  # type: ignore[no-untyped-def]
    rec = record(step, scale)
    rec.prompts = [PromptRecord(key, 4, c) for key, c in counts.items()]
    return rec


def test_sink_writes_prompts_with_their_step_and_a_reemitted_step_overwrites(db: Database) -> None:
    run_id = new_run(db)
    sink = DbSink(db, run_id, attempt=1, max_delay_s=1e9)
    sink.log_step(with_prompts(1, {"aa": 0, "bb": 4}))
    sink.log_step(with_prompts(2, {"aa": 1}))
    assert stored_prompts(db, run_id) == {}  # buffered with the step's metrics
    sink.flush()
    assert stored_prompts(db, run_id) == {(1, "aa"): (4, 0), (1, "bb"): (4, 4), (2, "aa"): (4, 1)}
    # A resumed run re-emits step 2 (other counts, one more prompt) and goes on.
    sink.log_step(with_prompts(2, {"aa": 3, "cc": 2}))
    sink.log_step(with_prompts(3, {"bb": 2}))
    sink.flush()
    assert stored_prompts(db, run_id) == {
        (1, "aa"): (4, 0), (1, "bb"): (4, 4), (2, "aa"): (4, 3), (2, "cc"): (4, 2),
        (3, "bb"): (4, 2),
    }  # fmt: skip


def test_a_failed_prompt_write_loses_the_whole_batch_not_half(db: Database) -> None:
    run_id = new_run(db)
    sink = DbSink(db, run_id, attempt=1, max_delay_s=1e9)
    bad = with_prompts(1, {"aa": 1})
    bad.prompts.append(PromptRecord("bb", None, 0))  # type: ignore[arg-type]  # NOT NULL fails
    sink.log_step(bad)
    # SQLAlchemy's IntegrityError on SQLite, psycopg's NotNullViolation (raw cursor) on PostgreSQL
    with pytest.raises(Exception, match="(?i)not.null|null value"):
        sink.flush()
    points, rollouts = stored(db, run_id)
    assert points == {} and rollouts == [] and stored_prompts(db, run_id) == {}


# Four prompts over four steps (correct of 4 rollouts); what each count must be is worked out
# by hand in EXPECTED.
LOGGED = {
    1: {"A": 0, "B": 4, "D": 1},
    2: {"A": 1, "B": 4, "C": 0},
    3: {"A": 2, "B": 1, "D": 1},
    4: {"A": 4, "C": 0},
}
EXPECTED = {
    "steps": [1, 2, 3, 4],
    "zero": [1, 1, 0, 1],  # A at 1, C at 2 and 4
    "low": [1, 1, 2, 0],  # D at 1; A at 2; B and D at 3
    "high": [0, 0, 1, 0],  # A at 3 (2 of 4)
    "one": [1, 1, 0, 1],  # B at 1, 2; A at 4
    "learned": [0, 0, 1, 1],  # A: 0 at first, ≥ 0.5 from step 3
    "forgotten": [0, 0, 1, 1],  # B: 1 at first, 0.25 at step 3 (still its latest at 4)
    "never_solved": [1, 1, 1, 1],  # A at step 1 only; C from step 2
    "always_solved": [1, 1, 0, 0],  # B until step 3
    "seen": [3, 4, 4, 4],
    "next_step_min": None,
}


def prompt_log(logged: dict[int, dict[str, int]]) -> list[dict]:  # type: ignore[type-arg]
    return [
        {"step": step, "key": key, "n": 4, "correct": c}
        for step, counts in logged.items()
        for key, c in counts.items()
    ]


def test_bands_and_fates_per_step_with_pages(api: Api) -> None:
    run = api.external()
    url = f"/api/runs/{run['id']}/prompts"
    assert api.get(url).json() == {k: ([] if k != "next_step_min" else None) for k in EXPECTED}
    body = {"steps": [{"step": 4, "metrics": {"a": 1.0}}], "prompts": prompt_log(LOGGED)}
    for _ in range(2):  # a retried call overwrites
        r = api.post(f"/api/runs/{run['id']}/log", json=body)
        assert r.status_code == 200 and r.json() == {"written": 1 + 11}
    assert api.get(url).json() == EXPECTED
    # A page from step 2: the fates still count the prompts seen at step 1.
    page = api.get(url, params={"step_min": 2, "max_steps": 2}).json()
    assert page["steps"] == [2, 3] and page["next_step_min"] == 4
    assert page["never_solved"] == [1, 1] and page["always_solved"] == [1, 0]
    assert api.get(url, params={"step_max": 2}).json()["steps"] == [1, 2]
    assert api.delete(f"/api/runs/{run['id']}").status_code == 204
    db = Database(api.settings)
    try:
        assert stored_prompts(db, run["id"]) == {}
    finally:
        db.dispose()


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"step": 1, "key": "A", "n": 4, "correct": 5}, "correct"),
        ({"step": 1, "key": "a b", "n": 4, "correct": 1}, "key"),
        ({"step": 1, "key": "A", "n": 0, "correct": 0}, "n"),
        ({"step": -1, "key": "A", "n": 4, "correct": 0}, "step"),
    ],
)
def test_external_prompt_rows_are_checked(api: Api, row: dict, field: str) -> None:  # type: ignore[type-arg]
    run = api.external()
    r = api.post(f"/api/runs/{run['id']}/log", json={"prompts": [row]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][-1] == field


def test_external_runs_send_at_most_10000_prompt_rows_per_call(api: Api) -> None:
    run = api.external()
    rows = [{"step": 1, "key": f"p{i}", "n": 1, "correct": 0} for i in range(10_001)]
    r = api.post(f"/api/runs/{run['id']}/log", json={"prompts": rows})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "prompts"
    with Database(api.settings).session() as s:
        count = s.scalar(select(func.count()).where(PromptStat.run_id == run["id"]))
    assert count == 0


def test_a_worker_run_stores_every_prompt_of_every_step(own_api: Api) -> None:
    config = tiny_config(2)
    run = run_in_worker(own_api, config)
    assert run["status"] == "succeeded", run["error"]
    view = own_api.get(f"/api/runs/{run['id']}/prompts").json()
    assert view["steps"] == [1, 2]
    prompts_per_step = config["sampling"]["prompts_per_step"]
    for i in range(2):  # each step's prompts fall in exactly one band (repeats count once)
        in_bands = sum(view[band][i] for band in ("zero", "low", "high", "one"))
        assert 1 <= in_bands <= prompts_per_step
    keys = own_api.get(f"/api/runs/{run['id']}/metrics/keys").json()["keys"]
    assert {M.ENTROPY_POS, M.ENTROPY_NEG} <= set(keys)
