"""Issue 37 item 6: choosing SmolLM2 in the New run form applies its recommended settings (the
catalogue's, GET /api/presets) instead of keeping the tiny demo's (6 new tokens, no LoRA, an
answer tag it never writes, 300 steps), and says so; Reset takes them back."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from tests.ui.conftest import ROOT
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser

SMOLLM2 = "smollm2-135m-instruct"
DOCS = ROOT / "docs"


def value(page: Any, name: str) -> str:
    return page.input_value(f'[name="{name}"]')


def test_choosing_smollm2_applies_its_recommended_settings(
    page: Any, ui_server: Any, shot: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.model.name"]')
    assert value(page, "config.sampling.max_new_tokens") == "6"  # the demo's
    page.fill('[name="config.name"]', "my smollm2 run")
    page.fill('[name="config.model.name"]', SMOLLM2)
    page.press('[name="config.model.name"]', "Tab")
    note = page.locator("#model-note")
    wait_until(page, lambda: note.is_visible(), what="the note")
    assert "recommended settings are applied" in note.inner_text()
    assert "last number" in note.inner_text()
    assert value(page, "config.model.name") == SMOLLM2
    assert value(page, "config.name") == "my smollm2 run"  # what the user typed stays
    assert value(page, "config.sampling.max_new_tokens") == "128"
    assert value(page, "config.model.lora.rank") == "16"
    assert value(page, "config.task.name") == "reasoning_gym"
    assert value(page, "config.steps") == "20"
    wait_until(page, lambda: '"gcd"' in page.inner_text("#preview"), what="the preview")
    request = json.loads(page.inner_text("#preview").split("\n", 1)[1])
    task = request["config"]["task"]
    assert task["params"]["answer_format"] == "last_number" and task["eval_size"] == 200
    assert "digits" not in task["params"]  # the arith task's parameters are gone with it
    page.wait_for_selector('#generator-fields[data-generator="gcd"]')  # its config as fields
    page.set_viewport_size({"width": 1440, "height": 1100})
    shutil.copy(shot(page, "new-run-smollm2"), DOCS / "screenshot-new-run-smollm2.png")
    page.click("#reset-btn")
    wait_until(page, lambda: not note.is_visible(), what="the note gone")
    assert value(page, "config.sampling.max_new_tokens") == "6"
    # the catalogue is in sight under the field, and a click picks a model as typing does
    page.click(f'.model-chips [data-model="{SMOLLM2}"]')
    wait_until(page, lambda: note.is_visible(), what="the note again")
    assert value(page, "config.model.name") == SMOLLM2
    assert value(page, "config.sampling.max_new_tokens") == "128"


def test_the_form_marks_what_start_would_refuse_as_you_type(page: Any, ui_server: Any) -> None:
    """Issue 37 item 12: errors only appeared after Start (the study form checks as you type),
    and seeds "0, one" made the button read "Start 2 runs"."""
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.steps"]')
    steps = page.locator('[data-field="config.steps"]')
    page.fill('[name="config.steps"]', "-3")
    wait_until(page, lambda: "has-error" in (steps.get_attribute("class") or ""), what="a mark")
    assert "greater than" in steps.locator(".err").inner_text()
    # a model that is not here is marked beside it, not after the rest is fixed
    model = page.locator('[data-field="config.model.name"]')
    page.fill('[name="config.model.name"]', "no-such-model")
    wait_until(page, lambda: "has-error" in (model.get_attribute("class") or ""), what="model")
    assert "no-such-model" in model.locator(".err").inner_text()
    assert "has-error" in (steps.get_attribute("class") or "")
    page.fill('[name="config.model.name"]', "tiny-arith")
    page.fill('[name="seeds"]', "0, one")
    seeds = page.locator('[data-field="seeds"]')
    wait_until(page, lambda: "has-error" in (seeds.get_attribute("class") or ""), what="seeds")
    assert page.inner_text("#submit-btn") == "Start runs (fix the seeds)"
    page.fill('[name="seeds"]', "0, 1")
    page.fill('[name="config.steps"]', "30")
    wait_until(page, lambda: page.locator(".field.has-error").count() == 0, what="marks cleared")
    assert page.inner_text("#submit-btn") == "Start 2 runs"


def test_a_generators_config_is_fields_of_its_own_parameters(page: Any, ui_server: Any) -> None:
    """Issue 37 item 6: the generator's config was free JSON with no list of its fields. The
    generator's parameters (their defaults as placeholders, their caps as bounds) are fields
    that write the JSON the form sends; a hand edit of the JSON shows in them."""
    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.task.name"]')
    page.select_option('[name="config.task.name"]', "reasoning_gym")
    page.select_option('[name="config.task.params.dataset"]', "gcd")
    panel = page.wait_for_selector('#generator-fields[data-generator="gcd"]')
    max_value = panel.query_selector('[data-param="max_value"]')
    assert max_value.get_attribute("placeholder") == "1000"  # gcd's own default
    assert max_value.get_attribute("max") == "10000"
    max_value.fill("60")
    config = '[name="config.task.params.config"]'
    wait_until(page, lambda: page.input_value(config) == '{"max_value":60}', what="the JSON")
    wait_until(page, lambda: '"max_value": 60' in page.inner_text("#preview"), what="preview")
    page.fill(config, '{"max_value": 30, "min_value": 2}')
    wait_until(page, lambda: max_value.input_value() == "30", what="the fields follow the JSON")
    assert panel.query_selector('[data-param="min_value"]').input_value() == "2"
    max_value.fill("")  # blank: the generator's default again
    wait_until(page, lambda: page.input_value(config) == '{"min_value":2}', what="key dropped")
    page.select_option('[name="config.task.params.dataset"]', "chain_sum")
    page.wait_for_selector('#generator-fields[data-generator="chain_sum"] [data-param="max_terms"]')
    page.select_option('[name="config.task.name"]', "arith")
    wait_until(page, lambda: page.locator("#generator-fields").count() == 0, what="gone")
