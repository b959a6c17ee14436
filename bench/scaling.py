"""Step time of data-parallel training: 1 vs N processes on this machine
(conspo.distributed.collectives), ddp (a full copy per process) vs fsdp (FSDP2: weights, gradients
and AdamW state sharded).

A step is ``--prompts`` prompts × ``--group`` rollouts of up to ``--tokens`` new tokens, GRPO,
one optimiser step, on a random Qwen2 of ``--hidden`` × ``--layers`` (the tiny models'
character tokenizer) saved in Hugging Face format. N processes split the step's groups
(``launch_local``: gloo on the CPU, NCCL with one GPU per rank when ``--device cuda``).

    .venv/bin/python bench/scaling.py                               # 1 and 2 processes, CPU
    .venv/bin/python bench/scaling.py --procs 1,2,4 --repeats 5
    .venv/bin/python bench/scaling.py --strategy ddp,fsdp            # both, N > 1 processes
    .venv/bin/python bench/scaling.py --device cuda --hidden 1024 --layers 12 --tokens 256

Each (processes, repeat) runs in a subprocess of its own, repeats interleaved (1, 2, 1, 2, ...)
so a noisy machine slows every setting alike. The first ``--warmup`` steps of a run are not
timed. Per setting it prints the min and median over repeats of: wall seconds per step (rank 0's
``time/step_s``), CPU seconds per step summed over every rank (user + system, read from /proc at
each step boundary: it shows what the extra processes cost), rollouts per second, and the
speed-up of the median against 1 process, and the peak RSS of the largest rank (rank 0 or a
child: ``getrusage``; on CPU the model lives in RSS, so fsdp's shards show there; on CUDA it is
host memory only). With more processes than free cores the ranks compete for them and the
speed-up says so. ``--strategy`` lists the strategies to compare at N > 1 (1 process is one
setting whatever the strategy).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def build_model(out: Path, hidden: int, layers: int) -> None:
    from conspo.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    dims = {
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, hidden // 64),
        "num_key_value_heads": max(1, hidden // 256),
        "max_position_embeddings": 1024,
    }
    build_tiny_model(tokenizer, seed=0, dims=dims).save_pretrained(out)
    tokenizer.save_pretrained(out)


def cpu_seconds_of_ranks() -> float:
    """User + system seconds of this process and its ``conspo.distributed.collectives`` children so
    far."""
    tick = os.sysconf("SC_CLK_TCK")
    times = os.times()
    total = times.user + times.system
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[1] == me:  # field 4, ppid
            total += (int(stat[11]) + int(stat[12])) / tick  # utime, stime
    return total


class TimingSink:
    """Records, at each step rank 0 logs, its step time and every rank's CPU seconds so far."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def log_step(self, record: Any) -> None:
        self.steps.append(
            {
                "step": record.step,
                "wall": record.metrics["time/step_s"],
                "rollouts": record.metrics["throughput/rollouts_per_s"],
                "cpu": cpu_seconds_of_ranks(),
            }
        )

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        pass


def one_run(args: argparse.Namespace, procs: int, strategy: str) -> dict[str, float]:
    """A run on ``procs`` processes; per timed step: wall, CPU (all ranks), rollouts/s; the
    peak RSS of the largest rank (MiB)."""
    import torch

    from conspo.config import RunConfig
    from conspo.launch.local import launch_local
    from conspo.models.builtins import builtin_store

    torch.set_num_threads(args.threads)
    cfg = RunConfig.model_validate(
        {
            "algorithm": "grpo",
            "steps": args.warmup + args.steps,
            "task": {"name": "arith", "eval_size": 4},
            "model": {"name": str(args.model), "device": args.device},
            "sampling": {
                "prompts_per_step": args.prompts,
                "group_size": args.group,
                "max_new_tokens": args.tokens,
            },
            "eval": {"every": 0, "at_start": False},
            "checkpoint": {"every": 0, "keep": 1},
            "resources": {"gpus": procs, "strategy": strategy},
        }
    )
    sink = TimingSink()
    with tempfile.TemporaryDirectory() as workdir:
        launch_local(cfg, sink, workdir=workdir, nprocs=procs, model_store=builtin_store())
    timed = sink.steps[args.warmup :]
    cpu_before = sink.steps[args.warmup - 1]["cpu"] if args.warmup else timed[0]["cpu"]
    n = len(timed) if args.warmup else len(timed) - 1
    return {
        "wall": statistics.fmean(s["wall"] for s in timed),
        "cpu": (timed[-1]["cpu"] - cpu_before) / max(n, 1),
        "rollouts": statistics.fmean(s["rollouts"] for s in timed),
        "rss_mib": max(  # Linux: KiB; the children are reaped by launch_local
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2", help="process counts to compare")
    parser.add_argument("--strategy", default="ddp", help="strategies to compare: ddp,fsdp")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a subprocess's run
    parser.add_argument("--one-strategy", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args, args.one, args.one_strategy)))
        return
    strategies = args.strategy.split(",")
    procs = [int(n) for n in args.procs.split(",")]
    # 1 process is one setting whatever the strategy.
    settings = [(p, s) for p in procs for s in (strategies if p > 1 else strategies[:1])]
    results: dict[tuple[int, str], list[dict[str, float]]] = {x: [] for x in settings}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model, args.hidden, args.layers)
        forwarded = sys.argv[1:]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
        for repeat in range(args.repeats):
            for p, strategy in settings:
                t0 = time.perf_counter()
                one = ["--one", str(p), "--one-strategy", strategy, "--model", str(model)]
                out = subprocess.run(
                    [sys.executable, __file__, *forwarded, *one],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    sys.exit(f"run with {p} processes ({strategy}) failed:\n{out.stderr[-4000:]}")
                results[p, strategy].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(
                    f"repeat {repeat + 1}/{args.repeats}, {p} process(es) {strategy}:"
                    f" {results[p, strategy][-1]['wall']:.3f} s/step"
                    f" ({time.perf_counter() - t0:.0f} s run)",
                    file=sys.stderr,
                )
    print(
        f"step: {args.prompts} prompts x {args.group} rollouts x {args.tokens} tokens, grpo;"
        f" model hidden {args.hidden} x {args.layers} layers; {args.device};"
        f" {args.threads} thread(s)/process; {os.cpu_count()} cores visible;"
        f" {args.steps} timed steps x {args.repeats} repeats"
    )
    header = (
        f"{'procs':>5}  {'strategy':>8}  {'wall s/step min/med':>20}  {'cpu s/step min/med':>19}"
    )
    print(f"{header}  {'rollouts/s med':>14}  {'speed-up (med)':>14}  {'peak RSS/rank MiB':>17}")
    base = statistics.median(r["wall"] for r in results[settings[0]])
    for p, strategy in settings:
        runs = results[p, strategy]
        walls = [r["wall"] for r in runs]
        cpus = [r["cpu"] for r in runs]
        rate = statistics.median(r["rollouts"] for r in runs)
        rss = statistics.median(r["rss_mib"] for r in runs)
        print(
            f"{p:>5}  {strategy if p > 1 else '-':>8}"
            f"  {min(walls):>9.3f} / {statistics.median(walls):<8.3f}"
            f"  {min(cpus):>8.3f} / {statistics.median(cpus):<8.3f}"
            f"  {rate:>14.1f}  {base / statistics.median(walls):>13.2f}x  {rss:>17.0f}"
        )


if __name__ == "__main__":
    main()
