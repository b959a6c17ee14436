"""The ``reward_model`` job kind through the API and the worker's own code: bad kind_params are a
422 at the field; a run trains on a pairs dataset of the data dir, logs its pair accuracy, and
exports (LoRA merged) as a directory AutoModelForSequenceClassification loads; a pairs file
with a broken row fails the run naming the row."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend.config import Settings
from tests.api.test_api_pipelines import BASE, execute, loc_of, series, submit

pytestmark = pytest.mark.services

RM = {**BASE, "kind": "reward_model", "steps": 2}


def test_bad_kind_params_of_a_reward_model_are_refused_at_the_field(api: Any) -> None:
    def refused(kind_params: dict[str, Any]) -> list[list[Any]]:
        return loc_of(api.post("/api/runs", json={"config": {**RM, "kind_params": kind_params}}))

    at = ["body", "config", "kind_params"]
    assert [*at, "eval_fraction"] in refused({"from_run": 1, "eval_fraction": 1.0})
    assert [*at, "batch_size"] in refused({"from_run": 1, "batch_size": 0})
    assert [*at, "max_tokens"] in refused({"from_run": 1, "max_tokens": 2})
    assert [*at, "beta"] in refused({"from_run": 1, "beta": 0.1})  # dpo's, not this kind's
    assert at in refused({})  # neither source
    assert at in refused({"from_run": 1, "path": "prefs.jsonl"})  # both
    assert [*at, "path"] in refused({"path": "nowhere/prefs.jsonl"})


def pairs(n: int) -> list[dict[str, str]]:
    return [
        {"prompt": f"{i}+{i}=", "chosen": str(2 * i), "rejected": str(2 * i + 7)} for i in range(n)
    ]


def write_dataset(settings: Settings, name: str, rows: list[dict[str, Any]]) -> None:
    datasets = settings.data_dir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    (datasets / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_reward_model_trains_on_a_dataset_and_exports_a_score_model(
    own_api: Any, own_settings: Settings
) -> None:
    from transformers import AutoModelForSequenceClassification

    write_dataset(own_settings, "prefs.jsonl", pairs(12))
    config = {
        **RM,
        "model": {"name": "tiny", "lora": {"rank": 4}},
        "kind_params": {"path": "prefs.jsonl", "batch_size": 4, "eval_fraction": 0.25},
    }
    run = execute(own_api, submit(own_api, config))
    assert run["status"] == "succeeded", run["error"]
    logged = series(own_api, run["id"], "rm/accuracy", "eval/rm_accuracy")
    assert logged["rm/accuracy"].keys() == {1, 2}
    assert logged["eval/rm_accuracy"].keys() == {0, 2}  # at the start and the last step
    assert all(v in (0.0, 1 / 3, 2 / 3, 1.0) for v in logged["eval/rm_accuracy"].values())

    exported = own_api.post(f"/api/models/{run['id']}/export", json={"step": "last"})
    assert exported.status_code == 200, exported.text
    model = AutoModelForSequenceClassification.from_pretrained(exported.json()["path"])
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    assert not hasattr(model, "peft_config")


def test_a_pairs_file_with_a_broken_row_fails_the_run_naming_it(
    own_api: Any, own_settings: Settings
) -> None:
    rows: list[dict[str, Any]] = [*pairs(3), {"prompt": "1+1=", "chosen": "", "rejected": "3"}]
    write_dataset(own_settings, "holes.jsonl", rows)
    config = {**RM, "kind_params": {"path": "holes.jsonl"}}
    run = execute(own_api, submit(own_api, config))
    assert run["status"] == "failed"
    assert "holes.jsonl row 4: chosen must be non-empty text" in run["error"], run["error"]
