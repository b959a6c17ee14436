"""Issue 26 in a real Chromium: every page tells the truth (see conftest.py for the stack).

Each test asserts one item of the issue on the page a user sees, and (the ``page`` fixture)
that the page logged no console error and made no request off the server."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import REQUIRE_SERVICES as REQUIRE
from tests.ui import test_compare_groups
from tests.ui.test_compare_groups import open_paired_comparison
from tests.ui.test_pages import wait_until
from tests.ui.test_study_page import TINY

pytestmark = pytest.mark.browser
four_runs = test_compare_groups.four_runs  # the compare page's grouped runs (a fixture)


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
    cell = page.wait_for_selector("td.resources", state="attached")  # an optional column
    assert cell.text_content() == "1 CPU process"


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


# (algorithm, seed) → held-out accuracy, constant over the run: d = 0.01 and 0.03, mean 0.020
ACCURACY = {("grpo", 0): 0.95, ("grpo", 1): 0.97, ("conspo", 0): 0.96, ("conspo", 1): 1.0}


@pytest.fixture(scope="module")
def near_one(ui_server: Any) -> dict[tuple[str, int], int]:
    """Two seeds per algorithm whose accuracy is near 1: a t interval from two seeds is wide
    enough to pass 1."""
    tag = f"i26-near1-{uuid.uuid4().hex[:6]}"
    ids = {}
    for (algorithm, seed), value in ACCURACY.items():
        config = {"algorithm": algorithm, "seed": seed, "steps": 5}
        run = ui_server.external_run(
            f"{tag}-{algorithm}-s{seed}", config, algorithm=algorithm, tags=[tag], total_steps=5
        )
        steps = [{"step": s, "metrics": {"eval/accuracy": value}} for s in range(1, 6)]
        ui_server.api(
            "POST",
            f"/api/runs/{run['id']}/log",
            json={"steps": steps, "status": "succeeded"},
        )
        ids[(algorithm, seed)] = run["id"]
    return ids


def test_the_report_states_only_defined_statistics_in_enough_digits(
    ui_server: Any, browser: Any, near_one: Any, tmp_path: Any
) -> None:
    """Items 3 and 4, on the comparison report (the study page's renderer): the headline has
    the digits its numbers need (tests/studies: +0.020, not +0.0); an interval of a fraction is
    cut at 1 and starred; no bootstrap from two seeds, no P(improvement) from two pairs; only the
    metric chosen is plotted, on [0, 1], its legend counting the seeds with data."""
    ids = ",".join(str(i) for i in near_one.values())
    report = tmp_path / "report.html"
    report.write_text(
        ui_server.http.get(
            f"/api/compare/report.html?runs={ids}&key=eval/accuracy&group=algorithm"
            "&baseline=algorithm%3Dgrpo&k=3"
        ).text
    )
    from tests.ui.conftest import offline_report

    with offline_report(browser, report) as page:
        line = page.wait_for_selector("#verdict .verdict-line").inner_text()
        # eval/accuracy is shown in points (× 100): d = 1 and 3 points
        assert line.startswith("algorithm=conspo − algorithm=grpo = +2.0 points ["), line
        conspo = page.locator("#arm-table tbody tr", has_text="algorithm=conspo")
        cells = [conspo.locator("td").nth(i).inner_text() for i in range(6)]
        assert cells[3].endswith(", 100] *"), cells  # the t interval, cut at 1 (100 points)
        assert cells[4] == "– (needs ≥ 3 seeds)", cells
        assert "cut to the metric's range" in page.locator(".clip-note").first.inner_text()
        pair = page.locator("#pair-table tbody tr td")
        assert pair.nth(8).inner_text() == "– (needs ≥ 3 pairs)"
        charts = page.locator("#study-charts .chart")
        page.wait_for_selector('.chart[data-key="eval/accuracy"] .main-svg')
        assert charts.count() == 1  # the metric chosen, not the separation set
        y_range = page.evaluate("() => document.querySelector('.chart')._fullLayout.yaxis.range")
        assert y_range[0] >= -0.05 and y_range[1] <= 1.05, y_range
        legend = page.evaluate(
            "() => document.querySelector('.chart').data.filter(t => t.showlegend !== false)"
            ".map(t => t.name)"
        )
        assert "algorithm=grpo (n = 2)" in legend, legend
        modes = page.evaluate("() => document.querySelector('.chart')._fullData.map(t => t.mode)")
        assert not any("markers" in m for m in modes), modes  # no dots on the band's corners
        assert "band = 95% t CI" in page.inner_text(".chart-caption")  # whole, not clipped


def test_the_run_page_shows_one_eta_and_a_fresh_sign_of_life(page: Any, ui_server: Any) -> None:
    """Item 5: the header's ETA and the details' ETA are one number, the step counts agree,
    and while steps arrive the last sign of life is seconds old, not a minute."""
    if not ui_server.has_worker:
        pytest.skip("needs the server's worker")
    config = {**TINY, "name": f"i26-eta-{uuid.uuid4().hex[:6]}", "steps": 60}
    run = ui_server.api("POST", "/api/runs", json={"config": config})["runs"][0]
    try:
        page.goto(f"{ui_server.url}/runs/{run['id']}")
        label = page.locator("#run-progress .plabel")
        wait_until(page, lambda: "ETA" in label.inner_text(), timeout=240, what="an ETA")
        for _ in range(3):
            # one snapshot (the page re-renders every 2 s): "12/60 · ETA 8s", step, ETA
            header, step, eta, alive = page.evaluate(
                "() => ['#run-progress .plabel', '#meta-step', '#meta-eta', '#meta-heartbeat']"
                ".map(s => document.querySelector(s).textContent)"
            )
            if "ETA" not in header:
                break  # finished meanwhile
            assert header.split(" · ETA ")[1] == eta, (header, eta)
            assert header.split(" · ")[0].replace("/", " / ") == step, (header, step)
            assert alive == "just now" or (alive.endswith("s ago") and "m" not in alive), alive
            page.wait_for_timeout(1500)
    finally:
        ui_server.http.post(f"/api/runs/{run['id']}/cancel")  # a 409 if it finished meanwhile


@pytest.fixture(scope="module")
def on_policy_pair(ui_server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GRPO and a ConSPO run, on-policy (one update per batch), refill off, each logging every
    view: ConSPO's softmax ones, GRPO's clipped one, dynamic sampling, the off-policy ratio and
    the verifier reward (the pass rate again)."""
    on_policy = {"optim": {"mini_batches": 1, "epochs": 1}, "params": {"refill_groups": False}}
    views = {
        "conspo/p_pos": 0.4,
        "conspo/hard_neg_share": 0.5,
        "grpo/weight": 0.3,
        "grpo/clip_gap": 0.0,
        "batch/refill_rounds": 0.0,
        "offpolicy/ratio_mean": 1.0,
        "reward/verifier": 0.5,
    }
    runs = []
    for algorithm in ("grpo", "conspo"):
        run = ui_server.external_run(
            f"i26-views-{algorithm}-{uuid.uuid4().hex[:4]}",
            {**on_policy, "algorithm": algorithm, "steps": 10},
            algorithm=algorithm,
            total_steps=10,
        )
        ui_server.log(run["id"], range(1, 11))
        steps = [{"step": s, "metrics": views} for s in range(1, 11)]
        ui_server.api(
            "POST", f"/api/runs/{run['id']}/log", json={"steps": steps, "status": "succeeded"}
        )
        runs.append(run)
    return runs[0], runs[1]


def test_panels_that_do_not_apply_are_not_drawn(
    page: Any, ui_server: Any, on_policy_pair: Any
) -> None:
    """Item 6: a GRPO run has no ConSPO softmax panels and no ConSPO margin in its summary; a
    ConSPO run no GRPO view; refill off, no dynamic-sampling panel; on-policy, the off-policy
    section is one line saying why; reward/verifier is not a second pass-rate panel."""
    grpo, conspo = on_policy_pair
    page.goto(f"{ui_server.url}/runs/{grpo['id']}")
    page.wait_for_selector("#plot-gap .main-svg")
    for chart in ("ppos", "hardneg", "margin", "refill", "ratio", "other-reward/verifier"):
        assert page.locator(f'[data-chart="{chart}"]').count() == 0, chart
    assert page.locator('[data-chart="grpo"]').count() == 1
    folded = page.locator('[data-section="offpolicy"][data-folded="1"]')
    assert "one optimiser update per rollout batch" in folded.inner_text()
    page.click('.tabs button[data-tab="summary"]')
    summary = page.inner_text("#summary-table")
    assert "conspo/margin" not in summary and "conspo/p_pos" not in summary
    assert "sep/gap" in summary

    page.goto(f"{ui_server.url}/runs/{conspo['id']}")
    page.wait_for_selector("#plot-ppos .main-svg")
    assert page.locator('[data-chart="grpo"]').count() == 0
    assert page.locator('[data-chart="hardneg"]').count() == 1


def test_regrouping_retitles_the_difference_and_its_note_stays_clear(
    page: Any, ui_server: Any, four_runs: Any
) -> None:
    """Item 7: regrouped by another key, the difference chart's title names the new baseline;
    its note (here "unpaired": the seed groups share no seeds) is a line of its own above the
    plot, whole, never under the legend."""
    open_paired_comparison(page, ui_server, four_runs)
    title = page.locator('[data-chart="g-sep_gap"] .chart-title')
    assert "algorithm=grpo" in title.inner_text()
    page.fill("#group-by", "seed")
    page.dispatch_event("#group-by", "change")
    wait_until(page, lambda: "seed=0" in title.inner_text(), what="the new baseline in the title")
    note = page.locator('[data-chart="g-sep_gap"] .chart-note')
    wait_until(page, lambda: "unpaired" in note.inner_text(), what="an unpaired note")
    box = page.evaluate(
        """() => {
            const card = document.querySelector('[data-chart="g-sep_gap"]');
            const n = card.querySelector('.chart-note').getBoundingClientRect();
            const legend = card.querySelector('.legend').getBoundingClientRect();
            const el = card.querySelector('.chart-note');
            return {noteBottom: n.bottom, legendTop: legend.top,
                    clipped: el.scrollWidth > el.clientWidth + 1};
        }"""
    )
    assert box["noteBottom"] <= box["legendTop"] and not box["clipped"], box


def test_table_headers_never_cover_their_rows(page: Any, ui_server: Any, four_runs: Any) -> None:
    """Item 8: the studies list's study link is the element under the pointer (not the header
    cell), and so is the first row of compare's summary by group."""
    body = {
        "name": f"i26-click-{uuid.uuid4().hex[:6]}",
        "config": TINY,
        "arms": [{"name": "grpo", "overrides": {"algorithm": "grpo"}}],
        "seeds": [0, 1],
        "objective": {"metric": "eval/accuracy", "reduce": "last", "k": 1},
        "concurrency": 1,
    }
    study = ui_server.api("POST", "/api/studies", json=body)
    ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
    on_top = """sel => {
        const el = document.querySelector(sel);
        const r = el.getBoundingClientRect();
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return el.contains(hit) || hit.contains(el) ? 'ok' : hit.outerHTML.slice(0, 80); }"""
    page.goto(f"{ui_server.url}/studies")
    link = f'#studies-table a[href="/studies/{study["id"]}"]'
    page.wait_for_selector(link)
    assert page.evaluate(on_top, link) == "ok"
    page.click(link)
    page.wait_for_url(f"**/studies/{study['id']}")

    open_paired_comparison(page, ui_server, four_runs)
    first = "#group-summary tbody tr:first-child td:first-child"
    page.wait_for_selector(first)
    page.locator(first).scroll_into_view_if_needed()
    assert page.evaluate(on_top, first) == "ok"


def test_pipelines_have_a_list_page_and_a_missing_study_is_a_clear_404(
    page: Any, ui_server: Any
) -> None:
    """Item 12: /pipelines lists the pipelines, linked from the top bar; /studies/999999 says
    it is not there (a 404), not "loading…" for ever."""
    config = {**TINY, "steps": 1}
    made = ui_server.api(
        "POST",
        "/api/pipelines",
        json={"name": f"i26-list-{uuid.uuid4().hex[:4]}", "stages": [config, config]},
    )
    ui_server.api("POST", f"/api/pipelines/{made['id']}/cancel")
    page.goto(f"{ui_server.url}/")
    page.click("#nav-pipelines")
    page.wait_for_url("**/pipelines")
    row = page.wait_for_selector(f'#pipelines-table tr[data-id="{made["id"]}"]')
    assert made["name"] in row.inner_text()
    page.click(f'#pipelines-table a[href="/pipelines/{made["id"]}"] >> nth=0')
    page.wait_for_url(f"**/pipelines/{made['id']}")

    page.problems.allow_http_error(404, "/studies/999999")
    response = page.goto(f"{ui_server.url}/studies/999999")
    assert response.status == 404
    assert "There is no study 999999" in page.inner_text("main")


def test_the_run_page_draws_its_charts_before_the_rollout_sample_arrives(
    page: Any, ui_server: Any, on_policy_pair: Any
) -> None:
    """Item 11: the sampled rollouts (megabytes on a long run) load after the charts: with their
    request held back, the metric panels still draw; the heatmap fills in once it is let go."""
    grpo, _ = on_policy_pair
    held: list[Any] = []
    page.route("**/rollouts?limit=*", lambda route: held.append(route))
    page.goto(f"{ui_server.url}/runs/{grpo['id']}")
    page.wait_for_selector("#plot-gap .main-svg")  # drawn while the rollouts are still held
    wait_until(page, lambda: held, what="the rollout sample's request")
    assert "loading the sampled rollouts" in page.inner_text('[data-chart="dist"]')
    for route in held:
        route.continue_()
    page.wait_for_selector("#plot-dist .main-svg")


def test_choosing_dapo_in_the_run_form_gives_a_valid_config(page: Any, ui_server: Any) -> None:
    """Item 10: DAPO's default overlong buffer no longer exceeds the form's response cap; the
    algorithm's help does not list four of the registered objectives."""
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    help_text = page.inner_text('[data-field="config.algorithm"] .help')
    assert "dapo or dr_grpo" not in help_text, help_text
    page.select_option('[name="config.algorithm"]', "dapo")
    page.wait_for_selector('[name="config.params.clip_high"]')
    box = page.locator("#estimate")
    wait_until(page, lambda: box.get_attribute("data-pending") is None, what="the settled estimate")
    assert "fix the fields" not in box.inner_text(), box.inner_text()
    assert '"algorithm": "dapo"' in page.inner_text("#preview")
    assert page.locator(".field.has-error").count() == 0


def test_legends_count_the_seeds_with_data_and_the_hover_gives_n_per_step(
    page: Any, ui_server: Any, four_runs: Any, tmp_path: Any
) -> None:
    """Item 3's legends: ConSPO's seed 1 stops at step 20 of 30, so 2 seeds have data up to
    step 20 and 1 after it. A legend cannot change with the step: it gives the range (n = 1–2),
    never the seeds planned or the most seeds at any step, and the hover gives n at each step.
    On the compare page and in the study renderer (the comparison report draws with it)."""
    ids = open_paired_comparison(page, ui_server, four_runs)
    traces = wait_until(
        page,
        lambda: page.evaluate("() => document.getElementById('plot-m-sep_gap')?.data"),
        what="the grouped sep/gap chart",
    )
    legend = [t["name"] for t in traces if t.get("showlegend") is not False]
    assert "algorithm=conspo (n = 1–2)" in legend and "algorithm=grpo (n = 2)" in legend, legend
    conspo = next(t for t in traces if t["name"].startswith("algorithm=conspo (n"))
    hover = dict(zip([round(x) for x in conspo["x"]], conspo["text"], strict=True))
    assert hover[12] == "n = 2 of 2" and hover[25] == "n = 1 of 2", hover

    report = tmp_path / "report.html"
    report.write_text(
        ui_server.http.get(
            f"/api/compare/report.html?runs={ids}&key={test_compare_groups.KEY}"
            "&group=algorithm&baseline=algorithm%3Dgrpo&k=3"
        ).text
    )
    from tests.ui.conftest import offline_report

    with offline_report(page.context.browser, report) as opened:
        opened.wait_for_selector(".chart .main-svg")
        traces = opened.evaluate("() => document.querySelector('.chart').data")
        legend = [t["name"] for t in traces if t.get("showlegend") is not False]
        assert "algorithm=conspo (n = 1–2)" in legend and "algorithm=grpo (n = 2)" in legend
        conspo = next(t for t in traces if t["name"].startswith("algorithm=conspo (n"))
        hover = dict(zip(conspo["x"], conspo["text"], strict=True))
        assert hover[12] == "n = 2 of 2" and hover[25] == "n = 1 of 2", hover


# Every text of a chart's head and caption whose end a reader cannot see: cut by its box, an
# ellipsis, kept on one line, or running past its card.
CUT_TEXTS = """sel => [...document.querySelectorAll(sel)].filter(el => el.textContent.trim())
  .map(el => {
    const css = getComputedStyle(el);
    const card = el.closest('.chart-card').getBoundingClientRect();
    const box = el.getBoundingClientRect();
    return {text: el.textContent.slice(0, 50), css: css.textOverflow + ' ' + css.whiteSpace,
            cut: el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1,
            past: box.right > card.right + 1 || box.left < card.left - 1,
            ellipsis: css.textOverflow === 'ellipsis', nowrap: css.whiteSpace === 'nowrap'};
}).filter(r => r.cut || r.past || r.ellipsis || r.nowrap)"""
HEADS = ".chart-card .chart-title, .chart-card .chart-help, .chart-card .chart-note"


@pytest.mark.parametrize("width", [1440, 800])
def test_chart_help_and_captions_wrap_whole(
    page: Any, ui_server: Any, on_policy_pair: Any, four_runs: Any, tmp_path: Any, width: int
) -> None:
    """Chart help texts and captions are read whole: they wrap, never end in an ellipsis or run
    past the card, on the run page, the compare page and the study renderer's curves."""
    page.set_viewport_size({"width": width, "height": 900})
    grpo, _ = on_policy_pair
    page.goto(f"{ui_server.url}/runs/{grpo['id']}")
    page.wait_for_selector("#plot-gap .main-svg")
    helps = page.locator(".chart-card .chart-help")
    assert helps.count() > 5
    assert page.evaluate(CUT_TEXTS, HEADS) == []

    ids = open_paired_comparison(page, ui_server, four_runs)
    page.wait_for_selector("#plot-m-sep_gap .main-svg")
    assert page.evaluate(CUT_TEXTS, HEADS) == []

    report = tmp_path / "report.html"
    report.write_text(
        ui_server.http.get(
            f"/api/compare/report.html?runs={ids}&key={test_compare_groups.KEY}"
            "&group=algorithm&baseline=algorithm%3Dgrpo&k=3"
        ).text
    )
    from tests.ui.conftest import offline_report

    with offline_report(page.context.browser, report) as opened:
        opened.set_viewport_size({"width": width, "height": 900})
        opened.wait_for_selector(".chart .main-svg")
        assert opened.evaluate(CUT_TEXTS, ".chart-card .chart-caption, .chart-card h4") == []


def test_the_first_requests_travel_while_plotly_loads(
    page: Any, ui_server: Any, on_policy_pair: Any
) -> None:
    """The first chart's 1.5 s: with Plotly's script held back, the run page has already asked
    for the run, its keys and its charted series (its <head> sends them), and its modules have
    loaded; let go, it draws from those answers without asking again. The study and compare
    pages send theirs the same way (compare: its series too, asked for once)."""
    grpo, conspo = on_policy_pair
    held: list[Any] = []
    page.route("**/static/plotly*.js", lambda route: held.append(route))
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url.removeprefix(ui_server.url)))
    page.goto(f"{ui_server.url}/runs/{grpo['id']}", wait_until="commit")
    base = f"/api/runs/{grpo['id']}"
    wanted = (base, f"{base}/metrics/keys", f"{base}/metrics?keys=sep%2Fpos_score")

    def sent() -> bool:
        return all(any(u == w or u.startswith(w + "%") for u in asked) for w in wanted)

    wait_until(page, lambda: held and sent(), what="the run page's requests before Plotly")
    assert "/static/run_charts.js" in asked  # the whole module graph, named in <head>
    for route in held:
        route.continue_()
    page.wait_for_selector("#plot-gap .main-svg")
    for w in wanted:
        assert len([u for u in asked if u == w or u.startswith(w + "%")]) == 1, (w, asked)

    study = ui_server.api(
        "POST",
        "/api/studies",
        json={
            "name": f"i26-early-{uuid.uuid4().hex[:6]}",
            "config": TINY,
            "arms": [{"name": "grpo", "overrides": {"algorithm": "grpo"}}],
            "seeds": [0, 1],
            "objective": {"metric": "eval/accuracy", "reduce": "last", "k": 1},
            "concurrency": 1,
        },
    )
    ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
    held.clear()
    asked.clear()
    page.goto(f"{ui_server.url}/studies/{study['id']}", wait_until="commit")
    wait_until(page, lambda: held and f"/api/studies/{study['id']}" in asked, what="study")
    for route in held:
        route.continue_()
    page.wait_for_selector("#arm-table")

    held.clear()
    asked.clear()
    page.goto(f"{ui_server.url}/compare?runs={grpo['id']},{conspo['id']}", wait_until="commit")
    wait_until(
        page,
        lambda: held and [u for u in asked if u.startswith("/api/compare?")],
        what="the compare page's series before Plotly",
    )
    for route in held:
        route.continue_()
    page.wait_for_selector("#compare-charts .main-svg")
    series = [u for u in asked if u.startswith("/api/compare?")]
    assert len(series) == 1, series  # the default metrics, asked for once


def test_charts_draw_with_plotly_cartesian_bundle_unless_a_search_needs_parcoords(
    ui_server: Any,
) -> None:
    """The run, compare and study pages load Plotly's cartesian bundle (a third of the full one;
    node_modules, package.json), the same plotly.js version as the full bundle; a search study's
    page, whose parallel coordinates the cartesian bundle lacks, loads the full one."""
    import plotly

    from backend.assets import PLOTLY_CARTESIAN

    full = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    served = ui_server.http.get("/static/plotly-cartesian.min.js")
    assert served.status_code == 200
    version = re.compile(rb"plotly\.js (?:\([\w -]+\) )?v([\d.]+)")  # the banner
    cartesian, whole = (version.search(b[:300]) for b in (served.content, full))
    assert cartesian and whole and cartesian[1] == whole[1]
    if PLOTLY_CARTESIAN.is_file():
        assert served.content == PLOTLY_CARTESIAN.read_bytes()
        assert len(served.content) < len(full) / 2
    elif REQUIRE:
        pytest.fail("node_modules lacks plotly.js-cartesian-dist-min: run `npm ci`")
    src = re.compile(r'<script src="(/static/plotly[^"]*)"')
    for path in ("/runs/1", "/compare"):
        assert src.findall(ui_server.http.get(path).text) == ["/static/plotly-cartesian.min.js"]
    body = {
        "name": f"i26-bundle-{uuid.uuid4().hex[:6]}",
        "config": {**TINY, "algorithm": "conspo"},
        "seeds": [0, 1],
        "objective": {"metric": "eval/accuracy", "reduce": "last", "k": 1},
        "concurrency": 1,
    }
    arms = ui_server.api(
        "POST", "/api/studies", json={**body, "arms": [{"name": "a", "overrides": {}}]}
    )
    search = ui_server.api(
        "POST",
        "/api/studies",
        json={
            **body,
            "arms": [],
            "search": {
                "space": {"params.tau": {"type": "float", "low": 0.5, "high": 2.0}},
                "sampler": "random",
                "trials": 2,
            },
        },
    )
    for study, bundle in ((arms, "plotly-cartesian.min.js"), (search, "plotly.min.js")):
        ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
        html = ui_server.http.get(f"/studies/{study['id']}").text
        assert src.findall(html) == [f"/static/{bundle}"], study


def _seconds(text: str) -> int:
    """ "16m 20s" / "1h 02m" / "45s" → seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def test_the_runs_list_and_the_run_page_count_down_one_eta(page: Any, ui_server: Any) -> None:
    """Issue 37 item 4: the runs list said 27m 20s and rising while the run page said 16m 16s,
    frozen. Both now show the server's ETA (the run's pace × steps left), counting down."""
    name = f"i37-eta-{uuid.uuid4().hex[:6]}"
    run = ui_server.external_run(name, {"steps": 100}, total_steps=100)
    now = time.time()
    for step, wall in ((1, now - 20), (2, now - 10)):  # 10 s a step: 98 left, ~16m 20s
        body = {"steps": [{"step": step, "metrics": {"sep/gap": 0.1}, "wall_time": wall}]}
        ui_server.api("POST", f"/api/runs/{run['id']}/log", json=body)
    page.goto(f"{ui_server.url}/?q={name}")
    row = page.locator(f'tr[data-id="{run["id"]}"] .plabel')
    wait_until(page, lambda: "ETA" in row.inner_text(), what="the list's ETA")
    listed = _seconds(row.inner_text().split("ETA ")[1])
    assert 900 <= listed <= 990, row.inner_text()
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    header = page.locator("#run-progress .plabel")
    wait_until(page, lambda: "ETA" in header.inner_text(), what="the run page's ETA")
    first = _seconds(header.inner_text().split("ETA ")[1])
    assert abs(first - listed) <= 10, (first, listed)  # one ETA, not two estimates
    wait_until(page, lambda: _seconds(header.inner_text().split("ETA ")[1]) < first,
               timeout=60, what="the ETA counting down")  # fmt: skip
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"steps": [], "status": "failed"})
