"""Details of the run, runs and compare pages that must say what they mean, in a real Chromium
(see conftest.py): a config's list of rewards spelled out, ε only where a run uses it, a missing
run a 404, no export of nothing, a finished run's last sign of life a moment (not a growing
age), a chart of one point on a range around it with its markers whole, and the compare page's
band the report's 95% t interval of the mean, said so on both."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from scipy import stats as sps

from tests.ui import test_compare_groups
from tests.ui.conftest import offline_report
from tests.ui.test_compare_groups import KEY, gap, open_paired_comparison
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser
four_runs = test_compare_groups.four_runs  # grpo and conspo over seeds 0 and 1 (a fixture)
TAG = f"details-{uuid.uuid4().hex[:6]}"  # unique, so a reused server holds no look-alikes


def finished_run(ui_server: Any, name: str, config: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """An external run with ``config``, one logged step of held-out accuracy at step 0, ended."""
    run = ui_server.external_run(
        f"{TAG}-{name}", config, tags=[TAG], algorithm=config["algorithm"], **kw
    )
    steps = [{"step": 0, "metrics": {"eval/accuracy": 0.5}}]
    ui_server.api(
        "POST", f"/api/runs/{run['id']}/log", json={"steps": steps, "status": "succeeded"}
    )
    return run


@pytest.fixture(scope="module")
def conspo_run(ui_server: Any) -> dict[str, Any]:
    """A finished ConSPO run with log-prob scores (its ε unused), two rewards, one evaluation."""
    config = {
        "algorithm": "conspo",
        "params": {"tau": 10.0, "score": "logprob", "clip": 0.2},
        "rewards": [{"name": "verifier", "weight": 1.0}, {"name": "length", "weight": 0.5}],
        "task": {"name": "arith", "params": {"operators": ["+", "-"]}},
    }
    return finished_run(ui_server, "logprob", config, total_steps=10)


def test_the_config_tab_spells_out_a_list_of_rewards(
    page: Any, ui_server: Any, conspo_run: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/{conspo_run['id']}")
    page.click('.tabs button[data-tab="config"]')
    table = page.locator("#config-table")
    wait_until(page, lambda: "params.tau" in table.inner_text(), what="the config table")
    rows = dict(
        page.eval_on_selector_all(
            "#config-table tr", "trs => trs.map(r => [...r.cells].map(c => c.textContent))"
        )
    )
    assert "[object Object]" not in table.inner_text()
    assert rows["rewards.0.name"] == "verifier" and rows["rewards.1.weight"] == "0.5", rows
    assert rows["task.params.operators"] == "+, -"  # a list of plain values stays one value


def test_a_finished_runs_last_sign_of_life_is_a_time_not_an_age(
    page: Any, ui_server: Any, conspo_run: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/{conspo_run['id']}")
    alive = page.locator("#meta-heartbeat")
    wait_until(page, lambda: alive.inner_text() not in ("", "–"), what="the last sign of life")
    text = alive.inner_text()
    assert "ago" not in text and "just now" not in text, text
    assert re.search(r"\d{2}:\d{2}:\d{2}", text), text  # a moment: the clock time of it


def test_a_chart_of_one_point_is_centred_on_it_with_its_marker_whole(
    page: Any, ui_server: Any, conspo_run: Any
) -> None:
    """The run's only evaluation is at step 0: the held-out chart spans half a step each side
    of it (Plotly's default was −1 … 1), and markers are not clipped at the plot's edges."""
    page.goto(f"{ui_server.url}/runs/{conspo_run['id']}")
    page.wait_for_selector("#plot-evalc .main-svg")
    x_range = page.evaluate("() => document.getElementById('plot-evalc')._fullLayout.xaxis.range")
    assert x_range == pytest.approx([-0.5, 0.5]), x_range
    clipped = page.evaluate(
        """() => document.getElementById('plot-evalc')._fullData
                 .filter(t => (t.mode || '').includes('markers'))
                 .map(t => t.cliponaxis)"""
    )
    assert clipped and not any(clipped), clipped


def test_the_runs_list_shows_epsilon_only_where_the_run_uses_it(
    page: Any, ui_server: Any, conspo_run: Any
) -> None:
    """ConSPO's ε (params.clip) shapes only clipped-ratio scores: with a GRPO run (no such
    parameter) beside the log-prob run, no ε column is offered; asked for, its cell is empty,
    while a clipped-ratio run's shows its ε."""
    finished_run(ui_server, "grpo", {"algorithm": "grpo", "params": {"clip_low": 0.2}})
    page.goto(f"{ui_server.url}/?tag={TAG}")
    page.wait_for_selector('#f-algorithm option[value="conspo"]', state="attached")  # schemas
    page.wait_for_selector(f'tr[data-id="{conspo_run["id"]}"]')
    heads = page.eval_on_selector_all("#runs-table th.hp", "ths => ths.map(t => t.dataset.key)")
    assert "params.clip" not in heads, heads

    clipped = finished_run(
        ui_server,
        "clipped",
        {"algorithm": "conspo", "params": {"tau": 10.0, "score": "clipped_ratio", "clip": 0.3}},
    )
    page.goto(f"{ui_server.url}/?tag={TAG}&cols=params.clip")
    page.wait_for_selector('#f-algorithm option[value="conspo"]', state="attached")
    cell = 'tr[data-id="{}"] td.hp[data-key="params.clip"]'
    page.wait_for_selector(cell.format(clipped["id"]))
    assert page.inner_text('th.hp[data-key="params.clip"]') == "ε"
    assert page.inner_text(cell.format(clipped["id"])) == "0.3"
    assert page.inner_text(cell.format(conspo_run["id"])) == "–"


def test_a_missing_run_is_a_404_page(page: Any, ui_server: Any) -> None:
    """As /studies/<missing>: a 404 that says so, not a run page whose every request fails."""
    page.problems.allow_http_error(404, "/runs/999999")
    page.problems.allow_http_error(404, "/runs/99999999999")
    response = page.goto(f"{ui_server.url}/runs/999999")
    assert response.status == 404
    assert "There is no run 999999" in page.inner_text("main")
    huge = page.goto(f"{ui_server.url}/runs/99999999999")  # past the database's integers
    assert huge.status == 404


def test_an_empty_comparison_offers_no_export(page: Any, ui_server: Any, four_runs: Any) -> None:
    page.goto(f"{ui_server.url}/compare")
    page.wait_for_selector("#compare-empty", state="visible")  # drawn: no run chosen
    assert page.locator("#report-html").is_disabled()
    assert page.locator("#report-csv").is_disabled()
    open_paired_comparison(page, ui_server, four_runs)
    assert page.locator("#report-html").is_enabled() and page.locator("#report-csv").is_enabled()


def test_the_compare_band_is_the_reports_95_t_interval_and_says_so(
    page: Any, ui_server: Any, browser: Any, four_runs: Any, tmp_path: Any
) -> None:
    """Grouped by algorithm, each group's band is the 95% t interval of the mean over its runs
    (two seeds: t₀.₉₇₅ on 1 df = 12.706 times the sd over √2), as the report draws it; the
    page's note and the report's caption say which band it is. The report's paired table says
    which test decides its verdict."""
    ids = open_paired_comparison(page, ui_server, four_runs)
    plot = f"plot-m-{KEY.replace('/', '_')}"
    page.wait_for_selector(f"#{plot} .main-svg")
    upper = page.evaluate(
        """id => document.getElementById(id).data
                 .find(t => t.name === 'algorithm=grpo 95% CI upper')""",
        plot,
    )
    assert upper is not None, "no 95% CI band for algorithm=grpo"
    at = [round(x) for x in upper["x"]].index(10)
    a, b = gap("grpo", 0, 10), gap("grpo", 1, 10)
    half = sps.t.ppf(0.975, 1) * abs(a - b) / 2  # sd of two values |a − b|/√2, over √2
    assert upper["y"][at] == pytest.approx((a + b) / 2 + half, rel=1e-3)
    note = page.inner_text(f'[data-chart="m-{KEY.replace("/", "_")}"] .chart-note')
    assert "band = 95% t CI of the mean" in note and "std" not in note, note

    report = tmp_path / "report.html"
    report.write_text(
        ui_server.http.get(
            f"/api/compare/report.html?runs={ids}&key={KEY}&group=algorithm"
            "&baseline=algorithm%3Dgrpo&k=3"
        ).text
    )
    with offline_report(browser, report) as offline:
        offline.wait_for_selector(f'.chart[data-key="{KEY}"] .main-svg')
        assert "band = 95% t CI of the mean" in offline.inner_text(".chart-caption")
        heads = offline.eval_on_selector_all("#pair-table th", "ths => ths.map(t => t.textContent)")
        assert "p (paired t: decides)" in heads and "p (Wilcoxon: robustness check)" in heads
        line = offline.inner_text("#verdict .verdict-line")
        assert "paired t p = " in line and "(decides)" in line, line
