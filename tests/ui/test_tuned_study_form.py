"""The study form's tuned arms: a tune block per arm and the tuning seeds, checked live (an
overlap with the final seeds, a bad space path, each under its field), the budget beside Start,
and submit → a tuned study."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.ui.test_study_form import err
from tests.ui.test_study_page import TINY

pytestmark = pytest.mark.browser

TUNE = {"space": {"optim.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}}}


def test_study_form_tunes_an_arm(page: Any, ui_server: Any) -> None:
    page.problems.allow_http_error(422, "/api/studies/check")
    page.goto(f"{ui_server.url}/studies/new")
    page.wait_for_selector("#check-note:has-text('10 runs')")
    page.fill("#f-name", "ui-form-tuned")
    page.fill("#f-config", json.dumps(TINY))
    page.fill("#f-seeds", "0, 1")
    page.fill("#f-concurrency", "1")
    page.fill("#f-arm-1-tune", json.dumps({**TUNE, "trials": 3}))
    # an arm has tune: its trials need tuning seeds, named under that field
    tuning = err(page, "tuning_seeds")
    page.wait_for_function(
        "el => /tuning seeds|trials run on/.test(el.textContent) && !el.hidden",
        arg=tuning.element_handle(),
    )
    page.fill("#f-tuning-seeds", "1, 100")  # 1 is a final seed too
    page.wait_for_function(
        "el => /disjoint/.test(el.textContent) && !el.hidden", arg=tuning.element_handle()
    )
    # a space over a path the config lacks, under that arm's tune field
    page.fill("#f-tuning-seeds", "100")
    page.fill("#f-arm-1-tune", json.dumps({"space": {"optim.nope": TUNE["space"]["optim.lr"]}}))
    page.wait_for_function(
        "el => /optim\\.nope/.test(el.textContent) && !el.hidden",
        arg=err(page, "arms.1.tune").element_handle(),
    )
    assert tuning.is_hidden()
    page.fill("#f-arm-1-tune", json.dumps({**TUNE, "trials": 3}))
    # 3 trials × 1 tuning seed + 2 arms × 2 seeds, and the budget beside Start
    page.wait_for_selector("#check-note:has-text('7 runs')")
    assert "3 tuning + 4 final" in page.inner_text("#check-note")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/studies/\d+$"))
    study_id = int(page.url.rsplit("/", 1)[1])
    try:
        page.wait_for_selector("#tuning-title")
        view = ui_server.api("GET", f"/api/studies/{study_id}?curves=false")
        assert view["spec"]["tuning_seeds"] == [100] and view["spec"]["arms"][0]["tune"] is None
        assert view["spec"]["arms"][1]["tune"]["trials"] == 3
        assert [a["arm"] for a in view["tuning"]["arms"]] == ["conspo"]
    finally:
        ui_server.api("POST", f"/api/studies/{study_id}/cancel")
