"""The run page's System sections: a run trained by the real worker logs system/* readings
(conspo.system, sampled on their own thread), drawn against wall time and never smoothed; a CPU
run's GPU panels are folded with the line that says why."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.ui.test_pages import trace_points, wait_until

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]

CONFIG = {
    "algorithm": "grpo",
    "steps": 12,
    "model": {"name": "tiny"},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
    "task": {"name": "arith", "eval_size": 4},
    "eval": {"every": 0},
    "logging": {"system_interval_s": 0.5},
}


def test_a_worker_run_shows_its_system_readings_and_folds_the_gpu_panels(
    page: Any, shot: Any, ui_server: Any
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs the embedded worker: the readings are the training process's own")
    run = ui_server.api("POST", "/api/runs", json={"config": {**CONFIG, "name": "sysmetrics"}})
    run_id = run["runs"][0]["id"]
    wait_until(page, lambda: ui_server.api("GET", f"/api/runs/{run_id}")["status"] == "succeeded",
               timeout=300, what="the run to finish")  # fmt: skip
    keys = ui_server.api("GET", f"/api/runs/{run_id}/metrics/keys")["keys"]
    assert {"system/cpu_percent", "system/rss_gib", "system/peak_rss_gib",
            "system/available_gib"} <= set(keys), keys  # fmt: skip
    assert not [k for k in keys if k.startswith("system/gpu")]  # a CPU run reads no GPU
    series = ui_server.api(
        "GET", f"/api/runs/{run_id}/metrics", params={"keys": "system/rss_gib,system/peak_rss_gib"}
    )["series"]
    rss, peak = series["system/rss_gib"]["values"], series["system/peak_rss_gib"]["values"]
    assert all(0.05 < r < 64 for r in rss) and all(p >= r for p, r in zip(peak, rss, strict=True))

    page.goto(f"{ui_server.url}/runs/{run_id}")
    page.wait_for_selector('[data-section="system"] .section-title')
    wait_until(page, lambda: trace_points(page, "plot-sysmem") >= 1, what="the memory panel")
    assert trace_points(page, "plot-syscpu") >= 1
    # wall time on the x axis whatever the page's axis (step by default)
    title = page.evaluate("document.getElementById('plot-sysmem').layout.xaxis.title.text")
    assert "wall" in title.lower() or "min" in title.lower(), title
    # never smoothed: with the slider up, the memory line is still the raw readings
    page.evaluate(
        "(() => { const s = document.getElementById('smooth'); s.value = '0.9';"
        " s.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )
    page.wait_for_timeout(500)
    meta = page.evaluate(
        "document.getElementById('plot-sysmem').data.filter(t => t.meta).map(t => t.meta.smoothed)"
    )
    assert meta and not any(meta), meta
    gpu = page.wait_for_selector('[data-section="gpu"][data-folded="1"]')
    assert "no GPU readings" in gpu.inner_text()
    shutil.copy(shot(page, "run-system"), ROOT / "docs" / "screenshot-run-system.png")
