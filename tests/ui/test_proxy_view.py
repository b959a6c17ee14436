"""The proxy-vs-truth view in a real Chromium (issue 51 item 5; see conftest.py for the stack): a
run trained on a proxy reward shows the section with the proxy against the truth and how alike
they rank, step by step and on the held-out samples; a run trained on its truth shows no such
section; the compare page sets two runs' proxy curves side by side."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from conspo import metrics as M
from tests.ui.conftest import fake_metrics
from tests.ui.test_pages import trace_points, wait_until

pytestmark = pytest.mark.browser
STEPS = range(1, 11)


def goodhart(step: int, kl: float) -> dict[str, float]:
    """The proxy keeps rising; the truth rises, then falls past step 5 (less with the KL)."""
    proxy = 0.2 + 0.1 * step
    truth = 0.3 + 0.05 * min(step, 5) - (0.06 - kl) * max(0, step - 5)
    held_out = {M.EVAL_PROXY_REWARD: proxy - 0.05, M.EVAL_PROXY_TRUTH: truth - 0.05,
                M.EVAL_PROXY_AGREEMENT: 0.8 - 0.04 * step,
                M.EVAL_PROXY_SPEARMAN: 0.6 - 0.05 * step}  # fmt: skip
    return {
        M.PROXY_REWARD: proxy,
        M.PROXY_TRUTH: truth,
        M.PROXY_GAP: proxy - truth,
        M.PROXY_AGREEMENT: 0.85 - 0.03 * step,
        M.PROXY_SPEARMAN: 0.7 - 0.04 * step,
        **(held_out if step % 5 == 0 else {}),
    }


def log_run(ui_server: Any, name: str, proxy: float | None) -> dict[str, Any]:
    """An external run; with ``proxy`` (its KL in the reward) the proxy-vs-truth keys."""
    config = {"algorithm": "grpo", "steps": 10, "task": {"name": "arith"}}
    run = ui_server.external_run(name, config, algorithm="grpo", total_steps=10)
    steps = [
        {"step": s, "metrics": {**fake_metrics(s), **({} if proxy is None else goodhart(s, proxy))}}
        for s in STEPS
    ]
    body = {"steps": steps, "status": "succeeded"}
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json=body)
    return run


@pytest.fixture(scope="module")
def proxy_runs(ui_server: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    tag = uuid.uuid4().hex[:6]
    return (
        log_run(ui_server, f"ui-proxy-{tag}", 0.0),
        log_run(ui_server, f"ui-proxy-kl-{tag}", 0.03),
        log_run(ui_server, f"ui-truth-{tag}", None),
    )


def test_a_run_trained_on_a_proxy_draws_it_against_the_truth(
    page: Any, ui_server: Any, proxy_runs: Any, shot: Any
) -> None:
    run, _, truth_only = proxy_runs
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    section = page.locator('[data-section="proxy"]')
    for plot in ("plot-proxytruth", "plot-proxyrank"):
        wait_until(page, lambda plot=plot: trace_points(page, plot) == 10, what=f"{plot} drawn")
    assert section.locator(".section-title").text_content() == "Proxy reward against the truth"
    assert section.locator(".chart-card").count() == 2
    # proxy, truth and gap per step, and the held-out pair at the two evaluations
    names = page.evaluate("() => document.getElementById('plot-proxytruth').data.map(t => t.name)")
    for label in ("proxy (trained on)", "truth", "gap (proxy − truth)", "truth (held-out)"):
        assert any(label == (n or "").strip() for n in names), (label, names)
    assert trace_points(page, "plot-proxytruth", r"^truth \(held-out\)") == 2
    shot(page, "proxy-view")

    page.goto(f"{ui_server.url}/runs/{truth_only['id']}")
    page.wait_for_selector('[data-section="sep"]')
    wait_until(page, lambda: trace_points(page, "plot-reward") == 10, what="the pass rate drawn")
    assert page.locator('[data-section="proxy"]').count() == 0


def test_the_compare_page_sets_two_runs_proxy_curves_side_by_side(
    page: Any, ui_server: Any, proxy_runs: Any
) -> None:
    a, b, _ = proxy_runs
    page.goto(f"{ui_server.url}/compare?runs={a['id']},{b['id']}")
    page.wait_for_selector(f'#key-list input[value="{M.PROXY_TRUTH}"]', state="attached")
    page.locator(f'#key-list input[value="{M.PROXY_TRUTH}"]').check()
    plot = "plot-m-" + re.sub(r"\W", "_", M.PROXY_TRUTH)
    wait_until(page, lambda: trace_points(page, plot) == 10, what="proxy/truth compared")
    traces = page.evaluate(f"() => document.getElementById('{plot}').data.length")
    assert traces >= 2  # one per run
