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
followed its rollouts (time/step_s − time/rollout_s: scoring, the update, the critic's scoring
and training, the anchors' reference forward), the process's CPU seconds per step, the sampled
answers' mean length, the peak RSS, and which steps skipped their backward (GRPO does where
every group's rewards are equal, so its median can be a step without one: read the steps'
list); then per algorithm the median over the repeats and its difference from the first
algorithm's. Same seed, prompts, dtype and lengths on every side; only the algorithm differs
(RRPO with anchor_steps 1 and min_anchors 1, so its head scores from step 2 where the batch has
both outcomes; the features are computed every step either way).
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


def child(args: argparse.Namespace, algorithm: str) -> None:
    from conspo import metrics as M

    out = smollm2_steps(
        algorithm=algorithm, steps=args.steps, prompts=args.prompts, group=args.group,
        tokens=args.tokens, dtype=args.dtype,
        params={"anchor_steps": 1, "min_anchors": 1} if algorithm == "rrpo" else {},
    )  # fmt: skip
    metrics = out.pop("metrics")
    out["update"] = [m[M.TIME_STEP_S] - m[M.TIME_ROLLOUT_S] for m in metrics]
    # GRPO skips the backward of a step whose groups all have equal rewards; PPO's critic and
    # RRPO's anchor scores give every step a gradient: say which steps skipped it.
    out["skipped"] = [m.get(M.OPTIM_BACKWARD_SKIPPED, 0.0) for m in metrics]
    print(json.dumps(out))


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
    forwarded = [
        f"--{name}={getattr(args, name)}"
        for name in ("steps", "prompts", "group", "tokens", "dtype")
    ]
    for r, algorithm, out in interleaved(__file__, names, args.repeats, forwarded):
        row = {
            "wall": statistics.median(out["wall"]),
            "update": statistics.median(out["update"]),
            "cpu": statistics.median(out["cpu"]),
            "rss": out["peak_rss_gib"],
            "tokens": statistics.mean(out["tokens"]),
        }
        results[algorithm].append(row)
        print(f"  repeat {r} {algorithm}: wall/step {row['wall']:.1f} s (update"
              f" {row['update']:.1f} s), CPU/step {row['cpu']:.1f} s, sampled answers' mean"
              f" {row['tokens']:.0f} tokens, peak RSS {row['rss']:.2f} GiB"
              f" (steps' wall {[round(x, 1) for x in out['wall']]}, backward skipped"
              f" {[int(x) for x in out['skipped']]})", flush=True)  # fmt: skip
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
