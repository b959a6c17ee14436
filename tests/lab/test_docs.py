"""docs/config.md is generated from the config models and must match a fresh render."""

from __future__ import annotations

from pathlib import Path

from conspo.config import RunConfig
from conspo.registry import get_objective, get_task, objective_names, task_names
from conspo_lab.docs import render

ROOT = Path(__file__).resolve().parents[2]


def test_committed_config_reference_is_up_to_date():
    committed = (ROOT / "docs" / "config.md").read_text()
    assert committed == render(), "docs/config.md is stale: run `python -m conspo_lab.docs`"


def test_reference_lists_every_field_and_registered_param():
    text = render()
    for name, field in RunConfig.model_fields.items():
        assert f"`{name}`" in text
        sub = getattr(field.annotation, "model_fields", {})
        for child in sub:
            assert f"`{name}.{child}`" in text
    for algo in objective_names():
        assert f"### `{algo}`" in text
        for param in get_objective(algo).params.model_fields:
            assert f"`params.{param}`" in text
    for task in task_names():
        assert f"### `{task}`" in text
        for param in get_task(task).params.model_fields:
            assert f"`task.params.{param}`" in text
