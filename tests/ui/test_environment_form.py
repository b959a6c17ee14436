"""A run that plays an environment, started from the New run form in a real Chromium (see
conftest.py for the stack): the task ``environment`` with TextArena's guess-the-number, the
tiny model, a few turns credited per turn; the worker trains it, and its run page shows the
"Environment episodes" charts open and with data and each sampled rollout's episode. And the
form refuses, at the credit field, the credit settings the config cannot take."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import pytest

from tests.ui.test_new_run_form import TASK, request_preview
from tests.ui.test_pages import trace_points, wait_until

pytestmark = pytest.mark.browser
ENVIRONMENT = '[name="config.task.params.environment"]'
ENVIRONMENT_PARAMS = '[name="config.task.params.environment_params"]'
CREDIT = '[name="config.environment.credit"]'
ENV_CHARTS = ("plot-envturns", "plot-envoutcome", "plot-envreward")
# What the viewer says of an episode (run_rollouts.js episodeView): "0 turns · cut · total reward 0"
EPISODE_SUMMARY = re.compile(r"^\d+ turns? · (won|lost|cut|failed) · total reward -?[\d.]+$")


def fill_environment_run(page: Any, ui_server: Any, name: str) -> None:
    """A small run on ta_guess_the_number, typed into the form the way a person would."""
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.params.tau"]')
    page.fill('[name="config.name"]', name)
    page.fill('[name="config.model.name"]', "tiny")
    page.press('[name="config.model.name"]', "Tab")
    page.fill('[name="config.steps"]', "2")
    page.fill('[name="config.sampling.prompts_per_step"]', "2")
    page.fill('[name="config.sampling.group_size"]', "2")
    page.fill('[name="config.sampling.max_new_tokens"]', "32")
    page.select_option(TASK, "environment")
    page.wait_for_selector(ENVIRONMENT)
    page.select_option(ENVIRONMENT, "ta_guess_the_number")
    assert page.input_value(ENVIRONMENT_PARAMS) in ("", "{}")
    page.fill('[name="config.environment.max_turns"]', "3")
    page.select_option(CREDIT, "turn")
    page.click("details.adv > summary")
    page.fill('[name="config.eval.every"]', "0")
    page.fill('[name="config.task.eval_size"]', "4")
    page.fill('[name="config.checkpoint.every"]', "0")


def test_the_form_starts_an_environment_run_that_trains_and_shows_its_episodes(
    page: Any, shot: Any, ui_server: Any
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs a worker to train the run")
    fill_environment_run(page, ui_server, "ui-form-environment")
    wait_until(
        page,
        lambda: request_preview(page)["config"]["environment"].get("credit") == "turn",
        what="the request with turn credit",
    )
    task = request_preview(page)["config"]["task"]
    assert task["name"] == "environment"
    assert task["params"]["environment"] == "ta_guess_the_number"
    assert task["params"]["environment_params"] == {}  # an object, not its JSON text
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run_id = int(page.url.rsplit("/", 1)[1])
    stored = ui_server.api("GET", f"/api/runs/{run_id}")["config"]
    assert stored["task"]["name"] == "environment"
    assert stored["task"]["params"]["environment"] == "ta_guess_the_number"
    assert stored["environment"]["max_turns"] == 3
    assert stored["environment"]["credit"] == "turn"
    assert stored["sampling"]["max_new_tokens"] == 32
    assert stored["model"]["name"] == "tiny"

    wait_until(
        page,
        lambda: "succeeded" in page.locator("#run-status").inner_text(),
        timeout=300,
        what="the run succeeded",
    )
    section = page.locator('[data-section="env"]')
    for plot in ENV_CHARTS:
        wait_until(page, partial(trace_points, page, plot), what=f"{plot} drawn")
    assert section.get_attribute("data-folded") is None
    assert section.locator(".chart-card").count() >= len(ENV_CHARTS)

    # the rollout viewer: every sampled rollout played an episode, each with its summary line
    page.wait_for_selector("#rollout-body .episode")
    rows = page.locator("#rollout-body tr")
    episodes = page.locator("#rollout-body .episode")
    assert episodes.count() == rows.count() > 0
    summaries = page.locator("#rollout-body .episode-summary").all_text_contents()
    assert summaries and all(EPISODE_SUMMARY.match(s) for s in summaries), summaries
    firsts = page.locator("#rollout-body .episode-first pre").all_text_contents()
    assert all(text.strip() for text in firsts), firsts  # the game's first observation
    shot(page, "run_environment_from_form")


def credit_error(page: Any) -> str:
    field = page.locator('[data-field="config.environment.credit"]')
    wait_until(page, lambda: field.locator(".err").is_visible(), what="credit's message")
    return field.locator(".err").inner_text()


def test_gigpo_credit_with_an_objective_that_takes_no_turn_credit_is_refused_at_its_field(
    page: Any, ui_server: Any
) -> None:
    page.problems.allow_http_error(422, "/api/runs")
    fill_environment_run(page, ui_server, "ui-form-environment-gspo")
    page.select_option('[name="config.algorithm"]', "gspo")
    page.select_option(CREDIT, "gigpo")
    page.click("#submit-btn")
    message = credit_error(page)
    assert "credit 'gigpo' needs an objective that takes per-turn advantages" in message, message
    assert "not 'gspo'" in message
    assert page.url.endswith("/runs/new")
    assert page.input_value(CREDIT) == "gigpo"  # what was chosen stays


def test_turn_credit_with_a_task_that_plays_no_environment_is_refused_at_its_field(
    page: Any, ui_server: Any
) -> None:
    page.problems.allow_http_error(422, "/api/runs")
    fill_environment_run(page, ui_server, "ui-form-environment-arith")
    page.select_option(TASK, "arith")
    page.wait_for_selector('[name="config.task.params.digits"]')
    page.click("#submit-btn")
    message = credit_error(page)
    assert "credit 'turn' credits an environment's turns" in message, message
    assert page.url.endswith("/runs/new")
    assert page.input_value(CREDIT) == "turn"
