"""Issue 14 in a real Chromium: charts that never mislead (see conftest.py for the stack).

Each test also fails on a console error or a request that leaves the server (``page``)."""

from __future__ import annotations

import re
import shutil
import uuid
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


# ------------------------------------------------------------------------------------------------
# runs list: group rows, hyperparameter columns, one sparkline scale (issue 14, items 4, 6, 7)
# ------------------------------------------------------------------------------------------------

LIST_TAG = f"i14-list-{uuid.uuid4().hex[:6]}"  # unique, so a reused server holds no look-alikes
TINY = {
    "algorithm": "conspo",
    "steps": 1,
    "model": {"name": "tiny"},
    "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
    "task": {"name": "arith", "eval_size": 4},
    "eval": {"every": 0},
    "checkpoint": {"every": 0},
}


@pytest.fixture(scope="module")
def listed(ui_server: Any) -> dict[str, Any]:
    """Two logged external runs that differ in τ (their gaps 0.6 apart) and a 3-seed group."""
    singles = []
    for tau, offset in ((5.0, 0.0), (10.0, 0.6)):
        config = {"algorithm": "conspo", "params": {"tau": tau}}
        run = ui_server.external_run(
            f"i14-list-tau{tau:g}", config, tags=[LIST_TAG], total_steps=20
        )
        ui_server.log(run["id"], range(1, 21), offset=offset, rollouts=False)
        singles.append(run)
    body = {"config": {**TINY, "name": "i14-seeds"}, "seeds": [1, 2, 3], "tags": [LIST_TAG]}
    group = ui_server.api("POST", "/api/runs", json=body)
    for run in group["runs"]:  # only the list is tested here: keep the shared CPUs free
        ui_server.api("POST", f"/api/runs/{run['id']}/cancel")
    return {"singles": singles, "group": group}


def test_runs_list_groups_columns_and_shared_scale(
    page: Any, shot: Any, ui_server: Any, listed: Any
) -> None:
    a, b = listed["singles"]
    members = [r["id"] for r in listed["group"]["runs"]]
    key = f"g:{listed['group']['group_id']}"
    page.goto(f"{ui_server.url}/?tag={LIST_TAG}")
    # Locators, not element handles: a live update redraws the group's row.
    row = f'tr.group-row[data-group="{key}"]'
    toggle = f"{row} .group-toggle"
    page.wait_for_selector(row)
    # The seeds collapse under one row: its name without the seed suffix, n, status counts.
    assert "i14-seeds" in page.inner_text(row) and page.inner_text(f"{row} .group-n") == "3 runs"
    status = page.inner_text(f"{row} .group-status")
    assert sum(int(n) for n in re.findall(r"(\d+) \w+", status)) == 3, status
    assert all(page.locator(f'tr[data-id="{i}"]').is_hidden() for i in members)
    page.click(toggle)
    wait_until(page, lambda: all(page.locator(f'tr[data-id="{i}"]').is_visible() for i in members),
               what="group expanded")  # fmt: skip
    page.click(toggle)
    wait_until(page, lambda: page.locator(f'tr[data-id="{members[0]}"]').is_hidden(), what="folded")
    # τ differs among the listed runs: it is the first hyperparameter column.
    heads = page.eval_on_selector_all("#runs-table th.hp", "ths => ths.map(t => t.dataset.key)")
    assert heads[0] == "params.tau", heads
    cell = 'tr[data-id="{}"] td.hp[data-key="params.tau"]'
    assert [page.inner_text(cell.format(r["id"])) for r in (a, b)] == ["5", "10"]
    assert page.inner_text(f'{row} td.hp[data-key="params.tau"]') == "10"
    # The column toggles off (and the choice lives in the URL).
    page.click("#cols-picker summary")
    page.uncheck('#cols-list input[value="params.tau"]')
    wait_until(
        page, lambda: page.locator('th.hp[data-key="params.tau"]').count() == 0, what="hidden"
    )
    assert "cols=" in page.url
    # Both sparklines are drawn on one y-range, shown in the column's head.
    for r in (a, b):
        page.wait_for_selector(f'tr[data-id="{r["id"]}"] svg.spark path')
    ranges = [
        page.get_attribute(f'tr[data-id="{r["id"]}"] svg.spark', "data-y-range") for r in (a, b)
    ]
    assert ranges[0] and ranges[0] == ranges[1], ranges
    lo, hi = map(float, ranges[0].split(","))
    assert hi - lo > 0.6  # spans both runs, not one
    assert page.inner_text("#spark-head .spark-scale").startswith("y ")
    page.click(toggle)
    shot(page, "runs_groups")
    page.set_viewport_size({"width": 800, "height": 900})
    shot(page, "runs_groups_800")


def test_a_short_run_has_whole_step_ticks_and_an_empty_completion_says_so(
    page: Any, ui_server: Any
) -> None:
    """Issue 37 item 7: step ticks at halves ("1.5") on a few-step chart, and an empty completion
    drawn as a blank cell."""
    run = ui_server.external_run(f"i37-short-{uuid.uuid4().hex[:6]}", {"steps": 4}, total_steps=4)
    ui_server.log(run["id"], range(1, 5))
    rows = [
        {"step": 4, "group": 0, "index": i, "reward": 0.0, "score": -1.0, "length": 1,
         "truncated": False, "prompt": "What is 2+2?", "completion": "" if i == 0 else "4"}
        for i in range(2)
    ]  # fmt: skip
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"steps": [], "rollouts": rows})
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    page.wait_for_selector("#plot-gap .xtick text")
    ticks = page.evaluate(
        "() => [...document.querySelectorAll('#plot-gap .xtick text')].map(t => t.textContent)"
    )
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    cell = page.wait_for_selector("#rollout-body td.empty-completion")
    assert cell.inner_text() == "(empty completion)"


def test_a_resumed_run_says_its_attempts_deaths_and_where_it_resumed(
    page: Any, ui_server: Any
) -> None:
    """Issue 37 item 3: the run page hid a worker's death and the resume ("7/10" while step 6 was
    trained again). The row as the reaper and a resumed attempt leave it, written directly."""
    import sqlite3

    run = ui_server.external_run(f"i37-resumed-{uuid.uuid4().hex[:6]}", {"steps": 10},
                                 total_steps=10)  # fmt: skip
    ui_server.log(run["id"], range(1, 8))
    with sqlite3.connect(ui_server.data_dir / "conspo.db") as db:
        db.execute(
            "UPDATE runs SET attempt = 2, worker_deaths = 1, resumed_from_step = 5,"
            " last_worker_death = 'worker vm was killed by its watchdog' WHERE id = ?",
            (run["id"],),
        )
    assert ui_server.api("GET", f"/api/runs/{run['id']}")["resumed_from_step"] == 5
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    item = page.wait_for_selector("#meta-attempts")
    assert item.inner_text() == "attempt 2 · 1 worker death · resumed from step 5"
    assert "killed by its watchdog" in (item.get_attribute("title") or "")
    # and in the header, beside the status ("7/10" alone hid that steps 6-7 were trained again)
    assert page.inner_text("#attempt-note") == "attempt 2, resumed from step 5"


def test_held_out_accuracy_says_its_n_and_draws_its_interval(page: Any, ui_server: Any) -> None:
    """Issue 37 item 5: accuracy was shown with no n or interval on the chart and Summary tab."""
    run = ui_server.external_run(f"i37-acc-{uuid.uuid4().hex[:6]}", {"steps": 20}, total_steps=20)
    steps = [
        {"step": s, "metrics": {"eval/accuracy": acc, "eval/problems": 200}}
        for s, acc in ((10, 0.145), (20, 0.25))
    ]
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"steps": steps})
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    page.wait_for_selector("#plot-evalc .main-svg")
    names = page.evaluate("() => document.getElementById('plot-evalc').data.map(t => t.name)")
    assert any((n or "").endswith("(n = 200)") for n in names), names
    band = page.evaluate(
        "() => document.getElementById('plot-evalc').data.find(t => t.fill === 'tonexty')"
    )
    assert band and band["name"] == "95% interval, n = 200", band
    # Wilson at 29/200: [0.103, 0.200]
    assert band["y"][0] == pytest.approx(0.1033, abs=2e-3)
    page.click("button[data-tab='summary']")
    row = page.locator("#summary-table tr", has_text="eval/accuracy")
    assert row.locator("td").nth(1).inner_text() == "0.25 (n = 200)"


def test_at_800_px_nothing_covers_the_progress_and_the_table_says_it_scrolls(
    page: Any, ui_server: Any, grpo_and_conspo: Any
) -> None:
    """Issue 37 item 11: at 800 px the pinned actions column covered the algorithm, ε and the
    progress, and tables cut off at the edge gave no cue that they scroll."""
    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{ui_server.url}/")
    _, c = grpo_and_conspo
    row = f'tr[data-id="{c["id"]}"]'
    page.wait_for_selector(row)
    # one moment's layout: every cell ends left of the actions cell (none is under it)
    rights, actions = page.evaluate(
        """row => { const tds = [...document.querySelector(row).children];
            const last = tds.pop().getBoundingClientRect().left;
            return [tds.filter(td => td.offsetParent).map(td => td.getBoundingClientRect().right),
                    last]; }""",
        row,
    )
    assert rights and all(r <= actions + 1 for r in rights), (rights, actions)
    wrap = page.locator(".table-wrap").first
    wait_until(page, lambda: "cue-right" in (wrap.get_attribute("class") or ""), what="a cue")
    wrap.evaluate("el => { el.scrollLeft = el.scrollWidth; }")
    wait_until(page, lambda: "cue-left" in (wrap.get_attribute("class") or ""), what="cue left")
    assert "cue-right" not in (wrap.get_attribute("class") or "")


def test_a_series_of_one_point_is_drawn(page: Any, ui_server: Any) -> None:
    """A line through one point draws nothing: a metric logged once so far showed axes and a
    legend and no point (the walk of issue 49: eval/problems, logged at the final step)."""
    run = ui_server.external_run(f"i49-one-{uuid.uuid4().hex[:6]}", {"steps": 20}, total_steps=20)
    steps = [{"step": 10, "metrics": {"sep/gap": 0.25}}]
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"steps": steps})
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    modes_of_gap = """() => [...document.querySelectorAll('.js-plotly-plot')]
        .flatMap(el => el.data || []).filter(t => t.meta && t.meta.key === 'sep/gap')
        .map(t => t.mode)"""
    page.wait_for_function(f"({modes_of_gap})().length > 0", timeout=60_000)
    modes = page.evaluate(modes_of_gap)
    assert all("markers" in m for m in modes), modes


def test_a_constant_sparkline_says_its_value(
    page: Any, ui_server: Any, grpo_and_conspo: Any
) -> None:
    """GRPO's clip fraction, 0 at every step: the sparkline column's head read "y −0.5 … 0.5",
    the padding that centres a flat line, as if the runs had those values; it says the value.
    Drawn on its own scale (no shared range), a flat line sat on the cell's floor."""
    g, _ = grpo_and_conspo
    page.goto(f"{ui_server.url}/?q=i14-grpo&metric=grpo/clip_frac")
    line = f'tr[data-id="{g["id"]}"] svg.spark path'
    page.wait_for_selector(line, state="attached")  # flat: 0 px high, never "visible"
    assert page.inner_text("#spark-head .spark-scale") == "y = 0, constant"
    flat = """async () => {
        const { sparklines } = await import('/static/util.js');
        const svg = sparklines([{ ys: [0, 0, 0] }], { height: 24 });
        return [...svg.querySelector('path').getAttribute('d').matchAll(/,([\\d.]+)/g)]
            .map(m => Number(m[1]));
    }"""
    assert page.evaluate(flat) == [12, 12, 12]  # mid-cell
