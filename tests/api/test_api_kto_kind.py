"""The ``kto`` job kind through the API and the worker's own code: bad kind_params are a 422 at the
field; a run trains on a labels dataset of the data dir and logs its KTO metrics; a run from a
finished RL run's stored rollouts labels them by outcome (the worker's job inputs) and trains on
them; a one-sided dataset fails the run naming what is missing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend.config import Settings
from tests.api.test_api_pipelines import BASE, execute, loc_of, series, submit

pytestmark = pytest.mark.services

KTO = {**BASE, "kind": "kto", "steps": 2}


def test_bad_kind_params_of_kto_are_refused_at_the_field(api: Any) -> None:
    def refused(kind_params: dict[str, Any]) -> list[list[Any]]:
        return loc_of(api.post("/api/runs", json={"config": {**KTO, "kind_params": kind_params}}))

    at = ["body", "config", "kind_params"]
    assert [*at, "beta"] in refused({"from_run": 1, "beta": 0})
    assert [*at, "desirable_weight"] in refused({"from_run": 1, "desirable_weight": -1.0})
    assert [*at, "undesirable_weight"] in refused({"from_run": 1, "undesirable_weight": 101})
    assert [*at, "batch_size"] in refused({"from_run": 1, "batch_size": 1})
    assert [*at, "max_per_prompt"] in refused({"from_run": 1, "max_per_prompt": 0})
    assert [*at, "max_pairs_per_prompt"] in refused({"from_run": 1, "max_pairs_per_prompt": 2})
    assert at in refused({})  # neither source
    assert at in refused({"from_run": 1, "path": "labels.jsonl"})  # both
    assert [*at, "path"] in refused({"path": "nowhere/labels.jsonl"})
    assert [*at, "from_run"] in refused({"from_run": 999_999})  # no such finished run


def write_dataset(settings: Settings, name: str, rows: list[dict[str, Any]]) -> None:
    datasets = settings.data_dir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    (datasets / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_kto_trains_on_a_labels_dataset_and_on_a_runs_rollouts(
    own_api: Any, own_settings: Settings
) -> None:
    rows = [{"prompt": f"{i}+{i}=", "completion": str(2 * i), "label": True} for i in range(4)]
    rows += [{"prompt": f"{i}+{i}=", "completion": str(2 * i + 3), "label": False} for i in (0, 1)]
    write_dataset(own_settings, "labels.jsonl", rows)
    config = {**KTO, "kind_params": {"path": "labels.jsonl", "batch_size": 4}}
    run = execute(own_api, submit(own_api, config))
    assert run["status"] == "succeeded", run["error"]
    logged = series(own_api, run["id"], "kto/kl", "kto/desirable_weight_ratio", "optim/loss")
    assert logged["kto/kl"].keys() == {1, 2} and logged["kto/kl"][1] == 0.0
    assert logged["optim/loss"][1] == pytest.approx(0.5)  # π_θ = π_ref: every σ is ½

    # an RL run's stored rollouts (tiny: wrong nearly always), labelled by their outcome
    rl = execute(own_api, submit(own_api, {**BASE, "steps": 1}))
    assert rl["status"] == "succeeded", rl["error"]
    from_rl = execute(own_api, submit(own_api, {**KTO, "kind_params": {"from_run": rl["id"]}}))
    examples = own_settings.run_dir(from_rl["id"]) / "kto_examples.jsonl"
    written = [json.loads(line) for line in examples.read_text().splitlines()]
    assert written and all(set(w) == {"prompt", "completion", "desirable"} for w in written)
    if all(w["desirable"] for w in written) or not any(w["desirable"] for w in written):
        assert from_rl["status"] == "failed"  # one side only: said so, by the field
        assert f"kind_params.from_run: run {rl['id']}'s stored rollouts" in from_rl["error"]
    else:
        assert from_rl["status"] == "succeeded", from_rl["error"]


def test_a_one_sided_dataset_fails_the_run_naming_the_missing_side(
    own_api: Any, own_settings: Settings
) -> None:
    rows = [{"prompt": "1+1=", "completion": c, "label": True} for c in ("2", "two")]
    write_dataset(own_settings, "liked.jsonl", rows)
    run = execute(own_api, submit(own_api, {**KTO, "kind_params": {"path": "liked.jsonl"}}))
    assert run["status"] == "failed"
    assert "liked.jsonl holds no undesirable example" in run["error"], run["error"]
