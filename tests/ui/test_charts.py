"""Issue 14 in a real Chromium: charts that never mislead (see conftest.py for the stack).

Each test also fails on a console error or a request that leaves the server (``page``)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tests.ui.conftest import ROOT
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def grpo_and_conspo(ui_server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finished GRPO run (clip_frac constant 0) and a finished ConSPO run, 30 steps each."""
    base = {"steps": 30, "task": {"name": "arith"}}
    g = ui_server.external_run("i14-grpo", {**base, "algorithm": "grpo"}, algorithm="grpo",
                               total_steps=30)  # fmt: skip
    c = ui_server.external_run("i14-conspo", {**base, "algorithm": "conspo"}, total_steps=30)
    for run in (g, c):
        ui_server.log(run["id"], range(1, 31))
    # GRPO on-policy: no ratio was clipped, every step.
    steps = [{"step": s, "metrics": {"grpo/clip_frac": 0.0}} for s in range(1, 31)]
    ui_server.api("POST", f"/api/runs/{g['id']}/log", json={"steps": steps})
    for run in (g, c):
        ui_server.api(
            "POST", f"/api/runs/{run['id']}/log", json={"steps": [], "status": "succeeded"}
        )
    return g, c


def plot_x(page: Any, chart: str) -> list[float]:
    return page.evaluate(
        "id => { const t = document.getElementById(id).data.find(t => t.meta); return t.x; }",
        f"plot-{chart}",
    )


def test_grpo_run_page(page: Any, shot: Any, ui_server: Any, grpo_and_conspo: Any) -> None:
    g, _ = grpo_and_conspo
    page.goto(f"{ui_server.url}/runs/{g['id']}")
    page.wait_for_selector("#plot-gap .main-svg")
    page.wait_for_selector("#plot-lr .main-svg")
    # ConSPO's margin schedule does not apply to GRPO: no panel.
    assert page.locator('[data-chart="margin"]').count() == 0
    # A constant series says so, and why.
    note = page.locator('[data-chart="clipfrac"] .chart-note').inner_text()
    assert "constant 0 over 30 steps" in note and "no ratio was clipped" in note
    # Finished: "live" unticked; lr ticks read as 3e-5, not 30μ.
    assert not page.is_checked("#live-toggle")
    ticks = page.evaluate(
        "() => [...document.querySelectorAll('#plot-lr .ytick text')].map(t => t.textContent)"
    )
    assert not any("μ" in t for t in ticks) and any(
        t.replace("\u2212", "-") == "3e-5" for t in ticks
    ), ticks
    # x-axis switch redraws with other x values.
    by_step = plot_x(page, "gap")
    page.select_option("#x-mode", "rollouts")
    wait_until(page, lambda: plot_x(page, "gap") != by_step, what="x values change")
    assert plot_x(page, "gap")[-1] == 30 * 64.0
    page.select_option("#x-mode", "step")
    # Deterministic series stay unsmoothed at 0.9; noisy ones are smoothed.
    page.evaluate("() => { const s = document.getElementById('smooth'); s.value = 0.9;"
                  " s.dispatchEvent(new Event('input')); }")  # fmt: skip
    smoothed = "id => document.getElementById(id).data.find(t => t.meta).meta.smoothed"
    wait_until(page, lambda: page.evaluate(smoothed, "plot-gap"), what="gap smoothed")
    assert page.evaluate(smoothed, "plot-lr") is False
    # The heatmap replaces the box plots: two heatmaps on shared bins.
    kinds = page.evaluate("() => document.getElementById('plot-dist').data.map(t => t.type)")
    assert kinds == ["heatmap", "heatmap"]
    page.wait_for_selector("#rollout-body tr")
    page.evaluate("window.scrollTo(0, 0)")
    path = shot(page, "run-grpo")
    shutil.copy(path, ROOT / "docs" / "screenshot-run-grpo.png")


def test_conspo_run_page_and_runs_list(
    page: Any, shot: Any, ui_server: Any, grpo_and_conspo: Any
) -> None:
    _, c = grpo_and_conspo
    page.goto(f"{ui_server.url}/runs/{c['id']}")
    page.wait_for_selector("#plot-margin .main-svg")
    page.wait_for_selector("#plot-dist .main-svg")
    path = shot(page, "run-conspo")
    shutil.copy(path, ROOT / "docs" / "screenshot-run-conspo.png")
    # The runs page at 800 px: no horizontal page scroll.
    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{ui_server.url}/")
    page.wait_for_selector(f'tr[data-id="{c["id"]}"]')
    wide = page.evaluate("() => document.documentElement.scrollWidth")
    assert wide <= 800, wide


def test_docs_offline_and_html_404(page: Any, ui_server: Any) -> None:
    page.goto(f"{ui_server.url}/docs")
    page.wait_for_selector("details.api-op")  # rendered with no request off the server
    assert "/api/runs" in page.inner_text("#api-docs")
    page.problems.allow_http_error(404, "/no/such/page")
    resp = page.goto(f"{ui_server.url}/no/such/page")
    assert resp.status == 404 and "Page not found" in page.inner_text("h1")
    api = ui_server.http.get("/api/no/such")
    assert api.status_code == 404 and api.headers["content-type"].startswith("application/json")
