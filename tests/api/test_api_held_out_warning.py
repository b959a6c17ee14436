"""A held-out split too small to measure with is said at submit, not refused: the submit (and a
clone) answers with it in ``warnings``, and the estimate the form asks as you type says it in
its task check (``backend.runs.submit.warnings``). A 50-line JSONL holds a handful of held-out
problems by the hash split; a procedural task whose problem space is tiny, likewise."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from backend.runs.submit import MIN_HELD_OUT
from conspo.tasks.base import Example
from conspo.tasks.jsonl import split_rows
from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services


def rows(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(start, start + n)]


def held_out_of(found: list[dict[str, str]]) -> int:
    """How many the task's own hash split holds out of ``found``."""
    return len(split_rows([Example(r["prompt"], r["answer"]) for r in found])[1])


@pytest.fixture
def files(api: Api) -> dict[str, str]:
    """JSONL files of this test inside the API's default data root: 50 lines, 2,000 lines, and
    held-out files of 10 and 40 problems."""
    mine = f"held-{uuid.uuid4().hex[:8]}"
    root = api.settings.data_dir / "datasets" / mine
    root.mkdir(parents=True)
    sizes = {"small": rows(50), "big": rows(2000), "eval10": rows(10, 10_000)}
    sizes["eval40"] = rows(40, 10_000)
    for name, found in sizes.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in found))
    return {name: f"{mine}/{name}.jsonl" for name in sizes}


def jsonl(path: str, eval_size: int | None = None, **params: Any) -> dict[str, Any]:
    task: dict[str, Any] = {"name": "jsonl", "params": {"path": path, **params}}
    if eval_size is not None:
        task["eval_size"] = eval_size
    return tiny_config(1, task=task)


def warnings_of(api: Api, config: dict[str, Any]) -> list[str]:
    r = api.post("/api/runs", json={"config": config})
    assert r.status_code == 201, r.text
    return list(r.json()["warnings"])


def test_a_50_line_jsonl_is_warned_of_at_submit_and_in_the_estimate(
    api: Api, files: dict[str, str]
) -> None:
    held = held_out_of(rows(50))
    assert 0 < held < MIN_HELD_OUT
    r = api.post("/api/runs", json={"config": jsonl(files["small"])})
    assert r.status_code == 201, r.text
    (warning,) = r.json()["warnings"]
    assert f"held-out split: {held} problem" in warning and f"under {MIN_HELD_OUT}" in warning
    assert "eval_path" in warning
    # what the form shows as you type: the estimate's task check (with a token)
    report = api.post("/api/runs/estimate", user="alice", json={"config": jsonl(files["small"])})
    assert report.status_code == 200, report.text
    check = report.json()["task"]
    assert check["text"] == warning and check["held_out"] == held and not check["refused"]
    # a clone of that run says it again
    run_id = r.json()["runs"][0]["id"]
    r = api.post(f"/api/runs/{run_id}/clone", json={"overrides": {}})
    assert r.status_code == 201 and r.json()["warnings"] == [warning], r.text


def test_enough_held_out_problems_or_a_small_eval_size_asked_for_are_not_warned_of(
    api: Api, files: dict[str, str]
) -> None:
    assert warnings_of(api, jsonl(files["big"])) == []
    assert warnings_of(api, jsonl(files["small"], eval_path=files["eval40"])) == []
    # the run scores as many as it asked for: its own choice, not the task's shortfall
    assert warnings_of(api, jsonl(files["small"], eval_size=2)) == []
    (warning,) = warnings_of(api, jsonl(files["big"], eval_path=files["eval10"]))
    assert "held-out split: 10 problems" in warning
    report = api.post("/api/runs/estimate", user="alice", json={"config": jsonl(files["big"])})
    assert report.json()["task"] is None  # nothing to say of it


def test_a_procedural_task_with_a_tiny_problem_space_is_warned_of_too(api: Api) -> None:
    """One-digit sums of two terms: 100 problems in all, a few of them held out."""
    task = {"name": "arith", "params": {"digits": 1, "operators": "+", "num_operands": 2}}
    (warning,) = warnings_of(api, tiny_config(1, task=task))
    assert f"under {MIN_HELD_OUT}" in warning
    config = tiny_config(1, task=task)
    report = api.post("/api/runs/estimate", user="alice", json={"config": config}).json()
    assert report["task"]["text"] == warning and report["task"]["held_out"] < MIN_HELD_OUT
