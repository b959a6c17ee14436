"""Seconds per GRPO step of SmolLM2-135M-Instruct with LoRA on a CPU, float32 vs bfloat16.

    PYTHONPATH=. .venv/bin/python bench/smollm2_step.py [--dtypes float32 bfloat16]
        [--prompts 8] [--group 8] [--tokens 128] [--threads N]

examples/smollm2_gsm.yaml at the issue's shape (8 prompts × 8 rollouts × up to 128 new tokens),
no evaluation: per dtype, one warm-up step, then one timed step; printed are its wall seconds
(the trainer's time/step_s), the process's CPU seconds over the step, and the rollouts' mean
lengths and truncated fraction (a step's cost follows the answers' length). bfloat16 runs with
mixed precision (float32 master weights under autocast), as model.dtype's help advises on a CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.models.store import ModelStore  # noqa: E402
from conspo.sink import MemorySink, StepRecord  # noqa: E402
from conspo.training.trainer import train  # noqa: E402


class CpuTimedSink(MemorySink):
    """MemorySink that notes the process's CPU seconds when each step is logged."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: dict[int, float] = {}

    def log_step(self, record: StepRecord) -> None:
        super().log_step(record)
        self.cpu[record.step] = time.process_time()


def step_config(dtype: str, prompts: int, group: int, tokens: int) -> RunConfig:
    data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "smollm2_gsm.yaml").read_text())
    data.update(algorithm="grpo", steps=2)
    data["model"] = {**data["model"], "dtype": dtype, "mixed_precision": dtype != "float32"}
    data["sampling"] = {
        **data["sampling"],
        "prompts_per_step": prompts,
        "group_size": group,
        "max_new_tokens": tokens,
    }
    data["eval"] = {"every": 0, "at_start": False, "pass_k": 1}
    data["task"] = {**data["task"], "eval_size": 1}
    data["checkpoint"] = {"every": 0}
    return RunConfig.model_validate(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    store = ModelStore()
    store.resolve("smollm2-135m-instruct")
    print(
        f"torch threads {torch.get_num_threads()}, shape {args.prompts}x{args.group}x{args.tokens}"
    )
    for dtype in args.dtypes:
        sink = CpuTimedSink()
        with tempfile.TemporaryDirectory() as workdir:
            train(step_config(dtype, args.prompts, args.group, args.tokens), sink, workdir=workdir,
                  model_store=store)  # fmt: skip
        timed = sink.steps[2].metrics
        print(
            f"{dtype:<9} step 2: {timed[M.TIME_STEP_S]:.1f} s wall,"
            f" {sink.cpu[2] - sink.cpu[1]:.1f} s CPU; mean length {timed[M.LEN_POS]:.0f} (right)"
            f" / {timed[M.LEN_NEG]:.0f} (wrong) tokens,"
            f" truncated {timed[M.LEN_TRUNCATED_FRAC]:.2f},"
            f" step 1 (warm-up): {sink.steps[1].metrics[M.TIME_STEP_S]:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
