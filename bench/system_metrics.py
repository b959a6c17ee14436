"""What sampling system metrics costs a training step (conspo.system; target < 1%).

    PYTHONPATH=. .venv/bin/python bench/system_metrics.py [--repeats 3] [--steps 40]
        [--model tiny-arith|smollm2-135m-instruct] [--interval 2.0]

The same run (GRPO, ``--model``, the arithmetic task, 8 prompts × 8 rollouts) with
``logging.system_metrics`` off and on, each in a process of its own, interleaved (off, on, off,
on, ...), one thread each. Per side: the median over every timed step of every repeat of the
trainer's own step time (time/step_s) and of the process's CPU seconds per step, every repeat's
median printed; then on/off − 1 for both. The first two steps of each run are not timed
(warm-up). ``--interval``: the sampling interval (default 2 s, the config's default; 0.5 is the
lowest the config allows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(model: str, steps: int, sampled: bool, interval: float) -> dict[str, Any]:
    import torch

    from conspo import metrics as M
    from conspo.config import RunConfig
    from conspo.sink import MemorySink
    from conspo.training.trainer import train

    torch.set_num_threads(1)
    real = model.startswith("smollm2")
    task = {"name": "reasoning_gym", "params": {"dataset": "chain_sum",
            "answer_format": "last_number"}} if real else {"name": "arith"}  # fmt: skip
    cfg = RunConfig.model_validate({
        "algorithm": "grpo", "steps": steps, "task": {**task, "eval_size": 2},
        "model": {"name": model, "device": "cpu", **({"lora": {"rank": 16}} if real else {})},
        "sampling": {"prompts_per_step": 8, "group_size": 8,
                     "max_new_tokens": 32 if real else 8},
        "eval": {"every": 0, "at_start": False}, "checkpoint": {"every": 0},
        "logging": {"system_metrics": sampled, "system_interval_s": interval},
    })  # fmt: skip

    class CpuSink(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.cpu: list[float] = []

        def log_step(self, record: Any) -> None:
            super().log_step(record)
            self.cpu.append(time.process_time())

    sink = CpuSink()
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir)
    step_s = [sink.steps[s].metrics[M.TIME_STEP_S] for s in range(3, steps)]  # the last evaluates
    cpu = [b - a for a, b in zip(sink.cpu[2:-1], sink.cpu[3:-1], strict=False)]
    readings = sum(1 for r in sink.steps.values() if M.SYS_RSS_GIB in r.metrics)
    return {"step_s": step_s, "cpu_s": cpu, "steps_with_readings": readings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.steps, args.child == "on", args.interval)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.model}, 8 x 8 rollouts, {args.steps}"
          f" steps (2 warm-up), interval {args.interval} s, {args.repeats} interleaved"
          " repeats")  # fmt: skip
    for _ in range(args.repeats):
        for side in ("off", "on"):
            cmd = [sys.executable, __file__, "--child", side, "--model", args.model,
                   "--steps", str(args.steps), "--interval", str(args.interval)]  # fmt: skip
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            results[side].append(got)
            print(f"  {side:>3}: median step {statistics.median(got['step_s']) * 1000:.1f} ms,"
                  f" CPU {statistics.median(got['cpu_s']) * 1000:.1f} ms/step;"
                  f" steps with readings {got['steps_with_readings']}", flush=True)  # fmt: skip
    med = {
        side: (
            statistics.median(s for r in runs for s in r["step_s"]),
            statistics.median(c for r in runs for c in r["cpu_s"]),
        )
        for side, runs in results.items()
    }
    for side, (wall, cpu) in med.items():
        print(f"{side:>3}: median step {wall * 1000:.2f} ms, CPU {cpu * 1000:.2f} ms/step")
    wall_cost = med["on"][0] / med["off"][0] - 1
    cpu_cost = med["on"][1] / med["off"][1] - 1
    print(f"pooled: sampling costs {wall_cost:+.2%} step time, {cpu_cost:+.2%} CPU per step")
    # Each repeat's pair ran back to back: the ratio within a pair is the least moved by a
    # change of load between repeats; the headline is their median.
    pairs = [
        statistics.median(on["step_s"]) / statistics.median(off["step_s"]) - 1
        for off, on in zip(results["off"], results["on"], strict=True)
    ]
    print(f"per repeat (on/off - 1 of the median step): {', '.join(f'{p:+.2%}' for p in pairs)}")
    print(
        f"sampling costs {statistics.median(pairs):+.2%} step time, median of the pairs"
        " (target < 1%)"
    )


if __name__ == "__main__":
    main()
