"""A real-format model through the worker: byte-level BPE tokenizer, chat template, a dataset.

``tiny-chat`` is a random-init Qwen2 (3.5M parameters) whose tokenizer is a real byte-level BPE
with a Qwen-style chat template, saved in Hugging Face format: the same loading, templating and
training path as a real checkpoint. Each run goes through the worker's own code (``execute_run``)
on the math task over a dataset file in the data roots, with full fine-tuning in float32 and
with LoRA in bfloat16, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from backend.config import Settings
from tests.api.conftest import run_in_worker
from tests.support import ROOT

pytestmark = pytest.mark.services


def math_config(lora_rank: int, dtype: str) -> dict[str, Any]:
    return {
        "name": f"real-format-lora{lora_rank}",
        "steps": 2,
        "task": {"name": "math", "params": {"path": "easy.jsonl"}, "eval_size": 4},
        "model": {"name": "tiny-chat", "dtype": dtype, "lora": {"rank": lora_rank}},
        "prompt": {"template": "boxed", "chat_template": "on"},
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "eval": {"every": 0, "pass_k": 2, "at_start": False},
        "checkpoint": {"every": 0},
    }


@pytest.mark.parametrize(("lora_rank", "dtype"), [(0, "float32"), (8, "bfloat16")])
def test_a_chat_model_trains_on_a_dataset_through_the_worker(
    own_api: Any,
    own_settings: Settings,
    lora_rank: int,
    dtype: str,
) -> None:
    datasets = own_settings.data_dir / "datasets"  # the default data root
    datasets.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "data" / "math" / "easy.jsonl", datasets / "easy.jsonl")
    run = run_in_worker(own_api, math_config(lora_rank, dtype))
    assert run["status"] == "succeeded", run["error"]
    assert run["dtype"] == dtype and run["step"] == 2
    keys = "optim/loss,batch/pass_rate,eval/accuracy"
    series = own_api.get(f"/api/runs/{run['id']}/metrics?keys={keys}").json()["series"]
    assert series["optim/loss"]["steps"] == [1, 2]
    assert series["eval/accuracy"]["steps"] == [2]
    final = own_settings.run_dir(run["id"]) / "checkpoints" / "step_000002"
    # LoRA checkpoints hold the adapters alone; full fine-tuning the whole model.
    assert (final / "adapter_config.json").exists() == (lora_rank > 0)
    assert (final / "model.safetensors").exists() == (lora_rank == 0)
    assert (final / "tokenizer_config.json").exists()
