"""GET /api/compare/rollouts: several runs' rollouts at one step, paired by prompt text.

Two external runs log the same prompts in swapped group order (and one prompt each that the
other lacks); the answer pairs them by text, names the missing partner, computes each group's
mean reward and score gap, filters the prompts the runs disagree on, stays within its row
bound, and refuses bad runs and steps at the parameter — on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from backend.db import Database
from backend.storage.writes import StepPoints, write_points
from backend.studies import rollouts_across
from conspo.sink import RolloutRecord
from tests.api.conftest import Api

URL = "/api/compare/rollouts"
HOSTILE = "<img src=x onerror=alert(1)>"


def group(step: int, g: int, prompt: str, rewards: list[float], scores: list[float]) -> list[dict]:
    return [
        {
            "step": step,
            "group": g,
            "index": i,
            "reward": r,
            "score": s,
            "length": 5 + i,
            "truncated": i == 3,
            "prompt": prompt,
            "completion": f"{prompt} → answer {i}",
        }  # fmt: skip
        for i, (r, s) in enumerate(zip(rewards, scores, strict=True))
    ]


def log(api: Api, run_id: int, rollouts: list[dict]) -> None:
    r = api.post(f"/api/runs/{run_id}/log", json={"steps": [], "rollouts": rollouts})
    assert r.status_code == 200, r.text


SOLVED = ([1.0, 0.0, 0.0, 1.0], [-0.5, -1.0, -1.2, -0.6])  # score gap -0.55 - (-1.1) = 0.55
UNSOLVED = ([0.0, 0.0, 0.0, 0.0], [-1.0, -1.1, -0.9, -1.0])


@pytest.fixture
def pair(api: Api) -> tuple[int, int]:
    """Run a: P0, P1, P2 in groups 0, 1, 2 at step 2; run b: P1, P0, P3 (swapped, P2 missing,
    P3 its own). Both sampled step 1; only a sampled step 3."""
    a, b = api.external(name="across-a")["id"], api.external(name="across-b")["id"]
    log(api, a, [
        *group(1, 0, "P0", *SOLVED),
        *group(2, 0, "P0", *SOLVED), *group(2, 1, "P1", *SOLVED), *group(2, 2, "P2", *SOLVED),
        *group(3, 0, "P0", *SOLVED),
    ])  # fmt: skip
    log(api, b, [
        *group(1, 0, "P0", *SOLVED),
        *group(2, 0, "P1", *SOLVED), *group(2, 1, "P0", *UNSOLVED), *group(2, 2, "P3", *SOLVED),
    ])  # fmt: skip
    return a, b


def across(api: Api, **params: Any) -> dict[str, Any]:
    r = api.get(URL, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def by_prompt(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["prompt"]: item for item in body["items"]}


def test_groups_are_paired_by_prompt_not_by_number(api: Api, pair: tuple[int, int]) -> None:
    a, b = pair
    body = across(api, runs=f"{a},{b}")
    assert body["step"] == 2  # the latest step both sampled (a alone sampled 3)
    assert body["steps"] == [1, 2] and body["steps_in_common"] == 2
    assert [r["id"] for r in body["runs"]] == [a, b]
    assert [(r["rollouts"], r["prompts"], r["cut"]) for r in body["runs"]] == [(12, 3, False)] * 2
    assert [item["prompt"] for item in body["items"]] == ["P0", "P1", "P2", "P3"]
    assert (body["prompts"], body["paired"], body["disagree"], body["left_out"]) == (4, 2, 1, 0)
    p0 = by_prompt(body)["P0"]
    assert p0["missing"] == [] and p0["disagree"] is True and len(p0["key"]) == 16
    col_a, col_b = p0["columns"]
    assert (col_a["run_id"], col_a["groups"], col_b["run_id"], col_b["groups"]) == (a, [0], b, [1])
    assert col_a["rollouts"][3] == {
        "group": 0, "index": 3, "reward": 1.0, "score": -0.6, "length": 8, "truncated": True,
        "completion": "P0 → answer 3", "episode": None, "critique": None,
    }  # fmt: skip
    assert {r["completion"] for r in col_b["rollouts"]} == {f"P0 → answer {i}" for i in range(4)}
    assert (col_a["n"], col_a["rewarded"], col_a["mean_reward"], col_a["solved"]) == (
        4,
        2,
        0.5,
        True,
    )
    assert col_a["score_gap"] == pytest.approx(0.55)
    assert (col_b["rewarded"], col_b["mean_reward"], col_b["solved"]) == (0, 0.0, False)
    assert col_b["score_gap"] is None  # no rewarded rollout: no gap
    p1 = by_prompt(body)["P1"]
    assert [c["groups"] for c in p1["columns"]] == [[1], [0]] and p1["disagree"] is False


def test_a_prompt_without_a_partner_says_which_run_lacks_it(
    api: Api, pair: tuple[int, int]
) -> None:
    a, b = pair
    items = by_prompt(across(api, runs=f"{a},{b}", step=2))
    assert items["P2"]["missing"] == [b] and items["P3"]["missing"] == [a]
    lacking = items["P2"]["columns"][1]
    assert (lacking["groups"], lacking["n"], lacking["rollouts"], lacking["solved"]) == (
        [], 0, [], None,
    )  # fmt: skip
    assert items["P2"]["disagree"] is False  # one run's group alone is no disagreement


def test_only_the_prompts_the_runs_disagree_on(api: Api, pair: tuple[int, int]) -> None:
    a, b = pair
    body = across(api, runs=f"{a},{b}", disagree="true")
    assert [item["prompt"] for item in body["items"]] == ["P0"]
    assert (body["prompts"], body["disagree"], body["left_out"]) == (4, 1, 0)
    assert across(api, runs=f"{a},{b}", step=1, disagree="true")["items"] == []


def test_the_answer_is_bounded_in_rows_by_whole_prompts(
    api: Api, pair: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    monkeypatch.setattr(rollouts_across, "MAX_ROWS", 10)
    body = across(api, runs=f"{a},{b}")
    assert [item["prompt"] for item in body["items"]] == ["P0"]  # 8 rows; P1 would make 16
    assert body["left_out"] == 3 and body["prompts"] == 4 and body["limits"]["rows"] == 10
    monkeypatch.setattr(rollouts_across, "MAX_ROWS", 1)  # one prompt even over the bound
    assert len(across(api, runs=f"{a},{b}")["items"]) == 1
    monkeypatch.setattr(rollouts_across, "MAX_ROWS", 1024)
    monkeypatch.setattr(rollouts_across, "MAX_TEXT_CHARS", 150)  # P0 and P1: 2 + 8 × 13 each
    body = across(api, runs=f"{a},{b}")
    assert [item["prompt"] for item in body["items"]] == ["P0"] and body["left_out"] == 3


def test_texts_are_as_stored_and_a_group_without_a_prompt_is_unpaired(
    api: Api, pair: tuple[int, int]
) -> None:
    a, _ = pair
    c = api.external(name="across-c")["id"]
    rows = group(2, 0, "P0", *SOLVED)
    rows[1]["completion"] = HOSTILE
    log(api, c, [*rows, *[{**r, "group": 5, "prompt": "", "completion": ""} for r in rows]])
    body = across(api, runs=f"{a},{c}")
    p0 = by_prompt(body)["P0"]
    assert p0["columns"][1]["rollouts"][1]["completion"] == HOSTILE
    unpaired = [item for item in body["items"] if item["key"] is None]
    assert len(unpaired) == 1 and unpaired[0]["missing"] == [a]
    assert unpaired[0]["columns"][1]["groups"] == [5]
    assert {r["completion"] for r in unpaired[0]["columns"][1]["rollouts"]} == {""}


def test_bad_runs_and_steps_are_refused_at_the_parameter(api: Api, pair: tuple[int, int]) -> None:
    a, b = pair
    missing = 2_000_000_000
    r = api.get(URL, params={"runs": f"{a},{missing}"})
    assert r.status_code == 404 and str(missing) in r.json()["detail"], r.text

    def refused(params: dict[str, Any], field: str) -> str:
        r = api.get(URL, params=params)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["query", field], r.text
        return str(detail["msg"])

    refused({}, "runs")
    refused({"runs": "x"}, "runs")
    refused({"runs": ",".join(str(a) for _ in range(9))}, "runs")  # repeats count
    assert "limit is 8" in refused({"runs": ",".join(map(str, range(1, 10)))}, "runs")
    refused({"runs": f"{a},{b}", "step": -1}, "step")
    assert "nearest they all sampled: 2 (" in refused({"runs": f"{a},{b}", "step": 3}, "step")
    assert "nearest they all sampled: 1 (" in refused({"runs": f"{a},{b}", "step": 0}, "step")
    nothing = api.external(name="across-empty")["id"]
    assert f"run(s) {nothing} sampled no rollouts" in refused({"runs": f"{a},{nothing}"}, "runs")
    late = api.external(name="across-late")["id"]
    log(api, late, group(7, 0, "P0", *SOLVED))
    said = refused({"runs": f"{a},{late}"}, "runs")
    assert "no step in common" in said and f"run {late}: steps 7–7" in said


def test_a_judges_critique_and_an_episode_come_with_their_rollout(
    api: Api, pair: tuple[int, int]
) -> None:
    """Written as the worker's sink writes them (the logging endpoint takes neither)."""
    a, _ = pair
    c = api.external(name="across-judged")["id"]
    episode = {
        "first_observation": "board", "turns": [], "final_reward": 1.0, "failure": None,
        "truncated": False, "turn_count": 0, "total_reward": 1.0, "succeeded": True,
    }  # fmt: skip
    records = [
        RolloutRecord(0, 0, 1.0, -0.5, 3, False, "P0", "7", critique=HOSTILE),
        RolloutRecord(0, 1, 0.0, -0.9, 3, False, "P0", "8", episode=episode),
    ]
    db = Database(api.settings)
    try:
        with db.session() as session:
            write_points(session, c, [StepPoints(2, {}, rollouts=records)])
            session.commit()
    finally:
        db.dispose()
    p0 = by_prompt(across(api, runs=f"{a},{c}"))["P0"]
    judged, played = p0["columns"][1]["rollouts"]
    assert (judged["critique"], judged["episode"]) == (HOSTILE, None)
    assert (played["critique"], played["episode"]["first_observation"]) == (None, "board")
    assert p0["columns"][1]["score_gap"] == pytest.approx(0.4)
