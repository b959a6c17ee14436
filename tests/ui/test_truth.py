"""Issue 26 in a real Chromium: every page tells the truth (see conftest.py for the stack).

Each test asserts one item of the issue on the page a user sees, and (the ``page`` fixture)
that the page logged no console error and made no request off the server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.ui.test_pages import wait_until
from tests.ui.test_study_page import TINY

pytestmark = pytest.mark.browser


def test_a_cpu_only_worker_gives_cpu_processes_not_gpus(page: Any, ui_server: Any) -> None:
    """Item 1: the server's worker has no GPU, so a run occupies "1 CPU process"; a queued
    run's waiting reason (if it waits) never asks for a GPU."""
    if not ui_server.has_worker:
        pytest.skip("needs the server's worker")
    name = f"i26-cpu-{uuid.uuid4().hex[:6]}"
    run = ui_server.api("POST", "/api/runs", json={"config": {**TINY, "name": name}})["runs"][0]
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    meta = page.locator("#run-meta")
    wait_until(page, lambda: "1 CPU process" in meta.inner_text(), what="resources 1 CPU process")
    assert "GPU" not in meta.inner_text() and "GPU" not in page.locator("#run-status").inner_text()
    page.goto(f"{ui_server.url}/?q={name}")
    cell = page.wait_for_selector("td.resources")
    assert cell.inner_text() == "1 CPU process"


def test_a_study_group_row_counts_planned_work_and_never_mixes_arms(
    page: Any, ui_server: Any
) -> None:
    """Item 2: 2 arms × 2 seeds of 3 steps, 2 released: the group row's progress is out of
    the 12 planned steps (not the released runs' 6), its metric is given per arm (GRPO and
    ConSPO are never averaged together), and its sparkline cell draws."""
    body = {
        "name": f"i26-progress-{uuid.uuid4().hex[:6]}",
        "config": {**TINY, "steps": 3},
        "arms": [
            {"name": "grpo", "overrides": {"algorithm": "grpo"}},
            {"name": "conspo", "overrides": {"algorithm": "conspo"}},
        ],
        "seeds": [0, 1],
        "objective": {"metric": "eval/accuracy", "reduce": "mean_last_k", "k": 1},
        "baseline": "grpo",
        "concurrency": 2,
    }
    study = ui_server.api("POST", "/api/studies", json=body)
    try:
        page.goto(f"{ui_server.url}/?q=study-{study['id']}-")
        row = page.locator(f'tr.group-row[data-group="g:study-{study["id"]}"]')
        progress = row.locator(".group-progress")
        wait_until(page, lambda: progress.get_attribute("data-total") == "12", what="12 planned")
        assert progress.inner_text().endswith("/12")
        arms = row.locator(".arm-stat")
        assert sorted(arms.nth(i).get_attribute("data-arm") for i in range(arms.count())) == [
            "conspo",
            "grpo",
        ]
        assert row.locator("td.spark-cell svg").count() == 1
    finally:
        ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
