"""Held-out sizes told as you type and on the run page (issue 36): the form's task line says
how many distinct held-out problems the task has and that a larger ``eval_size`` would be
refused; a run left at the default eval_size on a small task says "16 of 64 asked"."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser


def test_the_form_warns_of_an_eval_size_beyond_the_held_out_split(
    page: Any, ui_server: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.task.params.num_operands"]')
    page.fill('[name="config.task.params.num_operands"]', "2")  # 1-digit pairs: 16 held out
    page.click("details.adv > summary")
    page.fill('[name="config.task.eval_size"]', "100")
    line = page.locator("#task-check")
    wait_until(page, lambda: "would be refused" in line.inner_text(), 120, "the task line")
    assert "16 distinct held-out problems" in line.inner_text()
    assert "at most 16" in line.inner_text()
    page.fill('[name="config.task.eval_size"]', "16")
    wait_until(page, lambda: "would be refused" not in line.inner_text(), 120, "the line cleared")
    assert "16 distinct held-out problems" in line.inner_text()


def test_a_run_scoring_fewer_problems_than_the_default_says_so(page: Any, ui_server: Any) -> None:
    if not ui_server.has_worker:
        return
    config = {
        "algorithm": "grpo",
        "model": {"name": "tiny"},
        "task": {"name": "arith"},  # eval_size left at its default, 64: 16 exist
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "eval": {"every": 0, "pass_k": 1},
        "steps": 1,
    }
    run = ui_server.api("POST", "/api/runs", json={"config": config})["runs"][0]
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    item = page.locator("#meta-held-out")
    wait_until(page, lambda: item.count() > 0 and "16 of 64 asked" in item.inner_text(), 180,
               "the held-out count")  # fmt: skip


def test_a_busy_task_check_is_asked_again_without_an_edit(page: Any, ui_server: Any) -> None:
    """The estimate says the task-check helpers are busy ("retry shortly", as a loaded machine
    answers the burst of estimates that choosing SmolLM2's recipe sends): the page asks again
    by itself and the line ends with what the check found, though nothing was edited since."""
    answered: list[bool] = []  # one entry per estimate answered, True for the one made busy

    def busy_once(route: Any) -> None:
        response = route.fetch()
        report = response.json()
        made_busy = not any(answered) and report.get("task") is not None
        if made_busy:
            asked = report["task"]["asked"]
            busy = "every task check is busy, and as many are waiting; retry shortly"
            report["task"] = {"checked": False, "refused": False, "asked": asked, "text": busy}
        answered.append(made_busy)
        route.fulfill(response=response, json=report)

    page.route(f"{ui_server.url}/api/runs/estimate", busy_once)
    page.goto(f"{ui_server.url}/runs/new")
    line = page.locator("#task-check")
    wait_until(page, lambda: "busy" in line.inner_text(), 120, "the busy line")
    asked_before = len(answered)
    wait_until(
        page,
        lambda: "held-out problems" in line.inner_text() and "busy" not in line.inner_text(),
        120,
        "the task check asked again",
    )
    assert len(answered) > asked_before  # nothing was edited: the page asked by itself
