"""The study form (/studies/new): checked live against the server with each 422 shown under
its field, bad JSON caught before sending, submit → the study page; the studies list (/studies)
linked from the top bar."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.ui.test_study_page import TINY

pytestmark = pytest.mark.browser


def err(page: Any, field: str) -> Any:
    return page.locator(f'[data-field="{field}"] .err')


def test_study_form_checks_live_and_submits(page: Any, ui_server: Any, shot: Any) -> None:
    page.problems.allow_http_error(422, "/api/studies/check")
    page.goto(f"{ui_server.url}/")
    page.click("#nav-studies")
    page.wait_for_url(re.compile(r"/studies$"))
    page.click("#new-study")
    page.wait_for_url(re.compile(r"/studies/new$"))
    page.wait_for_selector("#check-note:has-text('10 runs')")  # 2 default arms × 5 seeds

    # a bad override is refused by the server and shown under that arm's overrides
    page.fill("#f-arm-1-overrides", '{"algorithm": "conspo", "params.tau": -1}')
    tau = err(page, "arms.1.overrides")
    page.wait_for_function(
        "el => /params\\.tau/.test(el.textContent) && !el.hidden", arg=tau.element_handle()
    )
    assert err(page, "arms.0.overrides").is_hidden()
    # the page's names (Arm 2), not the API's (arms.1); the note beside Start says what to do
    assert "Arm 2, overrides" in tau.inner_text() and "arms.1" not in tau.inner_text()
    assert page.inner_text("#check-note") == "fix the marked field"
    # bad JSON is caught here, before anything is sent
    page.fill("#f-config", "{task: arith")
    page.wait_for_function(
        "el => /not valid JSON/.test(el.textContent) && !el.hidden",
        arg=err(page, "config").element_handle(),
    )
    # a seed repeated and a k of 0: the server names both fields
    page.fill("#f-config", json.dumps(TINY))
    page.fill("#f-arm-1-overrides", '{"algorithm": "conspo", "params.tau": 1.0}')
    page.fill("#f-seeds", "0, 0")
    page.fill("#f-k", "0")
    page.wait_for_function("el => !el.hidden", arg=err(page, "seeds").element_handle())
    assert "distinct" in err(page, "seeds").inner_text()
    assert not err(page, "objective.k").is_hidden()
    assert err(page, "arms.1.overrides").is_hidden()
    shot(page, "new_study_errors")

    page.fill("#f-name", "ui-form-study")
    page.fill("#f-k", "1")
    # one seed: refused under the field before any compute is spent (issue 49)
    page.fill("#f-seeds", "7")
    page.wait_for_function(
        "el => /at least 2 seeds/.test(el.textContent) && !el.hidden",
        arg=err(page, "seeds").element_handle(),
    )
    assert page.inner_text("#check-note") == "fix the marked field"
    page.fill("#f-seeds", "7, 8")
    page.fill("#f-concurrency", "1")
    page.select_option("#f-baseline", "conspo")
    page.wait_for_selector("#check-note:has-text('4 runs')")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/studies/\d+$"))
    study_id = int(page.url.rsplit("/", 1)[1])
    try:
        page.wait_for_selector("#verdict")
        view = ui_server.api("GET", f"/api/studies/{study_id}?curves=false")
        assert view["name"] == "ui-form-study" and view["baseline"] == "conspo"
        assert view["seeds"] == [7, 8] and view["objective"]["k"] == 1
        assert [a["overrides"] for a in view["spec"]["arms"]] == [
            {"algorithm": "grpo"},
            {"algorithm": "conspo", "params.tau": 1.0},
        ]
        page.goto(f"{ui_server.url}/studies")
        page.wait_for_selector(
            f'#studies-table tr[data-id="{study_id}"] a[href="/studies/{study_id}"]'
        )
    finally:
        ui_server.api("POST", f"/api/studies/{study_id}/cancel")


def test_study_page_shows_tasks(page: Any, ui_server: Any) -> None:
    body = {
        "name": "ui-tasks",
        "config": TINY,
        "arms": [{"name": "grpo", "overrides": {"algorithm": "grpo"}}, {"name": "conspo"}],
        "tasks": ["arith", "countdown"],
        "seeds": [0, 1],
        "concurrency": 1,
    }
    study = ui_server.api("POST", "/api/studies", json=body)
    ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
    page.goto(f"{ui_server.url}/studies/{study['id']}")
    rows = page.wait_for_selector("#tasks-table")
    assert "conspo − grpo (paired)" in rows.inner_text()
    names = page.locator("#runs-table tbody tr td:first-child").all_inner_texts()
    arms = ["grpo · arith", "conspo · arith", "grpo · countdown", "conspo · countdown"]
    assert names == arms * 2  # seed-major
