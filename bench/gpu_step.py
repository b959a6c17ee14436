"""One RL step at a real model's shape: conspo's trainer (each generation engine) vs TRL.

The model is Qwen2-0.5B-shaped (24 layers, hidden 896, 14 query / 2 key-value heads, MLP 4864,
the real vocabulary of 151,936 rows, tied embeddings) with random weights, saved in Hugging Face
format and loaded by both sides with ``from_pretrained``. A step is 8 prompts × 8 rollouts of up
to 512 new tokens (a random model almost never samples EOS, so nearly every answer is 512 tokens
long), one optimiser step, GRPO with β = 0. Prompts are ~100-token texts from a JSONL file; the
tokenizer is the character tokenizer of the tiny models (the model's vocabulary is larger: ids
without a token decode to nothing, which only matters to the reward, not to the timing).

    .venv/bin/python bench/gpu_step.py                       # the issue's shape (needs a GPU)
    .venv/bin/python bench/gpu_step.py --preset cpu          # reduced size for a CPU machine
    .venv/bin/python bench/gpu_step.py --impls native,hf,vllm,trl --repeats 3

Each (side, repeat) runs in its own subprocess, and repeats are interleaved (native, hf, trl,
native, hf, trl, ...) so a noisy machine slows every side alike. Per side it prints the min and
median over repeats of: wall seconds per timed step, CPU seconds per step (the process's user +
system time: on a GPU it shows host overhead), generated tokens per second, and peak memory (GPU
``max_memory_allocated`` on CUDA, the process's peak RSS on CPU). ``vllm`` is skipped, with a
message, where vLLM is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # The issue's shape: Qwen2-0.5B dimensions, 8 prompts × 8 rollouts × 512 tokens.
    "qwen2-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151_936, prompts=8, group=8, max_new_tokens=512,
        prompt_chars=100,
    ),
    # A CPU-sized step that keeps the real vocabulary (the logits are what the memory bound is
    # about) and answers of 64 tokens, the low end of what users run.
    "cpu": dict(
        hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=151_936, prompts=2, group=4, max_new_tokens=64,
        prompt_chars=100,
    ),
}  # fmt: skip
MODEL_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def build_model(preset: dict[str, Any], out: Path) -> None:
    """A random-init Qwen2 of the preset's shape with the tiny models' tokenizer, in HF format."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from conspo.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        **{k: preset[k] for k in MODEL_KEYS},
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.model_max_length = 4096
    tokenizer.save_pretrained(out)


def write_prompts(preset: dict[str, Any], n: int, out: Path) -> None:
    """``n`` {prompt, answer} lines, each prompt ~prompt_chars characters (one token each)."""
    rng = random.Random(0)
    with out.open("w") as f:
        for i in range(n):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            head = f"Problem {i}: add {a} and {b}. "
            filler = "Show each step of the work, then give the sum. " * 4
            prompt = (head + filler)[: preset["prompt_chars"] - 7] + "Answer:"
            f.write(json.dumps({"prompt": prompt, "answer": str(a + b)}) + "\n")


# --------------------------------------------------------------------------------------------
# The two sides, each run in a child process
# --------------------------------------------------------------------------------------------


def peak_memory_mib(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_conspo(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    import torch

    from conspo import metrics as M
    from conspo.config import RunConfig
    from conspo.sink import MemorySink
    from conspo.training.trainer import train

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "params": {"beta": 0.0},
        # One extra step at the end, not timed: the final step also evaluates (eval.every 0
        # still evaluates at the end) and writes a checkpoint.
        "steps": args.warmup + args.steps + 1,
        # One held-out prompt, one sample: the final step's evaluation stays small (untimed).
        "task": {"name": "jsonl", "params": {"path": str(args.data)}, "eval_size": 1},
        "model": {"name": str(args.model), "dtype": args.dtype, "device": device,
                  "gradient_checkpointing": args.gradient_checkpointing},
        "sampling": {"prompts_per_step": preset["prompts"], "group_size": preset["group"],
                     "max_new_tokens": preset["max_new_tokens"], "engine": args.impl},
        "optim": {"lr": 1e-6, "micro_batch_tokens": args.micro_batch_tokens},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "logging": {"rollout_sample": preset["prompts"] * preset["group"]},
    })  # fmt: skip
    sink = _TimedSink(MemorySink())
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir)
    timed = sink.steps[args.warmup : -1]
    return {
        "wall_s": statistics.fmean(m["wall"] for m in timed),
        "cpu_s": statistics.fmean(m["cpu"] for m in timed),
        "tokens": statistics.fmean(m["tokens"] for m in timed),
        "peak_mib": peak_memory_mib(device),
        "rollout_s": statistics.fmean(m["metrics"][M.TIME_ROLLOUT_S] for m in timed),
    }


class _TimedSink:
    """Wraps a sink: per logged step, wall and CPU seconds since the previous one, and tokens
    generated."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.steps = inner, []
        self._mark()

    def _mark(self) -> None:
        self.t_wall, self.t_cpu = time.perf_counter(), time.process_time()

    def log_step(self, record: Any) -> None:
        self.steps.append({
            "wall": time.perf_counter() - self.t_wall,
            "cpu": time.process_time() - self.t_cpu,
            # logging.rollout_sample is the whole batch, so the records hold every length
            "tokens": sum(r.length for r in record.rollouts),
            "metrics": record.metrics,
        })  # fmt: skip
        self.inner.log_step(record)
        self._mark()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_trl(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    per_step = preset["prompts"] * preset["group"]
    total = args.warmup + args.steps

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [0.0 for _ in completions]  # the timing does not depend on the reward's value

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self.t_wall = self.t_cpu = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.t_wall, self.t_cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.steps.append({
                "wall": time.perf_counter() - self.t_wall,
                "cpu": time.process_time() - self.t_cpu,
            })  # fmt: skip

        def on_log(self, _a: Any, _s: Any, _c: Any, logs: dict | None = None, **__: Any) -> None:
            if logs and "completions/mean_length" in logs and self.steps:
                self.steps[-1]["tokens"] = logs["completions/mean_length"] * per_step

    timer = StepTimer()
    half = args.dtype in ("bfloat16", "auto") and device == "cuda"
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=per_step,
            num_generations=preset["group"],
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=preset["max_new_tokens"],
            max_steps=total,
            learning_rate=1e-6,
            beta=0.0,
            loss_type="grpo",
            temperature=1.0,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            use_cpu=device == "cpu",
            bf16=half,
            gradient_checkpointing=args.gradient_checkpointing,
            disable_tqdm=True,
            seed=0,
        )
        dtype = torch.bfloat16 if half else torch.float32
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype),
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
            processing_class=AutoTokenizer.from_pretrained(args.model, padding_side="left"),
            callbacks=[timer],
        )
        trainer.train()
    timed = timer.steps[args.warmup :]
    return {
        "wall_s": statistics.fmean(s["wall"] for s in timed),
        "cpu_s": statistics.fmean(s["cpu"] for s in timed),
        "tokens": statistics.fmean(s.get("tokens", float("nan")) for s in timed),
        "peak_mib": peak_memory_mib(device),
    }


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]
    result = run_trl(args, preset) if args.impl == "trl" else run_conspo(args, preset)
    print(json.dumps(result))


def run_child(impl: str, args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--child", "--impl", impl, "--preset", args.preset,
        "--model", str(model), "--data", str(data), "--warmup", str(args.warmup),
        "--steps", str(args.steps), "--threads", str(args.threads), "--dtype", args.dtype,
        "--micro-batch-tokens", str(args.micro_batch_tokens),
    ] + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed",
                "stderr": out.stderr[-3000:]}  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def available(impl: str) -> str | None:
    """Why ``impl`` cannot run here, or None."""
    if impl == "vllm":
        from conspo.generation.vllm_interpreter import vllm_available

        if not vllm_available():
            return "vLLM is not installed (make vllm, or CONSPO_VLLM_PYTHON)"
    if impl == "trl" and importlib.util.find_spec("trl") is None:
        return "TRL is not installed"
    return None


def summarise(impl: str, results: list[dict[str, Any]]) -> str:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return f"{impl:>7}: failed: {results[0].get('error')}"

    def mm(key: str, fmt: str) -> str:
        values = sorted(r[key] for r in ok)
        return f"{format(values[0], fmt)}/{format(statistics.median(values), fmt)}"

    tok_s = sorted(r["tokens"] / r["wall_s"] for r in ok)
    return (
        f"{impl:>7}: wall {mm('wall_s', '.2f')} s/step  CPU {mm('cpu_s', '.2f')} s/step  "
        f"{tok_s[-1]:,.0f}/{statistics.median(tok_s):,.0f} tokens/s (max/median)  "
        f"tokens/step {statistics.median(r['tokens'] for r in ok):,.0f}  "
        f"peak {mm('peak_mib', ',.0f')} MiB  (min/median of {len(ok)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen2-0.5b")
    parser.add_argument("--impls", default="native,hf,vllm,trl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--micro-batch-tokens", type=int, default=0)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    import torch

    preset = PRESETS[args.preset]
    impls = []
    for impl in args.impls.split(","):
        if (why := available(impl)) is not None:
            print(f"skipping {impl}: {why}")
        else:
            impls.append(impl)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(
        f"{args.preset}: {preset['num_hidden_layers']} layers, hidden {preset['hidden_size']},"
        f" vocab {preset['vocab_size']:,}; {preset['prompts']} prompts x {preset['group']}"
        f" rollouts x {preset['max_new_tokens']} new tokens; dtype {args.dtype}; micro-batch"
        f" tokens {args.micro_batch_tokens or 'off'}; checkpointing"
        f" {'on' if args.gradient_checkpointing else 'off'}; {device}; {args.threads} thread(s);"
        f" {args.warmup} warm-up + {args.steps} timed steps x {args.repeats} interleaved repeats"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model, data = Path(tmp) / "model", Path(tmp) / "prompts.jsonl"
        build_model(preset, model)
        write_prompts(preset, 256, data)
        results: dict[str, list[dict[str, Any]]] = {impl: [] for impl in impls}
        for _ in range(args.repeats):
            for impl in impls:
                results[impl].append(run_child(impl, args, model, data))
                if "error" in results[impl][-1]:
                    print(f"{impl} failed:\n{results[impl][-1]['stderr']}", file=sys.stderr)
                else:
                    print(f"  {impl}: {json.dumps(results[impl][-1])}", flush=True)
    for impl in impls:
        print(summarise(impl, results[impl]))


if __name__ == "__main__":
    main()
