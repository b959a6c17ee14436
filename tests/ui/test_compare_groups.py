"""The compare page's group difference curve (paired by seed: the mean of per-seed differences,
with n at each step), and the comparison report opened from disk with no network request."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.ui.conftest import fake_metrics, offline_report
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser
KEY = "sep/gap"
# (algorithm, seed) → offset of the logged curve; conspo seed 1 stops at step 20
OFFSETS = {("grpo", 0): 0.0, ("grpo", 1): 0.1, ("conspo", 0): 0.05, ("conspo", 1): 0.2}
LAST = {("conspo", 1): 20}


@pytest.fixture(scope="module")
def four_runs(ui_server: Any) -> dict[tuple[str, int], int]:
    tag = f"gdiff-{uuid.uuid4().hex[:6]}"
    ids = {}
    for (algorithm, seed), offset in OFFSETS.items():
        run = ui_server.external_run(
            f"{tag}-{algorithm}-s{seed}",
            {"algorithm": algorithm, "seed": seed, "steps": 30},
            algorithm=algorithm,
            tags=[tag],
            total_steps=30,
        )
        ui_server.log(run["id"], range(1, LAST.get((algorithm, seed), 30) + 1), offset=offset)
        ids[(algorithm, seed)] = run["id"]
    return ids


def gap(algorithm: str, seed: int, step: int) -> float:
    return fake_metrics(step, OFFSETS[(algorithm, seed)])[KEY]


def open_paired_comparison(page: Any, ui_server: Any, four_runs: Any) -> str:
    """The compare page of all four runs grouped by algorithm against GRPO, once its difference
    curve is drawn paired by seed; the run ids as the URL lists them."""
    ids = ",".join(str(i) for i in four_runs.values())
    page.goto(
        f"{ui_server.url}/compare?runs={ids}&keys={KEY}&group=algorithm&smooth=0"
        "&base=algorithm%3Dgrpo"
    )
    page.wait_for_selector('[data-pairing="paired"]')
    return ids


def test_group_difference_is_paired_by_seed(
    page: Any, ui_server: Any, four_runs: Any, shot: Any
) -> None:
    open_paired_comparison(page, ui_server, four_runs)
    trace = wait_until(
        page,
        lambda: page.evaluate(
            """() => (document.getElementById('plot-g-sep_gap')?.data || [])
                 .find(t => t.meta && t.meta.pairing)"""
        ),
        what="group difference trace",
    )
    assert trace["name"].startswith("algorithm=conspo − algorithm=grpo (paired, 2 seeds)")
    steps = [round(x) for x in trace["x"]]
    values = zip(trace["meta"]["raw"], trace["meta"]["n"], strict=True)
    by_step = dict(zip(steps, values, strict=True))
    for step in (5, 12, 20):  # both seeds: the mean of the per-seed differences
        d = [gap("conspo", s, step) - gap("grpo", s, step) for s in (0, 1)]
        assert by_step[step][0] == pytest.approx(sum(d) / 2, abs=1e-9)
        assert by_step[step][1] == 2
    # past step 20 only seed 0 is paired: n = 1, drawn dotted (not on the solid line)
    assert by_step[25] == (pytest.approx(gap("conspo", 0, 25) - gap("grpo", 0, 25)), 1)
    solid = dict(zip(steps, trace["y"], strict=True))
    assert solid[25] is None and solid[12] is not None
    note = page.inner_text('[data-chart="g-sep_gap"] .chart-note')
    assert "paired by seed" in note
    shot(page, "compare_group_difference")

    # the baseline is a choice: against conspo the difference flips sign
    page.select_option("#diff-base", "algorithm=conspo")
    flipped = wait_until(
        page,
        lambda: page.evaluate(
            """() => (document.getElementById('plot-g-sep_gap')?.data || [])
                 .find(t => t.meta && t.meta.pairing && /− algorithm=conspo/.test(t.name))"""
        ),
        what="flipped difference",
    )
    at12 = [round(x) for x in flipped["x"]].index(12)
    assert flipped["meta"]["raw"][at12] == pytest.approx(-by_step[12][0], abs=1e-9)
    assert "base=algorithm%3Dconspo" in page.url or "base=algorithm=conspo" in page.url


def test_unmatched_seeds_fall_back_to_welch(page: Any, ui_server: Any, four_runs: Any) -> None:
    # conspo seed 1 vs grpo seed 0: no seed in common, so the difference is unpaired
    ids = f"{four_runs[('grpo', 0)]},{four_runs[('grpo', 1)]},{four_runs[('conspo', 1)]}"
    page.goto(f"{ui_server.url}/compare?runs={ids}&keys={KEY}&group=algorithm&smooth=0")
    page.wait_for_selector('[data-pairing="welch"]')
    trace = page.evaluate(
        "document.getElementById('plot-g-sep_gap').data.find(t => t.meta && t.meta.pairing)"
    )
    at = [round(x) for x in trace["x"]].index(10)
    want = gap("conspo", 1, 10) - (gap("grpo", 0, 10) + gap("grpo", 1, 10)) / 2
    assert trace["meta"]["raw"][at] == pytest.approx(want, abs=1e-9)
    assert trace["meta"]["n"][at] == 3


def test_comparison_report_and_csv(
    page: Any, ui_server: Any, browser: Any, four_runs: Any, tmp_path: Any
) -> None:
    ids = open_paired_comparison(page, ui_server, four_runs)
    with page.expect_download() as pending:
        page.click("#report-html")
    report = tmp_path / "comparison.html"
    pending.value.save_as(report)

    # the CSV: each run's mean over its last 3 points, by hand
    csv = ui_server.http.get(
        f"/api/compare/objective.csv?runs={ids}&key={KEY}&group=algorithm&k=3"
    ).text.splitlines()
    assert csv[0] == "group,run_id,name,seed,status,metric,reduce,window_start,window_points,value"
    rows = {(r.split(",")[0], int(r.split(",")[3])): r.split(",") for r in csv[1:]}
    for (algorithm, seed), run_id in four_runs.items():
        last = LAST.get((algorithm, seed), 30)
        row = rows[(f"algorithm={algorithm}", seed)]
        want = sum(gap(algorithm, seed, s) for s in range(last - 2, last + 1)) / 3
        assert int(row[1]) == run_id and row[7:9] == [str(last - 2), "3"]
        assert float(row[9]) == pytest.approx(want, abs=1e-9)
    bad = ui_server.http.get(f"/api/compare/objective.csv?runs={ids}&k=0")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "k"]

    with offline_report(browser, report) as offline:
        line = offline.wait_for_selector("#verdict .verdict-line").inner_text()
        assert line.startswith("algorithm=conspo − algorithm=grpo = "), line
        assert offline.locator("#pair-table tbody tr").count() == 1
        offline.wait_for_selector(f'.chart[data-key="{KEY}"] .main-svg')


def test_a_studys_runs_compare_by_arm_and_an_unset_path_reads_the_same_everywhere(
    page: Any, ui_server: Any
) -> None:
    """Issue 37 item 8: a study opened on the compare page was ungrouped (15 lines, 90 rows of
    "1 of 1"); grouped by algorithm it merges ConSPO with its ablation. Its runs group by arm
    (the tag after study:<id>); a path a run lacks is "(not set)" on the page and in the CSV,
    and the sidebar's swatches follow a group-by typed on the page."""
    tag = f"arms-{uuid.uuid4().hex[:6]}"
    arms = {
        "grpo": {"algorithm": "grpo"},
        "conspo": {"algorithm": "conspo"},
        "conspo-linear": {"algorithm": "conspo", "params": {"contrast": "linear"}},
    }
    ids = []
    for arm, overrides in arms.items():
        for seed in (0, 1):
            run = ui_server.external_run(
                f"{tag}-{arm}-s{seed}",
                {**overrides, "seed": seed, "steps": 10},
                algorithm=overrides["algorithm"],
                tags=[tag, "study:9999", arm],
                total_steps=10,
            )
            ui_server.log(run["id"], range(1, 11), offset=0.05 * seed)
            ids.append(run["id"])
    assert ui_server.api("GET", f"/api/runs/{ids[-1]}")["arm"] == "conspo-linear"
    runs = ",".join(map(str, ids))
    page.goto(f"{ui_server.url}/compare?runs={runs}&keys={KEY}&group=arm&smooth=0")
    page.wait_for_selector(f'[data-key="{KEY}"] .main-svg, .chart .main-svg')

    def labels() -> set[str]:
        return set(page.evaluate("() => [...document.querySelectorAll('#diff-base option')]"
                                 ".map(o => o.value)"))  # fmt: skip

    wait_until(page, lambda: len(labels()) == 3, what="three arms")
    assert labels() == {"arm=grpo", "arm=conspo", "arm=conspo-linear"}

    def swatches() -> list[str]:
        return page.evaluate(
            "() => [...document.querySelectorAll('#run-list .swatch')]"
            ".map(s => s.style.background).filter(c => c && c !== 'rgb(229, 231, 235)')"
        )

    assert len(set(swatches())) == 3  # one colour per arm
    page.fill("#group-by", "params.contrast")
    page.press("#group-by", "Tab")
    wait_until(page, lambda: len(labels()) == 2, what="two groups")
    assert labels() == {"params.contrast=(not set)", "params.contrast=linear"}
    wait_until(page, lambda: len(set(swatches())) == 2, what="the swatches regrouped")
    csv = ui_server.http.get(
        f"/api/compare/objective.csv?runs={runs}&key={KEY}&group=params.contrast&k=3"
    ).text.splitlines()
    assert {row.split(",")[0] for row in csv[1:]} == labels()  # the page's labels, the server's
