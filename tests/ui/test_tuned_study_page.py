"""A tuned study run by the real worker (2 arms × 2 trials on one tuning seed, then 2 final
seeds), its page in Chromium: the tuning phase (each arm's trials, its pick and how sure it
is) before the verdict of the final runs, and the same in its offline report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import offline_report
from tests.ui.test_study_page import TINY, wait_for_study

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LR = {"type": "categorical", "choices": [1e-4, 1e-3]}


def test_tuned_study_page_shows_both_phases(
    page: Any, ui_server: Any, browser: Any, tmp_path: Path
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs the server's worker")
    body = {
        "name": "ui-tuned-study",
        "config": TINY,
        "arms": [
            {
                "name": "grpo",
                "overrides": {"algorithm": "grpo"},
                "tune": {"space": {"optim.lr": LR}, "sampler": "grid", "trials": 2},
            },
            {
                "name": "conspo",
                "overrides": {"algorithm": "conspo"},
                "tune": {"space": {"optim.lr": LR}, "sampler": "grid", "trials": 2},
            },
        ],
        "tuning_seeds": [100],
        "seeds": [0, 1],
        "objective": {"metric": "eval/accuracy", "reduce": "mean_last_k", "k": 2},
        "baseline": "grpo",
        "concurrency": 2,
    }
    study = ui_server.api("POST", "/api/studies", json=body)
    view = wait_for_study(ui_server, study["id"])
    assert view["status"] == "done" and view["counts"] == {"succeeded": 8}, view["counts"]
    picks = {a["arm"]: a["pick"] for a in view["tuning"]["arms"]}

    page.goto(f"{ui_server.url}/studies/{study['id']}")
    page.wait_for_selector("#tuning-title")
    assert "done" in page.inner_text("#tuning-phase")
    for arm in ("grpo", "conspo"):
        box = page.locator(f'.tuning-arm[data-arm="{arm}"]')
        assert box.locator("tbody tr").count() == 2
        pick = box.locator(".tuning-pick").inner_text()
        assert pick.startswith(f"{arm} runs at t{picks[arm]['trial']}: optim.lr"), pick
        assert picks[arm]["confidence"] in pick
    verdict = page.wait_for_selector("#verdict .verdict-line").inner_text()
    assert verdict == view["verdict"][0]
    assert page.locator("#runs-table tbody tr").count() == 4  # the final runs

    report = tmp_path / "report.html"
    report.write_text(ui_server.http.get(f"/api/studies/{study['id']}/report.html").text)
    with offline_report(browser, report) as offline:
        offline.wait_for_selector("#tuning-title")
        assert offline.locator(".tuning-arm").count() == 2
