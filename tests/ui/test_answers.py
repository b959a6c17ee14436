"""The answers view in a real Chromium: two real runs (GRPO and ConSPO, one seed) trained and
evaluated by the server's worker, their held-out problems side by side, a problem's answers and
history opened, the filters and the pair's McNemar line as the API computes them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conspo_lab.cli import app
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser


def trained(ui_server: Any, algorithm: str) -> int:
    config = {
        "name": f"ui-answers-{algorithm}-{uuid.uuid4().hex[:6]}", "algorithm": algorithm,
        "steps": 1, "model": {"name": "tiny-arith"}, "task": {"name": "arith", "eval_size": 6},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "eval": {"every": 1, "at_start": True, "pass_k": 2}, "checkpoint": {"every": 0},
    }  # fmt: skip
    made = ui_server.api("POST", "/api/runs", json={"config": config})
    return int(made["runs"][0]["id"])


def test_two_runs_answers_side_by_side(
    page: Any, shot: Any, ui_server: Any, tmp_path: Path
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs the server's worker to train the runs")
    ids = [trained(ui_server, "grpo"), trained(ui_server, "conspo")]
    status = lambda i: ui_server.api("GET", f"/api/runs/{i}")["status"]  # noqa: E731
    wait_until(page, lambda: all(status(i) in {"succeeded", "failed"} for i in ids), 600, "runs")
    assert [status(i) for i in ids] == ["succeeded", "succeeded"]
    api = ui_server.api("GET", f"/api/answers?runs={ids[0]},{ids[1]}&limit=500")
    (pair,) = api["pairs"]

    page.goto(f"{ui_server.url}/compare?runs={ids[0]},{ids[1]}")
    link = page.wait_for_selector("#answers-link:not([hidden])")
    page.goto(ui_server.url + link.get_attribute("href").replace("show=disagree", "show=all"))
    page.wait_for_selector("#ans-body tr.ans-row")
    assert page.locator("#ans-body tr.ans-row").count() == 6
    summary = page.inner_text("#ans-summary")
    assert f"#{ids[0]} alone: {pair['a_only']}" in summary
    assert f"McNemar p = {pair['mcnemar_p']:.3g}" in summary
    solved = sum(p["answers"][str(ids[0])]["solved"] for p in api["problems"])
    assert f"{solved} of 6 solved at step 1" in summary

    page.click("#ans-body tr.ans-row >> nth=0")
    detail = page.wait_for_selector("tr.ans-detail")
    assert detail.inner_text().count("Reference:") == 1 and "Problem:" in detail.inner_text()
    assert page.locator("tr.ans-detail .ans-answer").count() == 2
    page.click("tr.ans-detail button")
    wait_until(page, lambda: "0:" in page.inner_text("tr.ans-detail .ans-history"), 60, "history")
    assert "1:" in page.inner_text("tr.ans-detail .ans-history")
    shot(page, "answers")

    page.select_option("#ans-show", "disagree")
    wait_until(page, lambda: "show=disagree" in page.url, 60, "the filter")
    expected = pair["a_only"] + pair["b_only"]
    wait_until(
        page,
        lambda: (
            page.locator("#ans-body tr.ans-row").count() == expected
            and f"{expected} of 6 problems" in page.inner_text("#ans-counts")
        ),
        60,
        "the disagreeing problems",
    )
    page.select_option("#ans-step", "first")
    wait_until(page, lambda: "at step 0" in page.inner_text("#ans-summary"), 60, "step 0")

    # the same from the command line: the comparison, and the answers exported with the run
    auth = ["--url", ui_server.url, "--token", ui_server.token]
    shown = CliRunner().invoke(app, ["answers", f"{ids[0]},{ids[1]}", "--show", "all", *auth])
    assert shown.exit_code == 0, shown.output
    assert f"alone: {pair['a_only']}" in " ".join(shown.output.split())
    out = tmp_path / "answers.parquet"
    exported = CliRunner().invoke(
        app, ["export", str(ids[0]), "--answers", "--format", "parquet", "--out", str(out), *auth]
    )
    assert exported.exit_code == 0, exported.output
    table = pq.read_table(out).to_pylist()
    assert len(table) == 12 and {r["step"] for r in table} == {0, 1}  # 6 problems, 2 evaluations
    last = [r for r in table if r["step"] == 1]
    assert sum(r["solved"] for r in last) == solved and all(r["answer"] is not None for r in last)
