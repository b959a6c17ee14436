"""A study of 2 arms × 3 seeds run by the real worker, its page in Chromium (the verdict line,
the per-arm table with n = 3), and its HTML report opened from disk with every request
recorded: it makes none."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import offline_report

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "model": {"name": "tiny"},
    "steps": 2,
    "task": {"eval_size": 4},
    "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
    "eval": {"every": 1, "pass_k": 1},
    "checkpoint": {"every": 0},
}


def wait_for_study(ui_server: Any, study_id: int, timeout: float = 400.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = ui_server.api("GET", f"/api/studies/{study_id}?curves=false")
        if view["status"] != "active":
            return view
        time.sleep(1.0)
    raise AssertionError(f"study {study_id} still active after {timeout}s: {view.get('counts')}")


def test_study_page_and_offline_report(
    page: Any, ui_server: Any, browser: Any, tmp_path: Path, shot: Any
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs the server's worker")
    body = {
        "name": "ui-study",
        "config": TINY,
        "arms": [
            {"name": "grpo", "overrides": {"algorithm": "grpo"}},
            {"name": "conspo", "overrides": {"algorithm": "conspo", "params.tau": 1.0}},
        ],
        "seeds": [0, 1, 2],
        "objective": {"metric": "eval/accuracy", "reduce": "mean_last_k", "k": 2},
        "baseline": "grpo",
        "concurrency": 2,
    }
    study = ui_server.api("POST", "/api/studies", json=body)
    view = wait_for_study(ui_server, study["id"])
    assert view["status"] == "done" and view["counts"] == {"succeeded": 6}

    page.goto(f"{ui_server.url}/studies/{study['id']}")
    verdict = page.wait_for_selector("#verdict .verdict-line").inner_text()
    assert verdict == view["verdict"][0] and verdict.startswith("conspo − grpo = ")
    rows = page.locator("#arm-table tbody tr")
    assert rows.count() == 2
    for i in range(2):
        assert rows.nth(i).locator("td").nth(1).inner_text() == "3 of 3"
    assert page.locator("#pair-table tbody tr").count() == 1
    page.wait_for_selector('#study-charts .chart[data-key="eval/accuracy"] .main-svg')
    assert page.get_by_role("heading", name="Curves", exact=True).is_visible()
    shutil.copy(shot(page, "study"), ROOT / "docs" / "screenshot-study.png")

    # the runs page links study runs to their study
    page.goto(f"{ui_server.url}/?q=study-{study['id']}-")
    link = page.wait_for_selector(f'a[href="/studies/{study["id"]}"]')
    assert link is not None

    report = tmp_path / "report.html"
    report.write_text(ui_server.http.get(f"/api/studies/{study['id']}/report.html").text)
    with offline_report(browser, report) as offline:
        line = offline.wait_for_selector("#verdict .verdict-line").inner_text()
        assert line == verdict
        offline.wait_for_selector('.chart[data-key="eval/accuracy"] .main-svg')


def test_a_study_is_stopped_from_its_page(page: Any, ui_server: Any) -> None:
    """Issue 49: the study page had no Cancel. 3 arms × 2 seeds, two runs at a time: the runs
    list's group row counts the plan (6 runs, 2 started, 3 arms; it said "2 runs · 2 arms"),
    Cancel on the study page stops its runs and releases no other."""
    body = {
        "name": "ui-study-cancel",
        "config": {**TINY, "steps": 400},  # still running when Cancel is clicked
        "arms": [
            {"name": "grpo", "overrides": {"algorithm": "grpo"}},
            {"name": "conspo", "overrides": {"algorithm": "conspo"}},
            {"name": "linear", "overrides": {"algorithm": "conspo", "params.contrast": "linear"}},
        ],
        "seeds": [0, 1],
        "baseline": "grpo",
        "concurrency": 2,
    }
    study = ui_server.api("POST", "/api/studies", json=body)
    sid = study["id"]
    page.goto(f"{ui_server.url}/?q=study-{sid}-")
    count = f'tr.group-row[data-group="g:study-{sid}"] .group-n'  # redrawn once the plan is in
    page.wait_for_function(
        "sel => document.querySelector(sel)?.textContent === '6 runs (2 started) · 3 arms'",
        arg=count,
        timeout=60_000,
    )

    page.goto(f"{ui_server.url}/studies/{sid}")
    cancel = page.wait_for_selector("#study-cancel:not([hidden])")
    page.once("dialog", lambda d: d.accept())  # it asks first
    cancel.click()
    page.wait_for_selector("#study-status:has-text('cancelled')")
    assert page.locator("#study-cancel").is_hidden()
    deadline = time.monotonic() + 120
    view = ui_server.api("GET", f"/api/studies/{sid}?curves=false")
    while view["counts"] != {"cancelled": 6} and time.monotonic() < deadline:
        time.sleep(0.5)  # the worker stops the running run at its next heartbeat
        view = ui_server.api("GET", f"/api/studies/{sid}?curves=false")
    assert view["status"] == "cancelled" and view["counts"] == {"cancelled": 6}, view["counts"]
    assert [r["run_id"] is not None for r in view["runs"]] == [True] * 2 + [False] * 4
    # the page follows the stopping run until it has stopped
    page.wait_for_function(
        "() => [...document.querySelectorAll('#runs-table tbody tr td:nth-child(4)')]"
        ".every(td => td.textContent === 'cancelled')",
        timeout=60_000,
    )
    # the four runs it never released say so, not that they wait for a slot
    runs = page.locator("#runs-table tbody tr td:nth-child(3)").all_inner_texts()
    assert runs.count("never released") == 4 and "waiting for a slot" not in runs, runs

    # At 800 px the page's actions sit in a row of their own, not over the Notes card (floated
    # right, they covered its Edit button); a section with nothing in it has no heading: the
    # view of a study whose runs logged nothing yet (its curves emptied here) showed "Curves"
    # over nothing.
    page.set_viewport_size({"width": 800, "height": 900})
    view = page.evaluate(f"() => fetch('/api/studies/{sid}').then(r => r.json())")
    page.route(
        f"**/api/studies/{sid}",
        lambda route: route.fulfill(json={**view, "curves": {}}),
    )
    page.reload()
    page.wait_for_selector("#runs-table tbody tr")
    notes = page.locator("#study-notes").bounding_box()
    for action in page.locator(".page-actions > :not([hidden])").all():
        box = action.bounding_box()
        assert box is not None and notes is not None
        apart = (
            box["y"] + box["height"] <= notes["y"]
            or notes["y"] + notes["height"] <= box["y"]
            or box["x"] + box["width"] <= notes["x"]
            or notes["x"] + notes["width"] <= box["x"]
        )
        assert apart, f"{action.inner_text()} {box} lies over the Notes card {notes}"
    assert page.locator("#study-charts > *").count() == 0
    assert page.get_by_role("heading", name="Curves", exact=True).count() == 0
    # every page counts the plan alike once it is cancelled (the runs list and the studies
    # list said "2 runs"): 6 runs, 6 cancelled, the steps done out of 6 × 400 planned
    assert page.inner_text("#study-counts") == "6 runs: 6 cancelled"
    steps = page.get_attribute("#study .steps-bar", "data-steps")
    page.goto(f"{ui_server.url}/?q=study-{sid}-")
    row = f'tr.group-row[data-group="g:study-{sid}"]'
    page.wait_for_function(
        "sel => document.querySelector(sel)?.textContent === '6 runs (2 started) · 3 arms'",
        arg=f"{row} .group-n",
        timeout=60_000,
    )
    assert page.inner_text(f"{row} .group-status") == "6 cancelled"
    assert page.get_attribute(f"{row} .group-progress", "data-total") == "2400"
    assert page.get_attribute(f"{row} .group-progress", "data-steps") == steps
    page.goto(f"{ui_server.url}/studies")
    cell = page.wait_for_selector(f'#studies-table tr[data-id="{sid}"] .study-counts')
    assert cell.inner_text() == "6 cancelled"
