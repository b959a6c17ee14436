"""Seconds per GRPO step of SmolLM2-135M-Instruct with LoRA on a CPU, float32 vs bfloat16.

    PYTHONPATH=. .venv/bin/python bench/smollm2_step.py [--dtypes float32 bfloat16]
        [--prompts 8] [--group 8] [--tokens 128] [--threads N] [--phases] [--before]

examples/smollm2_gsm.yaml at the issue's shape (8 prompts × 8 rollouts × up to 128 new tokens),
no evaluation: per dtype, one warm-up step, then one timed step; printed are its wall seconds
(the trainer's time/step_s), the process's CPU seconds over the step, and the rollouts' mean
lengths and truncated fraction (a step's cost follows the answers' length). bfloat16 runs with
mixed precision (float32 master weights under autocast), as model.dtype's help advises on a CPU.

``--phases``: the timed step's split, CPU and wall seconds of each phase (the functions are
wrapped with timers; nested phases are subtracted from the one around them): the prompts'
prefill, the decode steps (DecodeLoop), picking each next token (softmax and draw), the rest of
the sampler (masks, stop checks, compaction), the training forward + backward, the optimiser
step, and what is left of the step (drawing prompts, decoding text, verifying, statistics).
``--before``: the step as it was before issue 25's second round, for the before/after split: the
gradient pass as one forward over the whole padded batch (no length buckets,
conspo.training.microbatch.length_buckets) and no shared-prefix prefill in sampling
(conspo.generation.forward.MIN_SHARED_PREFIX).
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
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.sink import MemorySink, StepRecord  # noqa: E402
from conspo.training.trainer import train  # noqa: E402


class CpuTimedSink(MemorySink):
    """MemorySink that notes the process's CPU seconds when each step is logged, and times
    ``phases`` over step 2 alone (the timed one)."""

    def __init__(self, phases: Phases) -> None:
        super().__init__()
        self.cpu: dict[int, float] = {}
        self.phases = phases

    def log_step(self, record: StepRecord) -> None:
        super().log_step(record)
        self.cpu[record.step] = time.process_time()
        self.phases.on = record.step == 1  # step 2 runs next


class Phases:
    """CPU and wall seconds inside wrapped functions, by phase; an inner phase's time is taken
    out of the phase around it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.stack: list[list[float]] = []  # per open phase: [inner cpu, inner wall]
        self.on = False

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return inner(*args, **kwargs)
            c0, w0 = time.process_time(), time.perf_counter()
            self.stack.append([0.0, 0.0])
            try:
                return inner(*args, **kwargs)
            finally:
                nested_cpu, nested_wall = self.stack.pop()
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu - nested_cpu
                self.wall[phase] = self.wall.get(phase, 0.0) + wall - nested_wall
                if self.stack:
                    self.stack[-1][0] += cpu
                    self.stack[-1][1] += wall

        setattr(owner, name, timed)

    def install(self) -> None:
        import torch

        import conspo.generation.engines as engines
        import conspo.generation.rollout as rollout
        import conspo.training.update as update
        from conspo.generation.decode import DecodeLoop

        self.wrap(engines.NativeEngine, "sample", "sampler, other")
        self.wrap(rollout, "prefill", "prefill")
        self.wrap(DecodeLoop, "step", "decode")
        self.wrap(rollout, "_next_token", "next token")
        self.wrap(update, "backward", "train fwd+bwd")
        self.wrap(torch.optim.AdamW, "step", "optimiser")


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
    parser.add_argument("--phases", action="store_true", help="print the timed step's split")
    parser.add_argument("--before", action="store_true", help="no length buckets, no prefix")
    args = parser.parse_args()
    import torch

    if args.before:
        import conspo.generation.forward as forward
        import conspo.training.update as update

        update.length_buckets = lambda batch, group_size: [torch.arange(len(batch.lengths))]
        forward.MIN_SHARED_PREFIX = 10**9

    if args.threads:
        torch.set_num_threads(args.threads)
    store = builtin_store()
    store.resolve("smollm2-135m-instruct")
    print(
        f"torch threads {torch.get_num_threads()}, shape {args.prompts}x{args.group}x{args.tokens}"
    )
    phases = Phases()
    if args.phases:
        phases.install()
    for dtype in args.dtypes:
        phases.cpu.clear()
        phases.wall.clear()
        sink = CpuTimedSink(phases)
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
        if args.phases:
            step_cpu, step_wall = sink.cpu[2] - sink.cpu[1], timed[M.TIME_STEP_S]
            rest_cpu = step_cpu - sum(phases.cpu.values())
            rest_wall = step_wall - sum(phases.wall.values())
            for name, cpu in [*phases.cpu.items(), ("rest of the step", rest_cpu)]:
                wall = phases.wall.get(name, rest_wall)
                print(f"    {name:<18} {cpu:7.1f} s CPU ({cpu / step_cpu:4.0%}) {wall:7.1f} s wall",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
