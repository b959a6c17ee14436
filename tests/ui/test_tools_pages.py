"""Runs with tools in a real Chromium (see conftest.py for the stack): the run page's Tools
section (from the catalogue: charts for a run with tools, one folded line for a run without),
its rollout viewer turn by turn (the model's text, each call's code, the interpreter's output)
with hostile model output shown as text and never run, the compare page's picker offering the
tools' keys, and the run form's Tools section from picking a tool to the stored config."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from conspo.metrics import (
    EVAL_TOOL_CALL_RATE,
    TIME_TOOLS_S,
    TOOLS_ACC_WITH_CALL,
    TOOLS_ACC_WITHOUT_CALL,
    TOOLS_CALL_RATE,
    TOOLS_CALLS,
    TOOLS_CALLS_NEG,
    TOOLS_CALLS_POS,
    TOOLS_ERROR_RATE,
    TOOLS_OBSERVATION_TOKENS,
    TOOLS_OK_RATE,
    TOOLS_TIMEOUT_RATE,
    TOOLS_TURNS,
)
from conspo.tools.base import OBSERVATION_TEMPLATE
from tests.ui.conftest import fake_metrics, fake_rollouts
from tests.ui.test_pages import fill_small_run, trace_points, wait_until

pytestmark = pytest.mark.browser
STEPS = range(1, 11)
TOOL_CHARTS = ("plot-toolcalls", "plot-toolpay", "plot-toolstatus", "plot-tooltokens")


def output(text: str) -> str:
    return OBSERVATION_TEMPLATE.format(output=text)


# (completion, reward) of the last step's sampled rollouts, group 0.
SOLVED = "Let me compute it.\n<code>print(6*7)</code>" + output("42") + "So the answer is 42."
HOSTILE = (
    "<code>print('<script>window.__xss = 1</script>', '"
    + "x" * 300
    + "')</code>"
    + output('<img src=x onerror="window.__xss = 2"><script>window.__xss = 3</script>')
    + 'Done: <img src=y onerror="window.__xss = 4"> <b>bold</b>'
)
# The first call was written inside the model's text, never run; only the one that ends the
# turn ran. The stored text is capped: the second output is cut off.
UNRUN = "<code>print(1)</code> no, rather <code>print(2)</code>" + output("2") + "<code>x</code>"
CUT = "<code>print(3)</code>" + output("333")[: -len("\n</interpreter>\n")]
TEXTS = [(SOLVED, 1.0), (HOSTILE, 0.0), (UNRUN, 0.0), (CUT, 0.0)]


def tool_metrics(step: int) -> dict[str, float]:
    x = step / 10
    return {
        TOOLS_CALLS: 1 + x,
        TOOLS_CALLS_POS: 1.5 + x,
        TOOLS_CALLS_NEG: 0.5 + x,
        TOOLS_CALL_RATE: 0.5 + 0.4 * x,
        TOOLS_ACC_WITH_CALL: 0.4 + 0.5 * x,
        TOOLS_ACC_WITHOUT_CALL: 0.3,
        TOOLS_OK_RATE: 0.7 + 0.2 * x,
        TOOLS_ERROR_RATE: 0.2 - 0.1 * x,
        TOOLS_TIMEOUT_RATE: 0.1 - 0.1 * x,
        TOOLS_TURNS: 2 + x,
        TOOLS_OBSERVATION_TOKENS: 12 + 5 * x,
        TIME_TOOLS_S: 0.3,
        **({EVAL_TOOL_CALL_RATE: 0.6} if step % 5 == 0 else {}),
    }


def log_run(ui_server: Any, name: str, tools: dict[str, Any]) -> dict[str, Any]:
    """An external run (as a trainer elsewhere logs one) whose config has ``tools``; with tools,
    the tools' metrics and the last step's rollouts with their text."""
    config = {"algorithm": "grpo", "steps": 10, "task": {"name": "arith"}, "tools": tools}
    run = ui_server.external_run(name, config, algorithm="grpo", total_steps=10)
    with_tools = bool(tools["names"])
    rollouts = [r for s in STEPS for r in fake_rollouts(s)]
    last = [r for r in rollouts if r["step"] == STEPS[-1] and r["group"] == 0]
    texts = TEXTS if with_tools else [("The answer is <b>42</b>.", 1.0)]
    for row, (text, reward) in zip(last, texts, strict=False):
        row.update(prompt="What is 6*7?", completion=text, reward=reward)
    steps = [
        {"step": s, "metrics": {**fake_metrics(s), **(tool_metrics(s) if with_tools else {})}}
        for s in STEPS
    ]
    ui_server.api(
        "POST",
        f"/api/runs/{run['id']}/log",
        json={"steps": steps, "rollouts": rollouts, "status": "succeeded"},
    )
    return run


@pytest.fixture(scope="module")
def tool_runs(ui_server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    tag = uuid.uuid4().hex[:6]
    with_tools = log_run(ui_server, f"ui-tools-{tag}", {"names": ["python"], "max_turns": 3})
    without = log_run(ui_server, f"ui-no-tools-{tag}", {"names": []})
    return with_tools, without


def row_of(page: Any, text: str) -> Any:
    return page.locator("#rollout-body tr", has_text=text)


def test_a_run_with_tools_shows_its_tools_charts_and_each_rollouts_turns(
    page: Any, shot: Any, ui_server: Any, tool_runs: Any
) -> None:
    run, _ = tool_runs
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    section = page.locator('[data-section="tools"]')
    for plot in TOOL_CHARTS:
        wait_until(page, lambda plot=plot: trace_points(page, plot) == 10, what=f"{plot} drawn")
    assert section.get_attribute("data-folded") is None
    assert section.locator(".chart-card").count() == len(TOOL_CHARTS)
    # the rollout viewer: each response turn by turn, the reward beside it as before
    page.wait_for_selector("#rollout-body .turns")
    solved = row_of(page, "So the answer is 42.")
    kinds = solved.locator(".turns > *").evaluate_all("els => els.map(e => e.className)")
    assert kinds == ["turn-text", "turn-call", "turn-output", "turn-text"]
    assert solved.locator(".turn-call pre").text_content() == "print(6*7)"
    assert solved.locator(".turn-call .turn-label").text_content() == "python call"
    assert solved.locator(".turn-output pre").text_content() == "42"
    assert "interpreter output" in solved.locator(".turn-output .turn-label").text_content()
    assert solved.locator(".turn-call pre").evaluate("e => getComputedStyle(e).fontFamily") != (
        solved.locator(".turn-text").first.evaluate("e => getComputedStyle(e).fontFamily")
    )
    assert solved.locator(".turn-call").evaluate(
        "e => getComputedStyle(e).backgroundColor"
    ) != solved.locator(".turn-output").evaluate("e => getComputedStyle(e).backgroundColor")
    assert solved.locator("td.num").nth(2).text_content() == "1"  # its reward
    assert "✓ correct" in solved.inner_text()
    # a call written inside the model's text was not run; the one ending the turn was
    unrun = row_of(page, "no, rather")
    ran = unrun.locator(".turn-call").evaluate_all("els => els.map(e => e.dataset.ran)")
    assert ran == ["0", "1", "0"]
    assert "not run" in unrun.locator(".turn-call .turn-label").first.text_content()
    cut = row_of(page, "print(3)").locator(".turn-output")
    assert cut.locator("pre").text_content() == "333"
    assert "cut" in cut.locator(".turn-label").text_content()
    # hostile model output is text: shown as written, never parsed, never run
    hostile = row_of(page, "Done:")
    assert (
        hostile.locator(".turn-call pre")
        .text_content()
        .startswith("print('<script>window.__xss = 1</script>', 'xxx")
    )
    assert hostile.locator(".turn-output pre").text_content() == (
        '<img src=x onerror="window.__xss = 2"><script>window.__xss = 3</script>'
    )
    assert '<img src=y onerror="window.__xss = 4">' in hostile.locator(".turn-text").text_content()
    assert page.locator("#rollout-body img, #rollout-body script, #rollout-body b").count() == 0
    page.wait_for_timeout(500)  # an injected image would have failed to load by now
    assert page.evaluate("window.__xss === undefined")
    shot(page, "run_tools")
    # long calls and outputs wrap inside their cell: the page never scrolls sideways
    page.set_viewport_size({"width": 800, "height": 900})
    # the charts redraw at the new width (later on a loaded machine): wait for it, not a time
    page.wait_for_function(
        "() => document.documentElement.scrollWidth - window.innerWidth <= 1", timeout=60_000
    )


def test_a_run_without_tools_folds_the_section_and_keeps_plain_text(
    page: Any, ui_server: Any, tool_runs: Any
) -> None:
    _, run = tool_runs
    catalogue = ui_server.api("GET", "/api/metrics/catalogue")
    folded = next(s["folded"] for s in catalogue["sections"] if s["id"] == "tools")
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    section = page.wait_for_selector('[data-section="tools"][data-folded="1"]')
    assert section.inner_text().endswith(folded)
    assert page.locator('[data-section="tools"] .chart-card').count() == 0
    wait_until(page, lambda: trace_points(page, "plot-gap") == 10, what="the gap chart")
    cell = page.wait_for_selector("#rollout-body td.text >> text=The answer is")
    assert cell.text_content() == "The answer is <b>42</b>."
    assert page.locator("#rollout-body .turns").count() == 0


def test_the_compare_page_offers_the_tools_keys(page: Any, ui_server: Any, tool_runs: Any) -> None:
    a, b = tool_runs
    page.goto(f"{ui_server.url}/compare?runs={a['id']},{b['id']}")
    page.wait_for_selector(f'#key-list input[value="{TOOLS_CALLS}"]', state="attached")
    for key in (TOOLS_ACC_WITH_CALL, TOOLS_OBSERVATION_TOKENS, TIME_TOOLS_S, EVAL_TOOL_CALL_RATE):
        assert page.locator(f'#key-list input[value="{key}"]').count() == 1, key
    page.locator(f'#key-list input[value="{TOOLS_CALLS}"]').check()
    plot = "plot-m-" + re.sub(r"\W", "_", TOOLS_CALLS)
    wait_until(page, lambda: trace_points(page, plot) == 10, what="tools/calls compared")


def test_the_form_picks_a_tool_and_its_limits_and_the_run_keeps_them(
    page: Any, shot: Any, ui_server: Any
) -> None:
    page.problems.allow_http_error(422, "/api/runs")
    presets = ui_server.api("GET", "/api/presets")
    if ui_server.has_worker:  # registered a few seconds after the server starts
        wait_until(page, lambda: ui_server.api("GET", "/api/health")["workers"], 120, "a worker")
    sandbox = any(
        w["capabilities"].get("sandbox") == "bwrap"
        for w in ui_server.api("GET", "/api/health")["workers"]
    )
    cap = presets["tool_timeout_max_s"]
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector("#tool-choice")
    assert page.locator('[name^="config.tools.names."]').count() == 0  # no tools by default
    offered = page.eval_on_selector_all("#tool-choice option", "os => os.map(o => o.textContent)")
    assert "python (runs code in the sandbox)" in offered and "calculator" in offered
    fill_small_run(page, f"ui-tools-form-{uuid.uuid4().hex[:6]}")
    page.select_option("#tool-choice", "python")
    page.click("#add-tool")
    row = page.wait_for_selector('[data-field="config.tools.names.0"]')
    assert "runs code in the sandbox" in row.inner_text()
    assert "python" not in page.eval_on_selector_all(
        "#tool-choice option", "os => os.map(o => o.value)"
    )
    help_text = page.locator('[data-field="config.tools.max_turns"] .help').inner_text()
    schema = presets["config_schema"]["$defs"]["ToolsConfig"]["properties"]
    assert schema["max_turns"]["description"] in help_text
    timeout_help = page.locator('[data-field="config.tools.timeout_s"] .help').inner_text()
    assert f"at most {cap:g} s" in timeout_help
    page.fill('[name="config.tools.max_turns"]', "3")
    # over the platform's limit: the 422 lands on the field, what was typed is kept
    page.fill('[name="config.tools.timeout_s"]', str(cap + 1))
    page.click("#submit-btn")
    error = page.wait_for_selector('[data-field="config.tools.timeout_s"].has-error .err')
    assert "CONSPO_SANDBOX_MAX_TIMEOUT_S" in error.inner_text()
    assert page.locator(".field.has-error").count() == (1 if sandbox else 2)
    assert page.input_value('[name="config.tools.max_turns"]') == "3"
    page.fill('[name="config.tools.timeout_s"]', "2")
    page.click("details.tool-limits > summary")
    page.fill('[name="config.tools.max_output_chars"]', "256")
    shot(page, "new_run_tools")
    page.click("#submit-btn")
    if not sandbox:  # no live worker can run code here: refused, on the tool's row
        error = page.wait_for_selector('[data-field="config.tools.names.0"].has-error .err')
        assert "no live worker has a sandbox" in error.inner_text()
        return
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run = ui_server.api("GET", f"/api/runs/{page.url.rsplit('/', 1)[1]}")
    ui_server.stop_run(run["id"])  # the form is what is tested here
    tools = run["config"]["tools"]
    assert tools["names"] == ["python"] and tools["max_turns"] == 3
    assert tools["timeout_s"] == 2 and tools["max_output_chars"] == 256
    # "Edit & rerun" brings the tools back
    page.goto(f"{ui_server.url}/runs/new?from={run['id']}")
    page.wait_for_selector('[data-tool="python"] [data-field="config.tools.names.0"]')
    assert page.input_value('[name="config.tools.max_turns"]') == "3"
