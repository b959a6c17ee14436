"""A real-format checkpoint from the web form to separation curves and paper-style evaluation.

The run a user of a real model submits, at toy scale: a local Hugging Face checkpoint directory
(tiny-chat-math: a Qwen2 model with a byte-level BPE tokenizer and a chat template, copied out of
the model store into a configured model root, so it loads as any user's directory would), LoRA
adapters, bfloat16, the math task on a local dataset file in the paper's boxed prompt, and a
benchmark scored with avg@k / pass@k at step 0 and at the end. Everything goes through the form,
the API, the real Celery worker and the live run page.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from conspo.models.builtins import builtin_store
from conspo.models.store import MARKER
from tests.support import ROOT
from tests.ui.test_pages import trace_points, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FIXTURES = ROOT / "examples" / "data" / "math"


def _checkpoint_directory(root: Path) -> Path:
    """tiny-chat-math as a plain HF directory under ``root`` (no model-store marker)."""
    built = builtin_store().resolve("tiny-chat-math")
    assert isinstance(built, Path)
    out = root / "chat-math-checkpoint"
    if not out.exists():
        shutil.copytree(built, out, ignore=shutil.ignore_patterns(MARKER))
    return out


def test_lora_bf16_math_run_goes_from_the_form_to_separation_and_benchmark_curves(
    page: Any, shot: Any, ui_server: Any
) -> None:
    if ui_server.model_root is None or not ui_server.has_worker:
        pytest.skip("needs the test's own server: a model root and a worker")
    checkpoint = _checkpoint_directory(ui_server.model_root)
    datasets = ui_server.data_dir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    train_file = shutil.copy(FIXTURES / "easy.jsonl", datasets / "easy.jsonl")
    bench_file = shutil.copy(FIXTURES / "easy.jsonl", datasets / "easy-bench.jsonl")

    page.goto(f"{ui_server.url}/runs/new")
    page.wait_for_selector('[name="config.model.lora.rank"]')
    page.fill('[name="config.name"]', "ui-real-checkpoint")
    page.fill('[name="config.steps"]', "3")
    page.fill('[name="config.model.name"]', str(checkpoint))
    page.select_option('[name="config.task.name"]', "math")
    page.fill('[name="config.task.params.path"]', str(train_file))
    page.fill('[name="config.task.eval_size"]', "8")
    page.select_option("#f-prompt-template-choice", "boxed")
    page.fill('[name="config.sampling.prompts_per_step"]', "4")
    page.fill('[name="config.sampling.group_size"]', "8")
    page.fill('[name="config.sampling.max_new_tokens"]', "12")
    page.fill('[name="config.optim.lr"]', "0.0001")
    page.fill('[name="config.model.lora.rank"]', "8")
    page.click("details.adv > summary")
    page.select_option('[name="config.model.dtype"]', "bfloat16")
    page.fill('[name="config.eval.every"]', "0")
    page.fill('[name="config.checkpoint.every"]', "0")
    page.click('[data-add="config.eval.benchmarks"]')
    page.fill('[name="config.eval.benchmarks.0.name"]', "easy")
    page.fill('[name="config.eval.benchmarks.0.path"]', str(bench_file))
    page.fill('[name="config.eval.benchmarks.0.k"]', "4")
    page.fill('[name="config.eval.benchmarks.0.limit"]', "8")
    estimate = page.locator("#estimate")
    wait_until(
        page,
        lambda: estimate.get_attribute("data-total-bytes") or print(estimate.inner_text()),
        what="the memory estimate of the checkpoint's config",
    )
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run_id = int(page.url.rsplit("/", 1)[1])
    config = ui_server.api("GET", f"/api/runs/{run_id}")["config"]
    assert config["model"]["name"] == str(checkpoint) and config["model"]["lora"]["rank"] == 8
    assert config["model"]["dtype"] == "bfloat16" and config["task"]["name"] == "math"

    # The worker trains it; the open page draws the curves from the live stream.
    status = page.locator("#run-status")
    wait_until(
        page,
        lambda: re.search(r"succeeded|failed|cancelled", status.inner_text()),
        timeout=900,
        what="the run to finish",
    )
    run = ui_server.api("GET", f"/api/runs/{run_id}")
    assert run["status"] == "succeeded", run.get("error")
    assert run["dtype"] == "bfloat16"

    keys = "sep/gap,batch/valid_groups,eval/easy/avg@4,eval/easy/pass@4,optim/loss"
    series = ui_server.api("GET", f"/api/runs/{run_id}/metrics?keys={keys}")["series"]

    def values(key: str) -> dict[int, float | None]:
        return dict(zip(series[key]["steps"], series[key]["values"], strict=True))

    # Separation statistics on every step that had a group with both outcomes.
    assert sum(values("batch/valid_groups").values()) > 0, "no mixed group in 3 steps"
    assert any(v is not None and math.isfinite(v) for v in values("sep/gap").values())
    # The benchmark at step 0 (the starting checkpoint) and at the end; pass@k ≥ avg@k.
    avg, passed = values("eval/easy/avg@4"), values("eval/easy/pass@4")
    assert sorted(avg) == [0, 3] and sorted(passed) == [0, 3]
    assert all(0 <= avg[s] <= passed[s] <= 1 for s in avg)
    assert set(values("optim/loss")) == {1, 2, 3}

    wait_until(page, lambda: trace_points(page, "plot-gap") >= 1, what="the score-gap chart")
    wait_until(
        page,
        lambda: trace_points(page, "plot-other-eval/easy/avg@4") == 2,
        what="the benchmark's avg@4 chart with steps 0 and 3",
    )
    # Drawn beside the held-out accuracy, with the catalogue's description of avg@k.
    card = page.locator('[data-section="eval"] .chart-card').filter(has_text="eval/easy/avg@4")
    assert "Mean correctness over k samples" in card.inner_text()
    shot(page, "real_checkpoint_run")
    # The run's final checkpoint holds the LoRA adapters, not a copy of the whole model.
    final = max((ui_server.data_dir / "runs" / str(run_id) / "checkpoints").glob("step_*"))
    assert (final / "adapter_config.json").exists()
    assert not (final / "model.safetensors").exists()
