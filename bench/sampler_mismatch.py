"""How far each engine's sampler is from the trainer: one short RL run per (engine, dtype) on
SmolLM2-135M-Instruct + LoRA r16, the mismatch/* statistics of every step printed.

    PYTHONPATH=. .venv/bin/python bench/sampler_mismatch.py [--engines native,vllm]
        [--dtypes float32,bfloat16] [--steps 2] [--prompts 4] [--group 8] [--new-tokens 96]

What a run page's "Sampler against trainer" panels show, side by side: mean and largest
|log π_old − log μ| over the sampled tokens, KL(μ ‖ π_old) per token, and the share of rollouts
that ``sequence_mask`` at C = 3 (vllm's default correction) leaves out. bfloat16 is mixed
precision (bfloat16 autocast over float32 weights) on the trainer's side; vLLM runs in the
run's dtype. The vllm engine needs ``make vllm``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.sink import MemorySink  # noqa: E402
from conspo.training.trainer import train  # noqa: E402

KEYS = (
    M.MISMATCH_LOGP_DIFF_MEAN,
    M.MISMATCH_LOGP_DIFF_MAX,
    M.MISMATCH_KL,
    M.MISMATCH_CORRECTED_FRAC,
    M.LEN_POS,
    M.LEN_NEG,
)


def config(engine: str, dtype: str, args: argparse.Namespace) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": args.steps,
        "seed": 0,
        "task": {"name": "reasoning_gym",
                 "params": {"dataset": "basic_arithmetic", "answer_format": "last_number"},
                 "eval_size": 4},
        "model": {"name": "smollm2-135m-instruct", "dtype": dtype,
                  "mixed_precision": dtype == "bfloat16", "lora": {"rank": 16}},
        "sampling": {"prompts_per_step": args.prompts, "group_size": args.group,
                     "max_new_tokens": args.new_tokens, "temperature": 1.0, "engine": engine,
                     "mismatch_correction": "sequence_mask" if engine != "hf" else "auto"},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="native,vllm")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=96)
    args = parser.parse_args()
    store = builtin_store()
    for dtype in args.dtypes.split(","):
        for engine in args.engines.split(","):
            sink = MemorySink()
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as workdir:
                train(config(engine, dtype, args), sink, workdir=workdir, model_store=store)
            seconds = time.perf_counter() - started
            for step, record in sorted(sink.steps.items()):
                figures = ", ".join(
                    f"{key.split('/')[-1]} {record.metrics.get(key, float('nan')):.3g}"
                    for key in KEYS
                )
                print(f"{engine:6s} {dtype:8s} step {step}: {figures}", flush=True)
            print(f"{engine:6s} {dtype:8s} {seconds:.0f} s for {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
