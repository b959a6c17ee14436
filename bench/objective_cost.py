"""What an objective's extra parts cost per step: PPO's critic (a second backbone with its own
LoRA, scored and trained every step) and RRPO's anchors (a reference forward every step) against
GRPO, SmolLM2-135M-Instruct + LoRA r16 on this machine.

    PYTHONPATH=. .venv/bin/python bench/objective_cost.py [--algorithms grpo ppo rrpo]
        [--repeats 3] [--steps 3] [--prompts 4] [--group 8] [--tokens 128] [--dtype float32]

Each (algorithm, repeat) is a process of its own (its CPU seconds and peak memory are its own),
the algorithms interleaved within each repeat and their order rotated from one repeat to the
next. A run trains ``--steps`` steps of reasoning-gym chain_sum (2–3 terms of 1–2 digits) in the
chat template at temperature 1, no evaluation; step 1 (the warm-up) is left out of the figures.
Printed per run: the median over steps 2… of the step's wall seconds (time/step_s), of what
followed its rollouts (time/step_s − time/rollout_s: scoring, the update, the critic's scoring and
training, the anchors' reference forward), the process's
CPU seconds per step, the sampled answers' mean length and the peak RSS; then per algorithm the
median over the repeats and its difference from the first algorithm's. Same seed, prompts, dtype
and lengths on every side; only the algorithm differs (RRPO with anchor_steps 1 and min_anchors
1, so its head scores from step 2 where the batch has both outcomes; the features are computed
every step either way).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(args: argparse.Namespace, algorithm: str) -> None:
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
        "algorithm": algorithm, "steps": args.steps, "seed": 11,
        "params": {"anchor_steps": 1, "min_anchors": 1} if algorithm == "rrpo" else {},
        "task": {"name": "reasoning_gym", "eval_size": 2,
                 "params": {"dataset": "chain_sum", "answer_format": "last_number",
                            "config": {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                       "max_digits": 2}}},
        "prompt": {"chat_template": "on"},
        "model": {"name": "smollm2-135m-instruct", "dtype": args.dtype,
                  "mixed_precision": args.dtype != "float32", "lora": {"rank": 16, "alpha": 32}},
        "optim": {"lr": 1e-4},
        "sampling": {"prompts_per_step": args.prompts, "group_size": args.group,
                     "max_new_tokens": args.tokens, "temperature": 1.0},
        "eval": {"every": 0, "at_start": False},
        "checkpoint": {"every": 0},
        "logging": {"system_metrics": False},
    })  # fmt: skip
    sink = CpuSink()
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir, model_store=builtin_store())
    steps = sorted(s for s in sink.steps if s >= 2)
    metrics = {s: sink.steps[s].metrics for s in steps}
    print(json.dumps({
        "wall": [metrics[s][M.TIME_STEP_S] for s in steps],
        "cpu": [sink.cpu[s] - sink.cpu[s - 1] for s in steps],
        "update": [metrics[s][M.TIME_STEP_S] - metrics[s][M.TIME_ROLLOUT_S] for s in steps],
        "tokens": [statistics.mean(r.length for r in sink.steps[s].rollouts) for s in steps],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "ppo", "rrpo"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args, args.child)
        return
    shape = f"{args.prompts}×{args.group}×{args.tokens} {args.dtype}"
    print(f"SmolLM2-135M-Instruct + LoRA r16, chain_sum, {shape}, {args.steps} steps"
          f" (step 1 left out), {args.repeats} repeats, {args.algorithms}")  # fmt: skip
    names = list(args.algorithms)
    results: dict[str, list[dict[str, float]]] = {a: [] for a in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for algorithm in order:
            cmd = [sys.executable, __file__, "--child", algorithm] + [
                f"--{name}={getattr(args, name)}"
                for name in ("steps", "prompts", "group", "tokens", "dtype")
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{algorithm} repeat {r + 1} failed:\n{done.stderr[-3000:]}")
            out = json.loads(done.stdout.strip().splitlines()[-1])
            row = {
                "wall": statistics.median(out["wall"]),
                "update": statistics.median(out["update"]),
                "cpu": statistics.median(out["cpu"]),
                "rss": out["peak_rss_gib"],
                "tokens": statistics.mean(out["tokens"]),
            }
            results[algorithm].append(row)
            print(f"  repeat {r + 1} {algorithm}: wall/step {row['wall']:.1f} s (update"
                  f" {row['update']:.1f} s), CPU/step {row['cpu']:.1f} s, sampled answers' mean"
                  f" {row['tokens']:.0f} tokens, peak RSS {row['rss']:.2f} GiB"
                  f" (steps' wall {[round(x, 1) for x in out['wall']]})", flush=True)  # fmt: skip
    print("median over repeats:")
    base = {key: statistics.median(row[key] for row in results[names[0]])
            for key in results[names[0]][0]}  # fmt: skip
    for algorithm, rows in results.items():
        med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        print(f"  {algorithm}: wall/step {med['wall']:.1f} s (update {med['update']:.1f} s),"
              f" CPU/step {med['cpu']:.1f} s, peak RSS {med['rss']:.2f} GiB; against"
              f" {names[0]}: wall {med['wall'] - base['wall']:+.1f} s, update"
              f" {med['update'] - base['update']:+.1f} s, CPU {med['cpu'] - base['cpu']:+.1f} s,"
              f" RSS {med['rss'] - base['rss']:+.2f} GiB")  # fmt: skip


if __name__ == "__main__":
    main()
