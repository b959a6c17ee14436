"""Wall and CPU seconds per GRPO step with asynchronous generation (sampling.max_staleness k)
against the same run synchronous, SmolLM2-135M-Instruct + LoRA r16 on this machine.

    PYTHONPATH=. .venv/bin/python bench/async_step.py [--ks 0 1] [--repeats 3] [--steps 3]
        [--prompts 4] [--group 8] [--tokens 128] [--dtype float32] [--engine native]

Each (k, repeat) is a process of its own (its CPU seconds and peak memory are its own), the ks
interleaved within each repeat and their order rotated from one repeat to the next. A run trains
``--steps`` steps of reasoning-gym chain_sum (2–3 terms of 1–2 digits) in the chat template at
temperature 1, no evaluation; step 1 (the warm-up, and under async the only one whose batch was
not generated while the previous step trained) is left out of the figures. Printed per run: the
median over steps 2… of the step's wall seconds (time/step_s: from asking for the batch to the
update's end), the process's CPU seconds per step (every thread: under async the generating
one's too), the trainer's wait for its batch, and the peak RSS; then per k the median over the
repeats. Same seed, prompts, dtype and lengths on every side; only k differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.step_runs import interleaved, smollm2_steps  # noqa: E402


def child(args: argparse.Namespace, k: int) -> None:
    from conspo import metrics as M

    out = smollm2_steps(
        algorithm="grpo", steps=args.steps, prompts=args.prompts, group=args.group,
        tokens=args.tokens, dtype=args.dtype,
        sampling={"engine": args.engine, "max_staleness": k},
    )  # fmt: skip
    metrics = out.pop("metrics")
    out["wait"] = [m.get(M.ASYNC_TRAINER_WAIT_S, m[M.TIME_ROLLOUT_S]) for m in metrics]
    out["lag"] = [m.get(M.ASYNC_POLICY_LAG, 0.0) for m in metrics]
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--engine", default="native", choices=["native", "vllm"])
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args, args.child)
        return
    shape = f"{args.prompts}×{args.group}×{args.tokens} {args.dtype} {args.engine}"
    print(f"SmolLM2-135M-Instruct + LoRA r16, GRPO, chain_sum, {shape}, {args.steps} steps"
          f" (step 1 left out), {args.repeats} repeats, ks {args.ks}")  # fmt: skip
    results: dict[int, list[dict[str, float]]] = {k: [] for k in args.ks}
    forwarded = [
        f"--{name}={getattr(args, name)}"
        for name in ("steps", "prompts", "group", "tokens", "dtype", "engine")
    ]
    for r, variant, out in interleaved(
        __file__, [str(k) for k in args.ks], args.repeats, forwarded
    ):
        k = int(variant)
        row = {
            "wall": statistics.median(out["wall"]),
            "cpu": statistics.median(out["cpu"]),
            "wait": statistics.median(out["wait"]),
            "rss": out["peak_rss_gib"],
            "tokens": statistics.mean(out["tokens"]),
        }
        results[k].append(row)
        print(f"  repeat {r} k={k}: wall/step {row['wall']:.1f} s, CPU/step"
              f" {row['cpu']:.1f} s, trainer waited {row['wait']:.1f} s, sampled answers' mean"
              f" {row['tokens']:.0f} tokens, peak RSS {row['rss']:.2f} GiB"
              f" (steps: wall {[round(x, 1) for x in out['wall']]},"
              f" lag {[int(x) for x in out['lag']]})", flush=True)  # fmt: skip
    print("median over repeats:")
    for k, rows in results.items():
        med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        print(f"  k={k}: wall/step {med['wall']:.1f} s, CPU/step {med['cpu']:.1f} s, trainer"
              f" waited {med['wait']:.1f} s, peak RSS {med['rss']:.2f} GiB")  # fmt: skip


if __name__ == "__main__":
    main()
