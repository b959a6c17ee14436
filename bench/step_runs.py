"""What the per-step benches share (``async_step.py``, ``objective_cost.py``): a short SmolLM2 +
LoRA run of reasoning-gym chain_sum in a process of its own, its figures per step, and variants
run interleaved, each in its own process.

    figures = smollm2_steps(algorithm="grpo", steps=3, prompts=4, group=8, tokens=128,
                            dtype="float32")        # in the child: train, then per-step figures
    for repeat, variant, out in interleaved(__file__, ["a", "b"], 3, ["--steps=3"]): ...

A run: chain_sum (2–3 terms of 1–2 digits) in the chat template at temperature 1, seed 11, lr
1e-4, no evaluation, no checkpoints, no system sampler. Step 1 (the warm-up) is left out of the
figures: each list holds steps 2….
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any


def smollm2_steps(
    *,
    algorithm: str,
    steps: int,
    prompts: int,
    group: int,
    tokens: int,
    dtype: str,
    params: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the run and return its figures: per step 2… its wall seconds (time/step_s), the
    process's CPU seconds (every thread), the sampled answers' mean length and all its metrics;
    and the process's peak RSS in GiB."""
    from conspo import metrics as M
    from conspo.config import RunConfig
    from conspo.models.builtins import builtin_store
    from conspo.sink import MemorySink, StepRecord
    from conspo.training.trainer import train

    class CpuSink(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.cpu: dict[int, float] = {}

        def log_step(self, record: StepRecord) -> None:
            super().log_step(record)
            self.cpu[record.step] = time.process_time()

    cfg = RunConfig.model_validate({
        "algorithm": algorithm, "steps": steps, "seed": 11, "params": params or {},
        "task": {"name": "reasoning_gym", "eval_size": 2,
                 "params": {"dataset": "chain_sum", "answer_format": "last_number",
                            "config": {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                       "max_digits": 2}}},
        "prompt": {"chat_template": "on"},
        "model": {"name": "smollm2-135m-instruct", "dtype": dtype,
                  "mixed_precision": dtype != "float32", "lora": {"rank": 16, "alpha": 32}},
        "optim": {"lr": 1e-4},
        "sampling": {"prompts_per_step": prompts, "group_size": group, "max_new_tokens": tokens,
                     "temperature": 1.0, **(sampling or {})},
        "eval": {"every": 0, "at_start": False},
        "checkpoint": {"every": 0},
        "logging": {"system_metrics": False},
    })  # fmt: skip
    sink = CpuSink()
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir, model_store=builtin_store())
    kept = sorted(s for s in sink.steps if s >= 2)
    return {
        "wall": [sink.steps[s].metrics[M.TIME_STEP_S] for s in kept],
        "cpu": [sink.cpu[s] - sink.cpu[s - 1] for s in kept],
        "tokens": [statistics.mean(r.length for r in sink.steps[s].rollouts) for s in kept],
        "metrics": [sink.steps[s].metrics for s in kept],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def interleaved(
    script: str, variants: list[str], repeats: int, forwarded: list[str]
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Run ``script --child VARIANT *forwarded`` for each variant in each repeat, the variants'
    order rotated from one repeat to the next, and yield (repeat from 1, variant, the JSON
    object the child printed last). A child that fails ends the bench with its stderr."""
    for r in range(repeats):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            cmd = [sys.executable, script, "--child", variant, *forwarded]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{variant} repeat {r + 1} failed:\n{done.stderr[-3000:]}")
            yield r + 1, variant, json.loads(done.stdout.strip().splitlines()[-1])
