"""docs/config.md is generated from the config models and must match a fresh render."""

from __future__ import annotations

from pathlib import Path

from conspo.config import RunConfig
from conspo.registry import JOB_KINDS, OBJECTIVES, REWARDS, TASKS
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
    for registry, prefix in ((JOB_KINDS, "kind_params."), (OBJECTIVES, "params."),
                             (TASKS, "task.params."), (REWARDS, "rewards[].params.")):  # fmt: skip
        for name in registry.names():
            assert f"### `{name}`" in text
            for param in registry.get(name).params.model_fields:
                assert f"`{prefix}{param}`" in text, (name, param)


def test_help_that_lists_registered_names_reads_them_from_the_registry():
    """kind, algorithm, task.name and rewards[].name never type the names: a new entry is listed
    in the form's help, the OpenAPI schema and this reference by itself."""
    schema = RunConfig.model_json_schema()
    rewards = schema["$defs"]["RewardConfig"]["properties"]
    listed = [
        (schema["properties"]["kind"], JOB_KINDS),
        (schema["properties"]["algorithm"], OBJECTIVES),
        (schema["$defs"]["TaskConfig"]["properties"]["name"], TASKS),
        (rewards["name"], REWARDS),
    ]
    text = render()
    for prop, registry in listed:
        names = ", ".join(registry.names())
        assert prop["description"].endswith(f"Registered: {names}."), prop
        assert f"Registered: {names}. |" in text
    for name in REWARDS.names():
        assert f"{name} {REWARDS.get(name).default_weight:g}" in rewards["weight"]["description"]
