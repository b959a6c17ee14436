"""Issue 49's walk of the New run form, in a real Chromium (see conftest.py for the stack): a
generator's settings never follow the dataset to another generator, a fixed field loses its
message, the SmolLM2 note says which of its settings were changed, and a nullable choice (the
SFT's tool) can be set back to none."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.ui.test_model_defaults import SMOLLM2
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser
CONFIG = '[name="config.task.params.config"]'
DATASET = '[name="config.task.params.dataset"]'
TASK = '[name="config.task.name"]'


def request_preview(page: Any) -> dict[str, Any]:
    return json.loads(page.inner_text("#preview").split("\n", 1)[1])


def choose_smollm2(page: Any, ui_server: Any) -> None:
    page.goto(f"{ui_server.url}/runs/new")
    page.click(f'.model-chips [data-model="{SMOLLM2}"]')
    page.wait_for_selector('#generator-fields[data-generator="gcd"]')


def test_switching_the_dataset_drops_the_old_generators_settings(page: Any, ui_server: Any) -> None:
    choose_smollm2(page, ui_server)
    note = page.locator("#model-note")
    assert "recommended settings are applied" in note.inner_text()
    assert json.loads(page.input_value(CONFIG)) == {
        "min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 60,
    }  # fmt: skip
    page.select_option(DATASET, "chain_sum")
    page.wait_for_selector('#generator-fields[data-generator="chain_sum"]')
    assert page.input_value(CONFIG) == ""  # none of gcd's keys goes to chain_sum
    dropped = page.locator("#generator-fields .generator-dropped").inner_text()
    assert "gcd's settings were dropped" in dropped and "max_value" in dropped, dropped
    # the request follows: chain_sum with no config of its own (the preview redraws after edits)
    wait_until(
        page,
        lambda: (
            request_preview(page)["config"]["task"]["params"]
            == {"dataset": "chain_sum", "answer_format": "last_number"}
        ),
        what="the request naming chain_sum alone",
    )
    # a field of chain_sum's writes chain_sum's key, alone
    page.fill('#generator-fields [data-param="max_terms"]', "3")
    wait_until(page, lambda: page.input_value(CONFIG) == '{"max_terms":3}', what="the JSON")
    # the model note no longer says its settings all hold: it names what was changed
    wait_until(page, lambda: "changed since" in note.inner_text(), what="the note updated")
    assert "task.params.dataset" in note.inner_text()
    assert "recommended settings are applied" not in note.inner_text()
    # another model: the note goes
    page.fill('[name="config.model.name"]', "tiny")
    page.press('[name="config.model.name"]', "Tab")
    wait_until(page, lambda: not note.is_visible(), what="the note gone")


def test_a_fixed_field_loses_its_message(page: Any, ui_server: Any) -> None:
    page.problems.allow_http_error(422, "/api/runs")
    page.goto(f"{ui_server.url}/runs/new")
    group = page.locator('[data-field="config.sampling.group_size"]')
    steps = page.locator('[data-field="config.steps"]')
    page.fill('[name="config.sampling.group_size"]', "1")
    page.fill('[name="config.steps"]', "0")
    page.click("#submit-btn")
    wait_until(page, lambda: group.locator(".err").is_visible(), what="group_size's message")
    assert steps.locator(".err").is_visible()
    # fixed and left (a change event): its message goes, the other field's stays
    page.fill('[name="config.sampling.group_size"]', "4")
    page.press('[name="config.sampling.group_size"]', "Tab")
    wait_until(page, lambda: not group.locator(".err").is_visible(), what="the message gone")
    assert "has-error" not in (group.get_attribute("class") or "")
    wait_until(page, lambda: page.get_attribute("#estimate", "data-pending") is None, 120)
    assert steps.locator(".err").is_visible()  # still wrong: still marked
    assert "has-error" in (steps.get_attribute("class") or "")
    # fixed by typing only, the cursor still in the field: re-checked as typed, cleared
    page.fill('[name="config.steps"]', "5")
    wait_until(page, lambda: not steps.locator(".err").is_visible(), 120, "steps' message gone")
    shown = page.eval_on_selector_all(
        ".field .err",
        "es => es.filter(e => e.offsetParent).map(e => e.closest('[data-field]')"
        ".dataset.field + ': ' + e.textContent)",
    )
    assert shown == []
    assert page.is_hidden("#form-error")


def test_the_sft_tool_can_be_set_back_to_none(page: Any, ui_server: Any) -> None:
    page.goto(f"{ui_server.url}/runs/new")
    page.select_option('[name="config.kind"]', "sft")
    tool = '[name="config.kind_params.tool"]'
    page.wait_for_selector(tool)
    options = page.eval_on_selector(tool, "s => [...s.options].map(o => [o.value, o.text])")
    assert options[0] == ["", "(none)"] and ["python", "python"] in options, options
    assert page.input_value(tool) == ""  # its default, None, shown as such
    page.select_option(tool, "python")
    wait_until(
        page,
        lambda: request_preview(page)["config"]["kind_params"].get("tool") == "python",
        what="python in the request",
    )
    page.select_option(tool, "")
    wait_until(
        page,
        lambda: request_preview(page)["config"]["kind_params"].get("tool") is None,
        what="no tool in the request",
    )


def test_a_task_s_settings_come_back_as_they_were_after_switching_away(
    page: Any, ui_server: Any
) -> None:
    """The walk after issue 49: SmolLM2's gcd settings, the task switched to arith and back:
    the generator's config came back as a quoted string (the field's text re-encoded), and the
    server refused it (task.params.config: a valid dictionary)."""
    choose_smollm2(page, ui_server)
    gcd = json.loads(page.input_value(CONFIG))
    page.select_option(TASK, "arith")
    page.wait_for_selector('[name="config.task.params.digits"]')
    page.select_option(TASK, "reasoning_gym")
    page.wait_for_selector(CONFIG)
    assert json.loads(page.input_value(CONFIG)) == gcd  # an object again, not a string of one
    wait_until(
        page,
        lambda: request_preview(page)["config"]["task"]["params"].get("config") == gcd,
        what="the request's config an object",
    )
