"""The user-facing side of job kinds, pipelines and the model registry, in Chromium against the
real server and worker: an SFT → ConSPO pipeline submitted from the form (tiny model, 2 steps
each, the SFT on calculator-tool traces and both stages with the tool), the pipeline page showing
both stages succeed with the RL stage's step-0 eval equal to the SFT stage's final one, the models
page listing the SFT run, exporting it, and "train from this".
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.slow


def fill_small(page: Any, *, sampling: bool) -> None:
    page.fill('[name="config.steps"]', "2")
    page.fill('[name="config.model.name"]', "tiny")
    page.fill('[name="config.optim.lr"]', "0.001")
    page.fill('[name="config.sampling.max_new_tokens"]', "4")  # the eval's length, every kind
    if sampling:
        page.fill('[name="config.sampling.prompts_per_step"]', "2")
        page.fill('[name="config.sampling.group_size"]', "2")
    details = page.locator("details.adv")
    if details.get_attribute("open") is None:
        page.click("details.adv > summary")
    page.fill('[name="config.eval.every"]', "0")
    page.fill('[name="config.task.eval_size"]', "4")
    page.fill('[name="config.checkpoint.every"]', "0")


def test_sft_then_conspo_pipeline_from_the_form_to_the_models_page(
    page: Any, shot: Any, ui_server: Any
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs the worker to train the stages")
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.kind"]')
    page.check("#pipeline-mode")
    page.fill("#pipeline-name", "ui-sft-then-conspo")

    # stage 1: SFT. Its own parameters appear; the algorithm and sampling knobs do not apply.
    page.select_option('[name="config.kind"]', "sft")
    page.wait_for_selector('[name="config.kind_params.batch_size"]')
    assert not page.is_visible('[name="config.algorithm"]')
    assert not page.is_visible('[name="config.params.tau"]')
    assert not page.is_visible('[name="config.sampling.group_size"]')
    page.fill('[name="config.kind_params.batch_size"]', "4")
    # a cold start on tool-use traces (ReTool's): the calculator, listed for the run too, so the
    # stage's evaluation samples with it
    page.select_option("#tool-choice", "calculator")
    page.click("#add-tool")
    page.select_option('[name="config.kind_params.tool"]', "calculator")
    fill_small(page, sampling=False)

    # stage 2: a copy as an RL stage (ConSPO by default), starting from stage 1
    page.click("#add-stage")
    page.wait_for_selector('#stage-tabs [data-stage="1"]')
    assert page.input_value('[name="config.kind"]') == "rl"
    assert page.is_visible('[name="config.params.tau"]')
    assert "starts from stage 1" in page.inner_text("#stage-note")
    fill_small(page, sampling=True)
    assert "POST /api/pipelines" in page.inner_text("#preview")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/pipelines/\d+$"))
    pipeline_id = int(page.url.rsplit("/", 1)[1])

    wait_until(
        page,
        lambda: page.locator('#stages-body tr[data-status="succeeded"]').count() == 2,
        timeout=300,
        what="both stages succeeded",
    )
    p = ui_server.api("GET", f"/api/pipelines/{pipeline_id}")
    assert p["status"] == "succeeded"
    sft_run, rl_run = (s["run"] for s in p["stages"])
    assert sft_run["config"]["kind"] == "sft"
    assert sft_run["config"]["kind_params"]["batch_size"] == 4
    assert sft_run["config"]["kind_params"]["tool"] == "calculator"
    assert (
        sft_run["config"]["tools"]["names"] == rl_run["config"]["tools"]["names"] == ["calculator"]
    )
    for run in (sft_run, rl_run):  # both evaluations sampled with the tool
        rate = ui_server.api("GET", f"/api/runs/{run['id']}/metrics?keys=eval/tool_call_rate")
        assert rate["series"]["eval/tool_call_rate"]["values"], run["id"]
    assert rl_run["config"]["model"]["from_run"] == sft_run["id"]
    # the hand-off: SFT's final eval = the RL stage's step-0 eval, said on the page
    equal = wait_until(
        page,
        lambda: page.locator('[data-handoff="1"] tr[data-key="eval/accuracy"]').count(),
        what="the hand-off table",
    )
    assert equal
    handoff = page.locator('[data-handoff="1"] tr[data-key="eval/accuracy"]')
    assert handoff.get_attribute("data-equal") == "true"
    assert "step 0" in page.locator('#stages-body tr[data-stage="1"]').inner_text()
    assert f"#{sft_run['id']}" in page.locator('#stages-body tr[data-stage="1"]').inner_text()
    shutil.copy(shot(page, "pipeline"), ROOT / "docs" / "screenshot-pipeline.png")

    # the runs list shows the lineage and links the pipeline
    page.goto(f"{ui_server.url}/")
    link = page.locator(f'tr[data-id="{rl_run["id"]}"] [data-pipeline="{pipeline_id}"]')
    wait_until(page, lambda: "stage 2 of 2" in link.inner_text(), what="stage 2 of 2 in the list")
    assert f"from #{sft_run['id']}" in link.inner_text()
    # the run page's header line
    page.goto(f"{ui_server.url}/runs/{sft_run['id']}")
    wait_until(page, lambda: "kind: sft" in page.inner_text("#run-lineage"), what="the kind line")

    # the models page lists the SFT run; export writes a Hugging Face directory
    page.goto(f"{ui_server.url}/models")
    row = page.locator(f'#models-body tr[data-run="{sft_run["id"]}"]')
    row.wait_for()
    assert "sft" in row.inner_text() and "tiny" in row.inner_text()
    row.locator('[data-act="export"]').click()
    path = wait_until(
        page,
        lambda: (t := row.locator(".export-path").inner_text()).startswith("/") and t,
        what="the export path",
    )
    assert (Path(path) / "config.json").is_file()
    # "train from this": the form with model.from_run prefilled
    row.locator('[data-act="train"]').click()
    page.wait_for_url(re.compile(rf"/runs/new\?from_run={sft_run['id']}$"))
    page.wait_for_selector('[name="config.model.from_run"]')
    assert page.input_value('[name="config.model.from_run"]') == str(sft_run["id"])
    # the rest is what the SFT run trained on (not the demo's defaults), as RL: SFT trains no
    # algorithm, so the next run is the default kind
    page.wait_for_selector('[name="config.task.eval_size"]', state="attached")
    assert page.input_value('[name="config.task.eval_size"]') == "4"
    assert page.input_value('[name="config.kind"]') == "rl"


def test_the_pipelines_list_shows_every_stages_progress(page: Any, ui_server: Any) -> None:
    """A pipeline is several runs: the list gives each stage's own steps (2 then 3 here) and how
    many stages are done, not only the progress of the stage that ran last."""
    if not ui_server.has_worker:
        pytest.skip("needs the worker to train the stages")
    small = {
        "model": {"name": "tiny"},
        "task": {"eval_size": 4},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
    }
    stages = [
        {**small, "kind": "sft", "kind_params": {"batch_size": 4}, "steps": 2},
        {**small, "algorithm": "grpo", "steps": 3},
    ]
    made = ui_server.api("POST", "/api/pipelines", json={"name": "ui-progress", "stages": stages})
    wait_until(
        page,
        lambda: ui_server.api("GET", f"/api/pipelines/{made['id']}")["status"] == "succeeded",
        400,
        "the pipeline to succeed",
    )
    page.goto(f"{ui_server.url}/pipelines")
    row = page.locator(f'#pipelines-table tr[data-id="{made["id"]}"]')
    row.wait_for()
    labels = row.locator(".stage-progress .plabel")
    assert [labels.nth(i).inner_text() for i in range(labels.count())] == ["2/2", "3/3"]
    assert row.locator(".stages-done").inner_text() == "2/2 stages done"
    # the runs list groups its two runs under a row named by the pipeline, its id kept (it read
    # "pipeline 7", as if pipelines had no names)
    pid = made["id"]
    page.goto(f"{ui_server.url}/?q=ui-progress")
    name = page.locator(f'tr.group-row[data-group="p:{pid}"] td.name strong')
    wait_until(
        page,
        lambda: name.count() and name.inner_text() == f"ui-progress · pipeline {pid}",
        what="the pipeline's name on its group row",
    )


def test_a_stage_without_a_start_eval_says_so_instead_of_a_hand_off(
    page: Any, ui_server: Any
) -> None:
    """SmolLM2's recipe turns eval.at_start off (issue 49's walk): the RL stage's first
    evaluation came after it trained, and the page showed it as the stage's start, set beside
    the SFT's final eval as a hand-off that agreed. The page now says the start was not
    evaluated, and sets nothing beside the SFT's end."""
    if not ui_server.has_worker:
        pytest.skip("needs the worker to train the stages")
    small = {
        "model": {"name": "tiny"},
        "task": {"eval_size": 4},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "checkpoint": {"every": 0},
    }
    stages = [
        {**small, "kind": "sft", "kind_params": {"batch_size": 4}, "steps": 1,
         "eval": {"every": 0}},
        {**small, "algorithm": "grpo", "steps": 1, "eval": {"every": 0, "at_start": False}},
    ]  # fmt: skip
    made = ui_server.api("POST", "/api/pipelines", json={"name": "ui-no-start", "stages": stages})
    page.goto(f"{ui_server.url}/pipelines/{made['id']}")
    wait_until(
        page,
        lambda: page.locator('#stages-body tr[data-status="succeeded"]').count() == 2,
        timeout=400,
        what="both stages succeeded",
    )
    handoff = page.locator('[data-handoff="1"]')
    wait_until(
        page, lambda: handoff.get_attribute("data-no-start") == "1", what="the hand-off's line"
    )
    assert "stage 2 was not evaluated at step 0" in handoff.inner_text()
    assert handoff.locator("tr[data-key]").count() == 0  # no table of "equal" values
    rl_row = page.locator('#stages-body tr[data-stage="1"]')
    assert "not evaluated at step 0 (eval.at_start off)" in rl_row.inner_text()
    assert "step 0" in page.locator('#stages-body tr[data-stage="0"]').inner_text()  # at_start on
