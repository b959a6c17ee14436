"""A real pretrained model on real task generators, through the platform: SmolLM2-135M-Instruct
(LoRA) on a reasoning-gym task, trained by a real Celery worker on PostgreSQL + Redis; and the
reasoning_gym task's refusals at submit time.

Kept small (2 prompts × 2 rollouts × 16 tokens, 2 steps): the model is materialised once per
test session into the shared model store, and a step of it costs seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import Database
from backend.models import Metric
from conspo import metrics as M
from tests.api.conftest import Api
from tests.api.test_api_inputs import refusal
from tests.api.test_api_worker import finished, mode_api, submit

TASK_PARAMS = ["body", "config", "task", "params"]

SMOLLM2_RUN: dict[str, Any] = {
    "algorithm": "grpo",
    "steps": 2,
    "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 4}},
    "task": {
        "name": "reasoning_gym",
        "params": {"dataset": "chain_sum", "config": {"max_terms": 2, "max_digits": 1}},
        "eval_size": 2,
    },
    "prompt": {"chat_template": "on"},
    "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16},
    "optim": {"lr": 1e-4},
    "eval": {"every": 0, "at_start": True, "pass_k": 1},
    "logging": {"rollout_sample": 4},
}


def reasoning_gym_run(params: dict[str, Any]) -> dict[str, Any]:
    return {**SMOLLM2_RUN, "task": {"name": "reasoning_gym", "params": params}}


@pytest.mark.parametrize(
    ("params", "loc", "says"),
    [
        ({"dataset": "no_such_generator"}, ["dataset"], "unknown reasoning-gym generator"),
        ({"dataset": "chain_sum", "config": {"terms": 3}}, ["config", "terms"], "not a parameter"),
        (
            {"dataset": "chain_sum", "config": {"min_terms": "3"}},
            ["config", "min_terms"],
            "integer",
        ),
        (
            {"dataset": "chain_sum", "config": {"min_terms": 4, "max_terms": 2}},
            ["config", "max_terms"],
            "max_terms must be >= min_terms",
        ),
        (
            {"mixture": [{"name": "chain_sum"}, {"name": "nope", "weight": 2}]},
            ["mixture", 1, "name"],
            "unknown reasoning-gym generator",
        ),
    ],
)
def test_a_bad_generator_or_config_is_a_422_at_the_field(
    api: Api, params: dict[str, Any], loc: list[Any], says: str
) -> None:
    r = api.post("/api/runs", json={"config": reasoning_gym_run(params)})
    assert says in refusal(r, TASK_PARAMS + loc)


def test_the_form_offers_the_model_and_the_generators(api: Api) -> None:
    presets = api.get("/api/presets").json()
    model = next(m for m in presets["models"] if m["name"] == "smollm2-135m-instruct")
    assert "SmolLM2-135M-Instruct" in model["description"] and "Q4_1" in model["description"]
    task = next(t for t in presets["tasks"] if t["name"] == "reasoning_gym")
    assert {"chain_sum", "gsm_symbolic"} <= set(
        task["params_schema"]["properties"]["dataset"]["enum"]
    )
    estimate = api.post("/api/runs/estimate", json={"config": SMOLLM2_RUN})
    assert estimate.status_code == 200 and estimate.json()["fits"], estimate.text


@pytest.mark.slow
@pytest.mark.services
def test_smollm2_trains_on_a_reasoning_gym_task_through_the_worker(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    api = mode_api("cluster", tmp_path, request)  # PostgreSQL + Redis
    wp = workers(api.settings, model_store)
    wp.start()
    run_id = submit(api, SMOLLM2_RUN)
    run = finished(api, run_id, 900, wp)  # the first build of the model included
    assert run["status"] == "succeeded", (run["error"], wp.tail())
    assert run["step"] == 2 and run["device"] == "cpu"
    db = Database(api.settings)
    with db.session() as s:
        rows = s.execute(
            select(Metric.key, Metric.step).where(
                Metric.run_id == run_id,
                Metric.key.in_([M.LEN_TRUNCATED_FRAC, M.EVAL_ACCURACY, M.SEP_GAP, M.LOSS]),
            )
        ).all()
    db.dispose()
    steps: dict[str, set[int]] = {}
    for key, step in rows:
        steps.setdefault(key, set()).add(step)
    assert steps[M.LOSS] == steps[M.LEN_TRUNCATED_FRAC] == {1, 2}
    assert steps[M.EVAL_ACCURACY] == {0, 2}  # held-out accuracy from step 0
    items = api.get(f"/api/runs/{run_id}/rollouts?text=true").json()["items"]
    assert items and all(r["prompt"].endswith("<|im_start|>assistant\n") for r in items)
    assert all("<answer>" in r["prompt"] and r["length"] <= 16 for r in items)
    api.client.close()
