"""The page of a run logged by a plain TRL GRPOTrainer through conspo_lab.trl_bridge, in a real
Chromium: what its rewards tell is drawn, and the panels only ConSPOTrainer can fill say so."""

from __future__ import annotations

from typing import Any

import pytest

from conspo import metrics as M
from conspo_lab.trl_bridge import map_logs

pytestmark = pytest.mark.browser


def test_a_plain_trl_run_says_which_curves_need_conspo_trainer(page: Any, ui_server: Any) -> None:
    run = ui_server.external_run("trl-plain-page", {"num_generations": 4}, algorithm="trl-grpo")
    # What the bridge sends for TRL's own logs: means of the rewards, no per-rollout scores.
    trl_logs = [
        {"loss": 0.1 / s, "reward": 0.25 * s, "reward_std": 0.4, "frac_reward_zero_std": 0.5}
        for s in (1, 2, 3)
    ]
    steps = [
        {"step": s, "metrics": map_logs(logs, groups=4)} for s, logs in enumerate(trl_logs, start=1)
    ]
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"steps": steps})

    page.goto(f"{ui_server.url}/runs/{run['id']}")
    page.wait_for_selector("#plot-reward .main-svg")  # the pass rate
    page.wait_for_selector("#plot-groups .main-svg")  # the mixed groups
    for chart in ("scores", "gap", "acc", "dist"):  # the score panels, and the heatmap's
        note = page.wait_for_selector(
            f'[data-chart="{chart}"] .plot span:has-text("ConSPOTrainer")'
        )
        assert "no per-rollout scores" in note.inner_text(), chart
    assert page.locator('[data-chart="reward"] .plot span').count() == 0
    assert M.BATCH_VALID_GROUPS in steps[0]["metrics"]  # what the groups panel drew
