"""Outcome vs turn-level credit on a multi-turn game: GRPO on SmolLM2-135M-Instruct + LoRA
playing guess_number (a secret in [1, --high], "higher"/"lower" after each guess).

    PYTHONPATH=. .venv/bin/python bench/environment_credit.py [--steps 12] [--eval-size 100]
        [--credits outcome gigpo] [--high 8] [--threads 2]

Each arm is one run of the same config but ``environment.credit``: the same seeds, prompts,
sampling and budget. Its held-out evaluation (greedy, ``--eval-size`` held-out games) runs at
step 0 and at the end; printed per arm: the success rate with its 95% Wilson interval and the
mean turns of the greedy episodes, at both, and the run's wall and CPU seconds. The arms run one
after the other (each is one process's whole CPU). A 2-core CPU allows a dozen steps: what this
measures is whether the path trains, not how far credit assignment takes a model.

Measured on the shared 2-core CPU of this project's build machine (see the closing note of
issue 50 for the figures and the exact command).
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.jobs import train_job  # noqa: E402
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.sink import MemorySink  # noqa: E402


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def config(credit: str, args: argparse.Namespace) -> RunConfig:
    return RunConfig.model_validate({
        "name": f"guess_number {credit} credit",
        "algorithm": "grpo",
        "steps": args.steps,
        "seed": args.seed,
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 16}},
        "task": {
            "name": "environment",
            "eval_size": args.eval_size,
            "params": {
                "environment": "guess_number",
                "environment_params": {"low": 1, "high": args.high},
            },
        },
        "prompt": {"system": "Answer with one number only."},
        "sampling": {
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
        },
        "environment": {"max_turns": args.max_turns, "credit": credit},
        "optim": {"lr": args.lr},
        "eval": {"every": args.steps, "at_start": True, "pass_k": 1},
        "checkpoint": {"every": 0},
    })  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--credits", nargs="+", default=["outcome", "gigpo"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--high", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    store = builtin_store(Path(tempfile.gettempdir()) / "conspo-bench-models")
    print(
        f"guess_number in [1, {args.high}], {args.max_turns} turns, {args.steps} GRPO steps of"
        f" {args.prompts}x{args.group} rollouts, {args.max_new_tokens} tokens; held-out games:"
        f" {args.eval_size} (greedy)"
    )
    for credit in args.credits:
        sink = MemorySink()
        wall, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        with tempfile.TemporaryDirectory() as work:
            result = train_job(config(credit, args), sink, workdir=Path(work), model_store=store)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = used.ru_utime - cpu.ru_utime + used.ru_stime - cpu.ru_stime
        wall_s = time.perf_counter() - wall
        evals = [
            (step, rec.metrics)
            for step, rec in sorted(sink.steps.items())
            if M.EVAL_ACCURACY in rec.metrics
        ]
        print(f"\n{credit} credit: {result.status}, {wall_s:.0f} s wall, {cpu_s:.0f} s CPU")
        for step, m in evals:
            n = int(m.get(M.EVAL_PROBLEMS, args.eval_size))
            acc = m[M.EVAL_ACCURACY]
            low, high = wilson(acc * n, n)
            turns = m.get(M.EVAL_ENV_TURNS, math.nan)
            print(
                f"  step {step:>3}: success {acc:.3f} [{low:.3f}, {high:.3f}] of {n} games,"
                f" mean turns {turns:.2f}"
            )
        last = sink.steps[max(sink.steps)].metrics
        print(
            f"  training, last step: won {last.get(M.ENV_SUCCESS, math.nan):.3f}, turns"
            f" {last.get(M.ENV_TURNS, math.nan):.2f}, invalid turns"
            f" {last.get(M.ENV_INVALID, math.nan):.3f}"
        )


if __name__ == "__main__":
    main()
