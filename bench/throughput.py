"""Rollouts per second: conspo's trainer vs TRL's GRPOTrainer on the identical setup.

Both train the same SFT base (model store `tiny-arith`) with the same character tokenizer on
1-digit a±b±c arithmetic: 16 prompts × 8 rollouts per step, the same max new tokens, one optimiser
step per rollout batch, beta = 0, GRPO loss with per-sequence token means, temperature 1. Each
runs in its own subprocess (so peak RSS is its own), does a few warm-up steps, then timed steps.

    .venv/bin/python bench/throughput.py [--warmup 2] [--steps 8] [--max-new-tokens 8]

TRL runs offline: prompts come from datasets.Dataset.from_list, report_to="none", use_cpu=True.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

PROMPTS, GROUP = 16, 8
TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 3}}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def bench_conspo(args: argparse.Namespace) -> dict:
    from conspo import metrics as M
    from conspo.config import RunConfig
    from conspo.models import ModelStore
    from conspo.sink import MemorySink
    from conspo.trainer import train

    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "params": {"loss_agg": "seq-mean-token-mean", "beta": 0.0},
        "steps": args.warmup + args.steps,
        "task": TASK,
        "model": {"name": "tiny-arith", "device": "cpu"},
        "sampling": {"prompts_per_step": PROMPTS, "group_size": GROUP,
                     "max_new_tokens": args.max_new_tokens},
        "optim": {"lr": 1e-4, "mini_batches": 1},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
        "logging": {"rollout_sample": 0},
    })  # fmt: skip
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir, model_store=ModelStore())
    timed = [sink.steps[s].metrics for s in range(args.warmup + 1, cfg.steps + 1)]
    seconds = sum(m[M.TIME_STEP_S] for m in timed)  # rollout + update; evaluation excluded
    return {"impl": "conspo", "rollouts_per_s": len(timed) * PROMPTS * GROUP / seconds,
            "step_s": seconds / len(timed), "peak_rss_mib": peak_rss_mib()}  # fmt: skip


def bench_trl(args: argparse.Namespace) -> dict:
    import random

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from conspo.config import TaskConfig
    from conspo.models import ModelStore
    from conspo.tasks import make_task

    path = ModelStore().resolve("tiny-arith")
    task = make_task(TaskConfig.model_validate(TASK))
    total = args.warmup + args.steps
    examples = task.train_prompts(random.Random(0), PROMPTS * total)
    by_prompt = {ex.prompt: ex for ex in examples}
    dataset = Dataset.from_list([{"prompt": ex.prompt} for ex in examples])

    def reward(prompts, completions, **_):
        return [task.verify(c, by_prompt[p]) for p, c in zip(prompts, completions, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.durations, self.t0 = [], 0.0

        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.durations.append(time.perf_counter() - self.t0)

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS * GROUP,
            num_generations=GROUP,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=args.max_new_tokens,
            max_steps=total,
            learning_rate=1e-4,
            beta=0.0,
            loss_type="grpo",
            temperature=1.0,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,  # a 0.6M-parameter model: recompute only costs time
            disable_tqdm=True,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path),
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(path),
            callbacks=[timer],
        )
        trainer.train()
    timed = timer.durations[args.warmup :]
    return {"impl": "trl", "rollouts_per_s": len(timed) * PROMPTS * GROUP / sum(timed),
            "step_s": sum(timed) / len(timed), "peak_rss_mib": peak_rss_mib()}  # fmt: skip


def run_child(impl: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--impl", impl, "--warmup", str(args.warmup),
           "--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens),
           "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{impl} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["both", "conspo", "trl"], default="both")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.impl != "both":
        import torch

        torch.set_num_threads(args.threads)
        result = bench_conspo(args) if args.impl == "conspo" else bench_trl(args)
        print(json.dumps(result))
        return
    from conspo.models import ModelStore

    print(f"model: {ModelStore().resolve('tiny-arith')} (built now if missing)")
    print(
        f"{PROMPTS} prompts x {GROUP} rollouts/step, max_new_tokens={args.max_new_tokens}, "
        f"{args.warmup} warm-up + {args.steps} timed steps, {args.threads} thread(s)"
    )
    results = [run_child(impl, args) for impl in ("conspo", "trl")]
    for r in results:
        print(f"{r['impl']:>7}: {r['rollouts_per_s']:8.1f} rollouts/s  "
              f"{r['step_s']:.3f} s/step  peak RSS {r['peak_rss_mib']:.0f} MiB")  # fmt: skip
    ratio = results[0]["rollouts_per_s"] / results[1]["rollouts_per_s"]
    print(f"  ratio: {ratio:.2f}x conspo/TRL (target >= 1.5x)")


if __name__ == "__main__":
    main()
