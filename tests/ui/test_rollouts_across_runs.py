"""Rollouts side by side, in a real Chromium (see conftest.py for the stack): opened from the
compare page's link with its runs, the page shows each prompt once and both runs' groups of it
in columns — paired by the prompt's text though the runs hold them in swapped groups — says
which run lacks a prompt, filters to the prompts the runs disagree on, folds a long answer, and
shows a hostile answer as text."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.ui.conftest import fake_metrics
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser
HOSTILE = "<img src=x onerror=alert(1)>"
LONG = "step by step: " + "carry the one, " * 80 + "so 42"


def group(step: int, g: int, prompt: str, rewards: list[float], answers: list[str]) -> list[dict]:
    return [
        {
            "step": step,
            "group": g,
            "index": i,
            "reward": r,
            "score": -0.5 - 0.5 * (r == 0) - 0.1 * i,
            "length": 4 + i,
            "truncated": False,
            "prompt": prompt,
            "completion": answer,
        }  # fmt: skip
        for i, (r, answer) in enumerate(zip(rewards, answers, strict=True))
    ]


@pytest.fixture(scope="module")
def two_runs(ui_server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """grpo holds "3+4=" in group 0, "5*6=" in group 1 and "9-2=" (its own) in group 2 at step
    2; conspo holds "5*6=" in group 0 and "3+4=" in group 1. On "3+4=" conspo is right twice and
    grpo never (they disagree); on "5*6=" both are right."""
    tag = uuid.uuid4().hex[:6]
    runs = [
        ui_server.external_run(f"xr-{algo}-{tag}", {"seed": 0}, algorithm=algo, total_steps=2)
        for algo in ("grpo", "conspo")
    ]
    wrong, right = [0.0] * 4, [1.0, 0.0, 1.0, 0.0]
    grpo = [
        *group(2, 0, "3+4=", wrong, ["8", "6", LONG, "12"]),
        *group(2, 1, "5*6=", right, ["30", "31", "30", "11"]),
        *group(2, 2, "9-2=", right, ["7", "8", "7", "6"]),
    ]
    conspo = [
        *group(2, 0, "5*6=", right, ["30", "35", "30", "56"]),
        *group(2, 1, "3+4=", right, ["7", HOSTILE, "7", "9"]),
    ]
    for run, rollouts in zip(runs, (grpo, conspo), strict=True):
        body = {
            "steps": [{"step": s, "metrics": fake_metrics(s)} for s in (1, 2)],
            "rollouts": [*group(1, 0, "1+1=", right, ["2", "3", "2", "0"]), *rollouts],
            "status": "succeeded",
        }
        ui_server.api("POST", f"/api/runs/{run['id']}/log", json=body)
    return runs[0], runs[1]


def prompt_block(page: Any, prompt: str) -> Any:
    return page.locator("section.xr-prompt").filter(
        has=page.locator("pre.xr-prompt-text", has_text=prompt)
    )


def test_rollouts_side_by_side_from_the_compare_page(
    page: Any, ui_server: Any, two_runs: Any, shot: Any
) -> None:
    grpo, conspo = two_runs
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{ui_server.url}/compare?runs={grpo['id']},{conspo['id']}")
    link = page.locator("#rollouts-link")
    link.wait_for(state="visible")
    link.click()
    page.wait_for_url("**/compare/rollouts?runs=*")
    page.wait_for_selector("section.xr-prompt")
    assert page.locator("#xr-step").input_value() == "2"  # the latest step both sampled
    assert "3 prompts at this step · 2 in every run · 1 where the runs disagree" in (
        page.locator("#xr-counts").text_content()
    )

    # "3+4=": grpo's group 0 beside conspo's group 1, each column with its group's numbers
    block = prompt_block(page, "3+4=")
    assert block.locator(".xr-disagree").is_visible()
    grpo_col = block.locator(f".xr-col[data-run='{grpo['id']}']")
    conspo_col = block.locator(f".xr-col[data-run='{conspo['id']}']")
    assert "group 0 · 0/4 rewarded · mean reward 0" in grpo_col.locator(".xr-stats").text_content()
    stats = conspo_col.locator(".xr-stats").text_content()
    assert "group 1 · 2/4 rewarded · mean reward 0.5 · score gap 0.6" in stats, stats
    assert grpo_col.locator(".xr-rollout.neg").count() == 4
    assert conspo_col.locator(".xr-rollout.pos").count() == 2
    assert conspo_col.locator(".xr-rollout.pos .xr-meta b").first.text_content() == "✓ correct"

    # the hostile answer is text: no element made of it, nothing ran, nothing fetched
    assert conspo_col.locator("pre.xr-text", has_text=HOSTILE).count() == 1
    assert page.locator("#xr-prompts img").count() == 0

    # a long answer is folded until asked
    folded = grpo_col.locator("pre.xr-text.folded")
    assert folded.text_content().endswith("…") and "so 42" not in folded.text_content()
    grpo_col.locator("button.xr-unfold").click()
    assert grpo_col.locator("pre.xr-text", has_text="so 42").count() == 1

    # "9-2=": grpo's alone, conspo's column says it has none
    lone = prompt_block(page, "9-2=")
    assert "no partner in" in lone.locator(".xr-partner").text_content()
    assert lone.locator(f".xr-col.xr-missing[data-run='{conspo['id']}']").is_visible()
    shot(page, "rollouts_across_runs")

    # only the prompts the runs disagree on
    page.locator("#xr-disagree").check()
    wait_until(page, lambda: page.locator("section.xr-prompt").count() == 1, what="one prompt")
    assert prompt_block(page, "3+4=").count() == 1
    assert "disagree=1" in page.url

    # another step in common: picked from the list, its prompts shown (they agree there)
    page.locator("#xr-step").select_option("1")
    page.wait_for_selector("text=The runs agree on every prompt at step 1.")
    page.locator("#xr-disagree").uncheck()
    wait_until(page, lambda: prompt_block(page, "1+1=").count() == 1, what="step 1's prompt")
    assert dialogs == [] and page.evaluate("typeof window.alert") == "function"


def test_the_study_page_links_each_seeds_arms_side_by_side(page: Any, ui_server: Any) -> None:
    """A study's runs at one seed are its arms on the same prompts: the study page links each
    seed's released runs to this page (the study is cancelled at once: its runs need not run)."""
    from tests.ui.test_study_page import TINY

    study = ui_server.api(
        "POST",
        "/api/studies",
        json={
            "name": f"xr-study-{uuid.uuid4().hex[:6]}",
            "config": {**TINY, "steps": 1},
            "arms": [
                {"name": "grpo", "overrides": {"algorithm": "grpo"}},
                {"name": "conspo", "overrides": {"algorithm": "conspo"}},
            ],
            "seeds": [0, 1],
            "baseline": "grpo",
            "concurrency": 4,
        },
    )
    ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
    runs = ui_server.api("GET", f"/api/studies/{study['id']}")["runs"]
    assert all(r["run_id"] for r in runs), runs  # every run released before the cancel
    page.goto(f"{ui_server.url}/studies/{study['id']}")
    for seed in (0, 1):
        link = page.locator("a.rollouts-seed", has_text=f"seed {seed}")
        link.wait_for(state="visible")
        ids = ",".join(str(r["run_id"]) for r in runs if r["seed"] == seed)
        assert link.get_attribute("href") == f"/compare/rollouts?runs={ids}"
