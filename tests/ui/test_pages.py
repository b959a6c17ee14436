"""The web UI in a real Chromium against a real server (see conftest.py).

Each test ends by asserting its page logged no console error, raised no uncaught exception and
made no request off the server (the ``page`` fixture). Screenshots of every page land in
artifacts/screenshots/.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.browser
SEED_TAG = f"ui-seed-{uuid.uuid4().hex[:6]}"  # unique, so a reused server holds no look-alikes


def wait_until(page: Any, check: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        page.wait_for_timeout(200)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check} (last: {last!r})")


def trace_points(page: Any, plot_id: str, name_re: str = ".") -> int:
    """Points in the first visible trace of a Plotly div whose name matches name_re."""
    return page.evaluate(
        """([id, re]) => {
            const el = document.getElementById(id);
            if (!el || !el.data) return 0;
            const t = el.data.find(
                t => t.showlegend !== false && new RegExp(re).test(t.name || ''));
            return t && t.x ? t.x.filter(v => v !== null && v !== undefined).length : 0;
        }""",
        [plot_id, name_re],
    )


@pytest.fixture(scope="module")
def two_runs(ui_server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two external runs that differ in params.tau, 30 steps each, logged over HTTP."""
    base = {"algorithm": "conspo", "steps": 40, "task": {"name": "arith"}}
    a = ui_server.external_run(
        "ui-tau10",
        {
            **base,
            "params": {"tau": 10.0, "margin_max": 0.01, "margin_warmup": 0.3, "margin": "cosine"},
        },
        tags=[SEED_TAG],
        total_steps=40,
    )
    b = ui_server.external_run(
        "ui-tau5",
        {
            **base,
            "params": {"tau": 5.0, "margin_max": 0.01, "margin_warmup": 0.3, "margin": "cosine"},
        },
        tags=[SEED_TAG],
        total_steps=40,
    )
    ui_server.log(a["id"], range(1, 31))
    ui_server.log(b["id"], range(1, 31), offset=0.05)
    return a, b


# ------------------------------------------------------------------------------------------------
# every page loads cleanly (console errors are checked by the page fixture)
# ------------------------------------------------------------------------------------------------


def test_runs_page_loads(page: Any, shot: Any, ui_server: Any, two_runs: Any) -> None:
    page.goto(f"{ui_server.url}/")
    a, b = two_runs
    page.wait_for_selector(f'tr[data-id="{a["id"]}"] svg.spark path')
    row = page.locator(f'tr[data-id="{a["id"]}"]')
    assert "ui-tau10" in row.inner_text()
    assert "30/40" in row.locator(".progress").inner_text()
    shot(page, "runs")


def test_new_run_page_renders_algorithm_params(page: Any, shot: Any, ui_server: Any) -> None:
    presets = ui_server.api("GET", "/api/presets")
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    conspo = next(a for a in presets["algorithms"] if a["name"] == "conspo")
    tau = page.input_value('[name="config.params.tau"]')
    assert float(tau) == float(conspo["defaults"]["tau"])
    tau_help = page.locator('[data-field="config.params.tau"] .help').inner_text()
    assert conspo["params_schema"]["properties"]["tau"]["description"][:20] in tau_help
    # switching the algorithm shows that algorithm's own knobs and drops the others
    page.select_option('[name="config.algorithm"]', "grpo")
    page.wait_for_selector('[name="config.params.clip_low"]')
    assert page.locator('[name="config.params.tau"]').count() == 0
    page.select_option('[name="config.algorithm"]', "conspo")
    page.wait_for_selector('[name="config.params.tau"]')
    shot(page, "new_run")


def test_new_run_page_renders_the_chosen_tasks_params(page: Any, shot: Any, ui_server: Any) -> None:
    page.problems.allow_http_error(422, "/api/runs")
    tasks = {t["name"]: t for t in ui_server.api("GET", "/api/presets")["tasks"]}
    page.goto(f"{ui_server.url}/runs/new")
    digits = '[name="config.task.params.digits"]'
    page.wait_for_selector(digits)
    arith = tasks["arith"]
    assert page.input_value(digits) == str(arith["defaults"]["digits"])
    operators_help = page.locator('[data-field="config.task.params.operators"] .help').inner_text()
    assert arith["params_schema"]["properties"]["operators"]["description"] in operators_help
    assert page.locator('[data-section="task"] .entry-desc').inner_text() == arith["description"]
    page.fill(digits, "3")
    # another task brings its own parameters (from its schema) and none of arith's
    page.select_option('[name="config.task.name"]', "jsonl")
    page.wait_for_selector('[name="config.task.params.path"]')
    assert page.locator(digits).count() == 0
    page.fill('[name="config.task.params.eval_path"]', "held.jsonl")
    # what was typed for each task survives switching back and forth
    page.select_option('[name="config.task.name"]', "arith")
    page.wait_for_selector(digits)
    assert page.input_value(digits) == "3"
    page.select_option('[name="config.task.name"]', "jsonl")
    assert page.input_value('[name="config.task.params.eval_path"]') == "held.jsonl"
    assert '"eval_path": "held.jsonl"' in page.inner_text("#preview")
    # jsonl without its path and a bad sampling value: one 422, each message on its field
    page.fill('[name="config.sampling.group_size"]', "1")
    page.click("#submit-btn")
    page.wait_for_selector('[data-field="config.task.params.path"].has-error')
    path_error = page.locator('[data-field="config.task.params.path"] .err').inner_text()
    assert "required" in path_error.lower()
    assert page.locator('[data-field="config.sampling.group_size"].has-error').count() == 1
    assert page.url.endswith("/runs/new")
    shot(page, "new_run_task")


def test_form_prefills_a_run_stored_with_the_flat_task_form(page: Any, ui_server: Any) -> None:
    flat = {"name": "countdown", "digits": 2, "operators": "+-", "num_operands": 4, "path": None,
            "eval_path": None, "eval_size": 8}  # fmt: skip
    old = ui_server.external_run("ui-flat-task", {"algorithm": "grpo", "task": flat})
    page.goto(f"{ui_server.url}/runs/new?from={old['id']}")
    page.wait_for_selector('[name="config.task.params.num_operands"]')
    assert page.input_value('[name="config.task.name"]') == "countdown"
    assert page.input_value('[name="config.task.params.digits"]') == "2"
    assert page.input_value('[name="config.task.params.num_operands"]') == "4"
    assert page.input_value('[name="config.task.eval_size"]') == "8"
    assert page.locator('[name="config.task.params.operators"]').count() == 0


def test_edit_and_rerun_keeps_the_reward_functions(page: Any, ui_server: Any) -> None:
    rewards = [
        {"name": "verifier", "weight": 1.0, "params": {}},
        {"name": "format", "weight": 0.5, "params": {"pattern": "\\d+"}},
    ]
    config = {"algorithm": "grpo", "steps": 1, "model": {"name": "tiny"}, "rewards": rewards}
    old = ui_server.external_run("ui-rewards", config)
    page.goto(f"{ui_server.url}/runs/new?from={old['id']}")
    page.wait_for_selector('[name="config.rewards.1.name"]', state="attached")
    assert page.input_value('[name="config.rewards.1.params.pattern"]') == "\\d+"
    assert page.input_value('[name="config.rewards.1.weight"]') == "0.5"
    page.fill('[name="config.rewards.1.weight"]', "0.25")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run = ui_server.api("GET", f"/api/runs/{page.url.rsplit('/', 1)[1]}")
    ui_server.stop_run(run["id"])  # the form is what is tested here
    assert run["config"]["rewards"] == [rewards[0], {**rewards[1], "weight": 0.25}]


def test_the_reward_picker_adds_a_registered_reward_with_its_weight_and_params(
    page: Any, shot: Any, ui_server: Any
) -> None:
    rewards = {r["name"]: r for r in ui_server.api("GET", "/api/presets")["rewards"]}
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.rewards.0.name"]', state="attached")
    # the verifier is always there and cannot be removed; the picker offers the others
    assert page.input_value('[name="config.rewards.0.name"]') == "verifier"
    assert page.locator('[data-field="config.rewards.0"] [data-remove]').count() == 0
    offered = page.eval_on_selector_all("#reward-choice option", "os => os.map(o => o.value)")
    assert "verifier" not in offered and {"format", "length"} <= set(offered)
    page.fill('[name="config.sampling.max_new_tokens"]', "12")
    page.select_option("#reward-choice", "length")
    page.click("#add-reward")
    buffer = '[name="config.rewards.1.params.buffer"]'
    page.wait_for_selector(buffer)  # the reward's own params, from its schema, at its defaults
    assert page.input_value(buffer) == str(rewards["length"]["defaults"]["buffer"])
    assert page.input_value('[name="config.rewards.1.weight"]') == "1"
    assert "length" not in page.eval_on_selector_all(
        "#reward-choice option", "os => os.map(o => o.value)"
    )
    page.fill('[name="config.rewards.1.weight"]', "0.5")
    page.fill(buffer, "4")
    # a reward added and removed again leaves no row behind
    page.select_option("#reward-choice", "format")
    page.click("#add-reward")
    page.wait_for_selector('[name="config.rewards.2.params.pattern"]', state="attached")
    page.click('[data-remove="config.rewards.2"]')
    assert page.locator('[name="config.rewards.2.name"]').count() == 0
    # the process reward needs the task's process signal: jsonl has none, so it is not offered
    page.select_option('[name="config.task.name"]', "jsonl")
    offered = page.eval_on_selector_all("#reward-choice option", "os => os.map(o => o.value)")
    assert "process" in rewards and "process" not in offered
    page.select_option('[name="config.task.name"]', "arith")
    shot(page, "new_run_rewards")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run = ui_server.api("GET", f"/api/runs/{page.url.rsplit('/', 1)[1]}")
    ui_server.stop_run(run["id"])  # the form is what is tested here
    assert run["config"]["rewards"] == [
        {"name": "verifier", "weight": 1.0, "params": {}},
        {"name": "length", "weight": 0.5, "params": {"buffer": 4}},
    ]


def test_run_page_shows_separation_dashboards(
    page: Any, shot: Any, ui_server: Any, two_runs: Any
) -> None:
    a, _ = two_runs
    page.goto(f"{ui_server.url}/runs/{a['id']}")
    wait_until(page, lambda: trace_points(page, "plot-gap", "^gap$") == 30, what="30 gap points")
    for plot in (
        "plot-scores",
        "plot-acc",
        "plot-margin",
        "plot-dist",
        "plot-reward",
        "plot-groups",
        "plot-evalc",
        "plot-len",
        "plot-loss",
        "plot-lr",
        "plot-clipfrac",  # the trainer's grpo/clip_frac: charts come from the catalogue
    ):
        # the rollout heatmap draws once the sample has loaded, after the line charts
        drawn = f"!!document.getElementById('{plot}').data"
        wait_until(page, lambda drawn=drawn: page.evaluate(drawn), what=f"{plot} drawn")
        y_title = page.evaluate(f"document.getElementById('{plot}').layout.yaxis.title.text")
        assert y_title, f"{plot} has no y-axis title"
    # the margin chart draws the logged m_t, a deterministic series that is never smoothed
    page.evaluate(
        "() => { const el = document.getElementById('smooth'); el.value = '0.9';"
        " el.dispatchEvent(new Event('input')); }"
    )
    wait_until(
        page,
        lambda: page.evaluate(
            "document.getElementById('plot-gap').data.some(t => (t.name || '').endsWith('raw'))"
        ),
        what="the gap chart smoothed",
    )
    names = page.evaluate("document.getElementById('plot-margin').data.map(t => t.name)")
    assert names == ["m_t"], names
    # positive and negative rollout scores are split in the distribution heatmap
    heat_names = page.evaluate("document.getElementById('plot-dist').data.map(t => t.name)")
    assert heat_names == ["correct", "wrong"], heat_names
    page.click('.tabs button[data-tab="config"]')
    assert "params.tau" in page.locator("#config-table").inner_text()
    page.click('.tabs button[data-tab="charts"]')
    shot(page, "run")


def test_run_page_shows_prompt_difficulty_only_with_prompt_data(
    page: Any, shot: Any, ui_server: Any, two_runs: Any
) -> None:
    run = ui_server.external_run("ui-prompts", {"algorithm": "grpo", "steps": 20}, total_steps=20)
    # 8 prompts per step; prompt i is solved once the step passes 2 * i: learned one by one.
    prompts = [
        {"step": s, "key": f"p{i}", "n": 4, "correct": 4 if s > 2 * i else min(i, 3) % 2}
        for s in range(1, 21)
        for i in range(8)
    ]
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"prompts": prompts})
    ui_server.log(run["id"], range(1, 21), status="succeeded")
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    wait_until(
        page,
        lambda: trace_points(page, "plot-prompt-bands", "pass rate 1") == 20,
        what="20 steps of prompt bands",
    )
    title = page.locator('[data-section="prompts"] .section-title').inner_text()
    assert title.lower() == "prompt difficulty over time"  # the CSS sets it in capitals
    fates = page.evaluate(
        "Object.fromEntries(document.getElementById('plot-prompt-fates').data"
        ".map(t => [t.name, t.y[t.y.length - 1]]))"
    )
    # p0 solved from the start; p1..p7 below 0.5 at first, all solved by step 20.
    assert fates == {
        "learned": 7, "forgotten": 0, "never solved": 0, "always solved": 1, "seen": 8,
    }  # fmt: skip
    shot(page, "run-prompts")
    # A run that logged no prompt data has no such section.
    a, _ = two_runs
    page.goto(f"{ui_server.url}/runs/{a['id']}")
    wait_until(
        page,
        lambda: (
            page.evaluate("document.getElementById('chart-sections').dataset.promptSteps") == "0"
        ),
        what="the prompt view loaded (empty)",
    )
    assert page.locator('[data-section="prompts"]').count() == 0


def test_compare_page_loads(page: Any, shot: Any, ui_server: Any, two_runs: Any) -> None:
    a, b = two_runs
    page.goto(f"{ui_server.url}/compare?runs={a['id']},{b['id']}")
    page.wait_for_selector('#config-diff tr[data-key="params.tau"]')
    wait_until(
        page,
        lambda: trace_points(page, "plot-m-sep_gap", "ui-tau10") == 30,
        what="run A on the sep/gap chart",
    )
    shot(page, "compare")


# ------------------------------------------------------------------------------------------------
# form: submit → run page; bad values → inline errors, typed values kept
# ------------------------------------------------------------------------------------------------


def test_a_busy_server_is_waited_out_and_the_run_is_made_once(page: Any, ui_server: Any) -> None:
    # The first submit meets the server's back-pressure (a 503 with Retry-After, as a full
    # pool or busy task-check helpers answer on a loaded machine; injected here through the
    # browser's router, since a real one cannot be timed): the page waits and asks again.
    posts: list[str] = []

    def busy_once(route: Any) -> None:
        if route.request.method != "POST":
            route.fallback()
            return
        posts.append(route.request.post_data or "")
        if len(posts) == 1:
            route.fulfill(
                status=503,
                headers={"Retry-After": "1", "Content-Type": "application/json"},
                body='{"detail": "every task check is busy; retry shortly"}',
            )
        else:
            route.fallback()

    page.route(f"{ui_server.url}/api/runs", busy_once)
    name = f"ui-busy-{uuid.uuid4().hex[:6]}"
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    fill_small_run(page, name)
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    assert len(posts) == 2 and posts[0] == posts[1]  # the same request, asked once more
    rows = ui_server.api("GET", f"/api/runs?q={name}")["items"]
    assert [r["name"] for r in rows] == [name]
    ui_server.stop_run(rows[0]["id"])


def test_a_503_without_retry_after_is_shown_not_retried(page: Any, ui_server: Any) -> None:
    page.problems.allow_http_error(503, "/api/runs")
    posts: list[str] = []

    def down(route: Any) -> None:
        if route.request.method != "POST":
            route.fallback()
            return
        posts.append(route.request.post_data or "")
        route.fulfill(
            status=503,
            headers={"Content-Type": "application/json"},
            body='{"detail": "database unavailable, retry later"}',
        )

    page.route(f"{ui_server.url}/api/runs", down)
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    fill_small_run(page, f"ui-down-{uuid.uuid4().hex[:6]}")
    page.click("#submit-btn")
    wait_until(page, lambda: "database unavailable" in page.inner_text("body"), 60, "the error")
    assert len(posts) == 1 and "/runs/new" in page.url


def fill_small_run(page: Any, name: str) -> None:
    page.fill('[name="config.name"]', name)
    page.fill('[name="config.steps"]', "3")
    page.fill('[name="config.sampling.prompts_per_step"]', "2")
    page.fill('[name="config.sampling.group_size"]', "2")
    page.fill('[name="config.sampling.max_new_tokens"]', "4")
    page.fill('[name="config.model.name"]', "tiny")
    page.fill('[name="config.optim.lr"]', "0.001")
    page.fill('[name="config.task.params.num_operands"]', "3")
    page.click("details.adv > summary")
    page.fill('[name="config.eval.every"]', "0")
    page.fill('[name="config.task.eval_size"]', "4")
    page.fill('[name="config.checkpoint.every"]', "0")
    page.fill('[name="tags"]', "ui-form")


def test_bad_values_show_inline_errors_and_keep_input(page: Any, shot: Any, ui_server: Any) -> None:
    # The server's 422 answers are expected here; Chromium logs each one as a network error.
    page.problems.allow_http_error(422, "/api/runs")
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    page.fill('[name="config.name"]', "keep-what-i-typed")
    page.fill('[name="config.sampling.group_size"]', "1")
    page.fill('[name="config.optim.lr"]', "fast")
    page.fill('[name="config.params.tau"]', "-3")
    page.fill('[name="seeds"]', "1, 2")
    page.click("#submit-btn")
    page.wait_for_selector(".field.has-error")

    def error(field: str) -> str:
        return page.locator(f'[data-field="{field}"] .err').inner_text()

    assert re.search(r"greater than or equal to 2", error("config.sampling.group_size"))
    assert re.search(r"valid number", error("config.optim.lr"))
    # nothing was lost and nothing navigated
    assert page.url.endswith("/runs/new")
    assert page.input_value('[name="config.name"]') == "keep-what-i-typed"
    assert page.input_value('[name="config.sampling.group_size"]') == "1"
    assert page.input_value('[name="config.optim.lr"]') == "fast"
    assert page.input_value('[name="config.params.tau"]') == "-3"
    assert page.input_value('[name="seeds"]') == "1, 2"
    assert page.locator('[data-field="config.steps"].has-error').count() == 0
    shot(page, "new_run_errors")
    # Fix those two: the algorithm's own parameters are checked next, and the error lands on
    # the params field (loc body.config.params.tau); the fixed fields lose their errors.
    page.fill('[name="config.sampling.group_size"]', "4")
    page.fill('[name="config.optim.lr"]', "0.001")
    page.click("#submit-btn")
    page.wait_for_selector('[data-field="config.params.tau"].has-error')
    assert re.search(r"greater than 0", error("config.params.tau"))
    assert page.locator(".field.has-error").count() == 1
    assert page.input_value('[name="config.params.tau"]') == "-3"
    assert page.url.endswith("/runs/new")


def test_submit_form_lands_on_run_page_and_charts_fill_live(
    page: Any, shot: Any, ui_server: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    fill_small_run(page, "ui-form-run")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run_id = int(page.url.rsplit("/", 1)[1])
    run = ui_server.api("GET", f"/api/runs/{run_id}")
    assert run["name"] == "ui-form-run" and run["config"]["sampling"]["group_size"] == 2
    assert run["config"]["task"]["params"]["num_operands"] == 3
    assert run["tags"] == ["ui-form"]
    page.wait_for_selector("#run-meta .v")
    assert f"#{run_id}" in page.locator("#run-title").inner_text()
    if not ui_server.has_worker:
        # No worker: log as the run's trainer would, so the live path is still exercised.
        page.wait_for_timeout(500)
        return
    page.evaluate("window.__same_document = true")
    # The worker trains it; the open page fills its charts from the SSE stream, no reload.
    wait_until(
        page,
        lambda: trace_points(page, "plot-loss") >= 3,
        timeout=150,
        what="3 loss points from the worker",
    )
    wait_until(
        page,
        lambda: "succeeded" in page.locator("#run-status").inner_text(),
        timeout=60,
        what="status succeeded",
    )
    wait_until(
        page,
        lambda: "last step 3" in page.locator("#points-note").inner_text(),
        what="every step drawn",
    )
    assert page.evaluate("window.__same_document === true")
    assert page.locator("#run-meta").inner_text().count("–") < 16  # worker host etc. filled
    shot(page, "run_from_form")
    # "Edit & rerun" opens the form prefilled with this run's config
    page.click("#edit-btn")
    page.wait_for_url(re.compile(rf"/runs/new\?from={run_id}$"))
    page.wait_for_selector('[name="config.params.tau"]')
    assert page.input_value('[name="config.name"]') == "ui-form-run-copy"
    assert page.input_value('[name="config.steps"]') == "3"
    assert page.input_value('[name="config.model.name"]') == "tiny"
    assert page.input_value('[name="config.task.params.num_operands"]') == "3"
    assert page.input_value('[name="tags"]') == "ui-form"


def test_form_submits_lora_a_benchmark_and_a_prompt_and_shows_the_estimate(
    page: Any, ui_server: Any
) -> None:
    bench = ui_server.data_dir / "datasets" / f"ui-bench-{uuid.uuid4().hex[:6]}.jsonl"
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text('{"problem": "1+1=", "answer": "2"}\n{"problem": "2+3=", "answer": "5"}\n')
    page.problems.allow_http_error(422, "/api/runs")
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.model.lora.rank"]')
    fill_small_run(page, "ui-lora-bench")  # opens Advanced
    estimate = page.locator("#estimate")

    def settled_estimate() -> int | None:
        """The estimate for the form as it is now (none while an edit's answer is pending)."""
        if estimate.get_attribute("data-pending") or "Memory ≈" not in estimate.inner_text():
            return None
        return int(estimate.get_attribute("data-total-bytes"))

    small = wait_until(page, settled_estimate, what="the memory estimate")
    page.fill('[name="config.sampling.group_size"]', "64")
    large = wait_until(page, settled_estimate, what="the estimate for G=64")
    assert large > small
    page.fill('[name="config.sampling.group_size"]', "2")
    assert wait_until(page, settled_estimate, what="the estimate for G=2") == small
    assert "over" not in (estimate.get_attribute("class") or "")

    page.fill('[name="config.model.lora.rank"]', "8")
    page.fill('[name="config.model.lora.target_modules"]', "q_proj, v_proj")
    page.select_option("#f-prompt-template-choice", "boxed")
    page.select_option('[name="config.sampling.engine"]', "hf")
    page.click('[data-add="config.eval.benchmarks"]')
    page.click('[data-add="config.eval.benchmarks"]')
    page.fill('[name="config.eval.benchmarks.0.name"]', "mini")
    page.fill('[name="config.eval.benchmarks.0.k"]', "2")
    page.fill('[name="config.eval.benchmarks.0.fields.answer"]', "answer")
    page.fill('[name="config.eval.benchmarks.1.name"]', "dropped")
    page.click('[data-remove="config.eval.benchmarks.1"]')
    assert page.locator('[name="config.eval.benchmarks.1.name"]').count() == 0
    # The path is still empty: the 422 lands next to the benchmark row's path field.
    page.click("#submit-btn")
    path_field = page.locator('[data-field="config.eval.benchmarks.0.path"]')
    wait_until(page, lambda: "has-error" in (path_field.get_attribute("class") or ""))
    assert page.input_value('[name="config.eval.benchmarks.0.name"]') == "mini"
    page.fill('[name="config.eval.benchmarks.0.path"]', str(bench))
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run = ui_server.api("GET", f"/api/runs/{page.url.rsplit('/', 1)[1]}")
    config = run["config"]
    assert config["model"]["lora"] == {
        "rank": 8,
        "alpha": 32.0,
        "dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
    }
    assert config["eval"]["benchmarks"] == [
        {
            "name": "mini",
            "source": "file",
            "path": str(bench),
            "k": 2,
            "limit": None,
            "fields": {"question": "auto", "answer": "answer", "solution": None},
        }
    ]
    assert config["prompt"]["template"] == "boxed" and config["sampling"]["engine"] == "hf"
    ui_server.stop_run(run["id"])  # the form is what is tested here


def test_several_seeds_land_on_the_runs_list_of_their_group(page: Any, ui_server: Any) -> None:
    """After "Start 2 runs": the runs list of that group, opened, both runs listed (not a
    compare page with nothing to draw yet); its Compare button opens them side by side."""
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    fill_small_run(page, "ui-seed-group")
    page.fill('[name="config.steps"]', "1")
    page.fill('[name="seeds"]', "7, 8")
    wait_until(page, lambda: page.inner_text("#submit-btn") == "Start 2 runs", what="button")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/\?group=\w+"))
    group_id = re.search(r"group=(\w+)", page.url).group(1)
    runs = ui_server.api("GET", f"/api/runs?group_id={group_id}")["items"]
    ids = sorted(r["id"] for r in runs)
    try:
        assert sorted(r["seed"] for r in runs) == [7, 8]
        for i in ids:
            page.wait_for_selector(f'tr[data-id="{i}"]')  # visible: the group lands opened
        listed = page.eval_on_selector_all(
            "#runs-body tr[data-id]", "rs => rs.map(r => +r.dataset.id)"
        )
        assert sorted(listed) == ids
        assert "ui-seed-group" in page.inner_text("#group-chip")
        page.click(f'tr.group-row[data-group="g:{group_id}"] a:has-text("Compare")')
        page.wait_for_url(re.compile(r"/compare\?runs="))
        row = page.wait_for_selector('#config-diff tr[data-key="seed"]')
        assert [c.inner_text() for c in row.query_selector_all("td")][1:] == ["7", "8"]
    finally:
        for i in ids:  # keep the shared CPUs for the other tests
            ui_server.http.post(f"/api/runs/{i}/cancel")


def test_clone_and_cancel_from_run_page(page: Any, ui_server: Any) -> None:
    """Clone a long run from its page, cancel the (queued) clone, then the running original."""
    config = {
        "name": "ui-long",
        "algorithm": "conspo",
        "steps": 400,
        "model": {"name": "tiny"},
        "task": {"eval_size": 4},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
    }
    created = ui_server.api("POST", "/api/runs", json={"config": config, "tags": ["ui-long"]})
    long_id = created["runs"][0]["id"]

    def status(run_id: int) -> str:
        return ui_server.api("GET", f"/api/runs/{run_id}")["status"]

    if ui_server.has_worker:
        wait_until(page, lambda: status(long_id) == "running", timeout=90, what="long run starts")
    page.goto(f"{ui_server.url}/runs/{long_id}")
    page.wait_for_selector("#run-meta .v")
    page.click("#clone-btn")
    page.wait_for_url(
        lambda url: re.search(r"/runs/\d+$", url) and not url.endswith(f"/runs/{long_id}")
    )
    clone_id = int(page.url.rsplit("/", 1)[1])
    clone = ui_server.api("GET", f"/api/runs/{clone_id}")
    assert clone["config"]["steps"] == 400 and clone["status"] == "queued"  # worker is busy
    page.wait_for_selector("#cancel-btn:not([hidden])")
    page.once("dialog", lambda d: d.accept())  # cancel asks first
    page.click("#cancel-btn")  # queued → cancelled at once
    wait_until(
        page,
        lambda: page.locator("#run-status").inner_text().strip() == "cancelled",
        what="clone cancelled",
    )
    assert status(clone_id) == "cancelled"
    # the running original: cancel requested, the worker stops it within seconds
    page.goto(f"{ui_server.url}/runs/{long_id}")
    page.wait_for_selector("#cancel-btn:not([hidden])")
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel-btn")
    wait_until(
        page,
        lambda: page.locator("#run-status").inner_text().strip() == "cancelled",
        timeout=60,
        what="running run cancelled (status pushed over SSE)",
    )
    assert status(long_id) == "cancelled"


# ------------------------------------------------------------------------------------------------
# live: an HTTP producer logs; the chart gains points and keeps the user's zoom
# ------------------------------------------------------------------------------------------------


def test_live_chart_gains_points_without_resetting_zoom(page: Any, ui_server: Any) -> None:
    run = ui_server.external_run(
        "ui-live", {"algorithm": "conspo", "params": {"tau": 10.0}}, total_steps=50
    )
    ui_server.log(run["id"], range(1, 6))
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    wait_until(page, lambda: trace_points(page, "plot-gap", "^gap$") == 5, what="5 points")
    page.evaluate("window.__same_document = true")
    page.evaluate("Plotly.relayout('plot-gap', {'xaxis.range': [1, 3]})")
    for start in (6, 11):  # two separate producer calls, as a trainer logging as it goes
        ui_server.log(run["id"], range(start, start + 5))
        wait_until(
            page,
            lambda s=start: trace_points(page, "plot-gap", "^gap$") == s + 4,
            what=f"{start + 4} points",
        )
    rng = page.evaluate("document.getElementById('plot-gap').layout.xaxis.range")
    assert [round(v, 6) for v in rng] == [1, 3], f"zoom was reset: {rng}"
    assert page.evaluate("window.__same_document === true")
    # the progress in the header follows too
    wait_until(
        page,
        lambda: "15/50" in page.locator("#run-progress").inner_text(),
        what="header progress 15/50",
    )
    ui_server.log(run["id"], [16], status="succeeded")
    wait_until(
        page, lambda: "succeeded" in page.locator("#run-status").inner_text(), what="status event"
    )


# ------------------------------------------------------------------------------------------------
# runs page: filters, live row updates, select → compare; compare: diff + URL state
# ------------------------------------------------------------------------------------------------


def test_runs_page_filters_updates_live_and_selects_for_compare(
    page: Any, shot: Any, ui_server: Any, two_runs: Any
) -> None:
    a, b = two_runs
    page.goto(f"{ui_server.url}/?tag={SEED_TAG}")
    page.wait_for_selector(f'tr[data-id="{a["id"]}"]')
    ids = page.eval_on_selector_all("#runs-body tr", "rows => rows.map(r => +r.dataset.id)")
    assert sorted(ids) == sorted([a["id"], b["id"]])
    # an HTTP producer logs two more steps: the row's progress moves without a reload
    ui_server.log(a["id"], [31, 32])
    wait_until(
        page,
        lambda: "32/40" in page.locator(f'tr[data-id="{a["id"]}"] .progress').inner_text(),
        what="live progress 32/40",
    )
    page.select_option("#f-metric", "sep/order_acc")
    wait_until(page, lambda: page.locator("#spark-head").text_content() == "sep/order_acc")
    for rid in (a["id"], b["id"]):
        page.check(f'tr[data-id="{rid}"] input.sel')
    page.click("#compare-btn")
    page.wait_for_url(re.compile(r"/compare\?runs="))
    assert f"runs={min(a['id'], b['id'])}%2C{max(a['id'], b['id'])}" in page.url or (
        f"runs={min(a['id'], b['id'])},{max(a['id'], b['id'])}" in page.url
    )
    page.wait_for_selector('#config-diff tr[data-key="params.tau"]')
    page.goto(f"{ui_server.url}/")
    page.wait_for_selector(f'tr[data-id="{a["id"]}"] svg.spark path')
    shot(page, "runs_all")


def test_compare_shows_config_diff_difference_and_shareable_state(
    page: Any, shot: Any, ui_server: Any, two_runs: Any
) -> None:
    a, b = two_runs
    page.goto(f"{ui_server.url}/compare?runs={a['id']},{b['id']}")
    row = page.wait_for_selector('#config-diff tr[data-key="params.tau"]')
    cells = [c.inner_text() for c in row.query_selector_all("td")]
    assert cells == ["params.tau", "10", "5"], cells
    # only differing keys are listed (both runs share steps and the margin schedule)
    assert page.locator('#config-diff tr[data-key="steps"]').count() == 0
    assert page.locator('#config-diff tr[data-key="params.margin_max"]').count() == 0
    # overlays both runs and draws the A − B difference
    wait_until(page, lambda: trace_points(page, "plot-m-sep_gap", "ui-tau5") == 30, what="run B")
    wait_until(page, lambda: trace_points(page, "plot-d-sep_gap") == 30, what="difference curve")
    diff = page.evaluate(
        "document.getElementById('plot-d-sep_gap').data.find(t => t.showlegend !== false).y"
    )
    assert all(abs(v + 0.05) < 0.2 for v in diff), diff[:5]  # run B was logged 0.05 higher
    # view state goes to the URL: group by a config path, smoothing, x-axis
    page.fill("#group-by", "params.tau")
    page.press("#group-by", "Enter")
    page.locator("#group-by").blur()
    page.evaluate("""() => { const s = document.getElementById('smooth'); s.value = '0.6';
                     s.dispatchEvent(new Event('input', {bubbles: true})); }""")
    page.select_option("#x-axis", "rollouts")
    wait_until(
        page,
        lambda: (
            "smooth=0.60" in page.url
            and "x=rollouts" in page.url
            and "group=params.tau" in page.url
        ),
        what=f"state in URL ({page.url})",
    )
    wait_until(
        page,
        lambda: page.evaluate(
            "(document.getElementById('plot-m-sep_gap').data || [])"
            ".some(t => /params.tau=5/.test(t.name))"
        ),
        what="grouped traces",
    )
    # one summary row per group and metric: each run's last-3 mean, then mean and CI over runs
    summary = page.inner_text("#group-summary")
    assert "params.tau=5" in summary and "params.tau=10" in summary and "1 of 1" in summary
    shared = page.url
    page.goto(shared)
    page.wait_for_selector('#config-diff tr[data-key="params.tau"]')
    assert page.input_value("#group-by") == "params.tau"
    assert page.input_value("#x-axis") == "rollouts"
    assert float(page.input_value("#smooth")) == pytest.approx(0.6)
    xmax = wait_until(
        page,
        lambda: page.evaluate(
            "Math.max(...((document.getElementById('plot-m-sep_gap').data || [])"
            ".flatMap(t => t.x || [])))"
        ),
        what="x values",
    )
    assert xmax >= 30 * 64 - 1  # rollouts/seen, not steps
    shot(page, "compare_grouped")


def test_delete_and_cancel_from_runs_page(page: Any, ui_server: Any) -> None:
    doomed = ui_server.external_run(
        "ui-doomed", {"algorithm": "conspo"}, tags=[f"{SEED_TAG}-doomed"]
    )
    stopped = ui_server.external_run(
        "ui-stop", {"algorithm": "conspo"}, tags=[f"{SEED_TAG}-doomed"]
    )
    page.goto(f"{ui_server.url}/?tag={SEED_TAG}-doomed")
    page.wait_for_selector(f'tr[data-id="{doomed["id"]}"]')
    page.on("dialog", lambda d: d.accept())
    page.click(f'tr[data-id="{stopped["id"]}"] button[data-act="cancel"]')
    wait_until(
        page,
        lambda: re.search(
            r"cancel", page.locator(f'tr[data-id="{stopped["id"]}"] .badge').inner_text()
        ),
        what="cancelled badge",
    )
    page.click(f'tr[data-id="{doomed["id"]}"] button[data-act="delete"]')
    page.wait_for_selector(f'tr[data-id="{doomed["id"]}"]', state="detached")
    resp = ui_server.http.get(f"/api/runs/{doomed['id']}")
    assert resp.status_code == 404


# ------------------------------------------------------------------------------------------------
# offline: Plotly.js comes from the installed package
# ------------------------------------------------------------------------------------------------


def test_plotly_is_served_from_the_installed_package(ui_server: Any) -> None:
    import plotly

    bundled = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    resp = httpx.get(f"{ui_server.url}/static/plotly.min.js", timeout=30)
    assert resp.status_code == 200
    assert resp.content == bundled.read_bytes()
    for path in ("/", "/runs/new", "/compare"):
        html = httpx.get(f"{ui_server.url}{path}", timeout=30).text
        assert not re.search(r"""(src|href)=["']https?://""", html), path
