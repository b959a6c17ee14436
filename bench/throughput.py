"""Rollouts per second: conspo's trainer vs TRL's GRPOTrainer on identical setups, interleaved.

    .venv/bin/python bench/throughput.py [--shapes tiny,b,c,b-noshare,smol] [--repeats 3]
                                         [--warmup 1] [--steps 2] [--threads 1] [--quick]
                                         [--dtype float32|bf16] [--device cpu|cuda]
                                         [--lora-rank 16]

Both sides train the same model with the same tokenizer on the same prompts: one optimiser step
per rollout batch, beta = 0, GRPO loss with per-sequence token means, temperature 1, the same
number of rollouts per step and the same max new tokens. Every (shape, side, repeat) runs in a
subprocess of its own (so its peak RSS is its own, and nothing cached carries over), and the
repeats are interleaved: conspo, TRL, conspo, TRL, ... so a change of load on the machine hits
both sides alike. A step is timed from the end of the previous step to the end of this one
(the same cut on both sides); CPU time is the process's (user + system), beside wall time.

Shapes:

* ``tiny``: the shipped task: `tiny-arith` (0.65M params, SFT), 1-digit a±b±c (~6-token
  prompts, ~3-token answers), 16 prompts x 8 rollouts, max 8 new tokens.
* ``b``: a random-init ~9.5M-parameter Qwen2 (hidden 384, 4 layers, MLP 1536, the character
  tokenizer) with short prompts (the same arithmetic, ~6 tokens) and answers forced to
  ``--new-tokens`` (128; 64 with --quick): the tokenizer's EOS is given an id past the model's
  vocabulary, so neither side can ever sample it. 8 prompts x 8 rollouts.
* ``c``: ``b`` with ~128-token prompts (120 filler characters before each question).
* ``b-noshare``: ``b`` with conspo's shared-prompt prefill turned off (every row prefills its own
  prompt, in sampling and in the training forward): what the rest of the trainer gives.

* ``smol``: the real-model shape. SmolLM2-135M-Instruct (the model store's
  ``smollm2-135m-instruct``) with LoRA rank 16 (α 32, every linear layer) on reasoning-gym's
  1-digit sums in the model's chat template (examples/smollm2_gsm.yaml), 8 prompts x 8 rollouts,
  up to ``--new-tokens`` (128) new tokens with real stopping on <|im_end|>, temperature 0.7,
  the task's own verifier as the reward. Both sides get the same rendered prompt strings and
  the same peft LoraConfig. TRL trains in micro-batches of 16 accumulated into the step's one
  update (all 64 at once it was killed out of memory at 23 GB; a batch that 16 does not divide
  takes its largest divisor below 16); conspo splits its gradient pass as its memory budget
  plans (``--memory-budget``, GiB; 0 is automatic). ``--prompts`` / ``--group`` change the batch.
* ``smol-ba``: ``smol`` on reasoning-gym's basic_arithmetic (issue 34's held-out shape:
  ``--prompts 6 --group 6 --new-tokens 96 --dtype bf16``).

Both sides sample the same prompts at every step: TRL's dataset is conspo's per-step draws in
order, with TRL's shuffling off. Rewards at shapes b and c are a fixed function of the
completion text (CRC32 parity), the same on both sides: a random model answers nothing
right, and groups need mixed rewards for both trainers to do the same work. TRL runs offline:
prompts from datasets.Dataset.from_list, report_to="none", use_cpu=True. ``--dtype bf16``:
bfloat16 autocast over float32 weights on both sides (conspo: model.dtype bfloat16 +
mixed_precision; TRL: bf16=True). TRL autocasts its training forward only: its generation runs
in float32, while conspo samples in bfloat16 (a caveat the figures carry).

``--device cuda`` (bench/gpu_proof.py runs it so): both sides train on the GPU (TRL without
use_cpu), each step's marks taken after a CUDA synchronise, and each side's peak GPU memory
(``torch.cuda.max_memory_allocated``) printed beside its RSS. ``--lora-rank 0`` (real-model shapes):
full fine-tuning on both sides instead of LoRA.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TINY_TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 3}}
# Shape (b): ~9.5M parameters, head_dim 64 (bench/levers.py measures the same model).
MODEL_DIMS = dict(
    hidden_size=384,
    intermediate_size=1536,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=6,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
FILLER_CHARS = 120  # shape (c): characters (= tokens) put before every question
TARGET_B = 2.0  # conspo / TRL rollouts/s at shape (b), issue 15
TARGET_SMOL = 2.0  # conspo / TRL rollouts/s at the real-model shape, both dtypes (issue 25)
SMOL_MODEL = "smollm2-135m-instruct"
SMOL_TASK = {
    "name": "reasoning_gym",
    "params": {"dataset": "chain_sum", "answer_format": "last_number",
               "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
}  # fmt: skip
SMOL_LORA = {"rank": 16, "alpha": 32}
SMOL_TEMPERATURE = 0.7  # at 1.0 this small model's samples turn to noise
# Shape smol-ba: reasoning-gym's basic_arithmetic, the task of the held-out measurement in
# issue 34 (6 prompts x 6 rollouts x 96 tokens there: --prompts 6 --group 6 --new-tokens 96).
BASIC_ARITHMETIC_TASK = {
    "name": "reasoning_gym",
    "params": {"dataset": "basic_arithmetic", "answer_format": "last_number"},
}
TRL_SMOL_MICRO_BATCH = 16  # TRL's training micro-batch at the real-model shape (see bench_trl)


class Shape:
    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.tiny = name == "tiny"
        # a pretrained model on a real task: nothing patched
        self.real = name in ("smol", "smol-ba")
        self.prompts, self.group = (16, 8) if self.tiny else (8, 8)
        if self.real:
            self.prompts, self.group = args.prompts or self.prompts, args.group or self.group
        self.max_new_tokens = 8 if self.tiny else args.new_tokens
        self.filler = FILLER_CHARS if name == "c" else 0
        self.share = name != "b-noshare"
        self.task = TINY_TASK
        if self.real:
            self.task = BASIC_ARITHMETIC_TASK if name == "smol-ba" else SMOL_TASK
        self.temperature = SMOL_TEMPERATURE if self.real else 1.0

    @property
    def rollouts(self) -> int:
        return self.prompts * self.group


def build_forced_model(out: Path) -> None:
    """Shape (b)'s model: the character tokenizer with EOS moved to the last id and a model
    whose vocabulary stops just before it, so no sampler can end an answer early."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from conspo.models.catalog import BOS, CHARSET, EOS, MAX_POSITIONS, PAD, UNK

    byte_char = bytes_to_unicode()
    tokens = [PAD, BOS, UNK] + [byte_char[ord(c)] for c in CHARSET] + [EOS]
    tokenizer = Qwen2Tokenizer(
        vocab={tok: i for i, tok in enumerate(tokens)}, merges=[], pad_token=PAD, eos_token=EOS,
        bos_token=BOS, unk_token=UNK, padding_side="left", model_max_length=MAX_POSITIONS,
    )  # fmt: skip
    config = Qwen2Config(vocab_size=len(tokenizer) - 1, pad_token_id=0, bos_token_id=1,
                         eos_token_id=len(tokenizer) - 1, **MODEL_DIMS)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def patch_task(shape: Shape) -> None:
    """Shapes b and c: CRC32-parity rewards and (c) long prompts, for both sides alike."""
    if shape.tiny or shape.real:
        return
    import random

    from conspo.tasks.arith import ArithTask

    sample = ArithTask.sample

    def long_sample(self: ArithTask, rng: random.Random) -> Any:
        ex = sample(self, rng)
        if shape.filler:
            filler = "".join(rng.choice("0123456789 ") for _ in range(shape.filler))
            ex = dataclasses.replace(ex, prompt=f"{filler}\n{ex.prompt}")
        return ex

    ArithTask.sample = long_sample  # type: ignore[method-assign]
    ArithTask.verify = lambda self, completion, example: float(zlib.crc32(completion.encode()) % 2)  # type: ignore[method-assign]


# The peak RSS of this process's live children (vLLM's engine process), MiB, largest seen.
CHILD_PEAK_MIB = [0.0]


def usage() -> tuple[float, float]:
    """(wall, CPU) seconds now; the CPU of this process and of its live children (the vllm
    engine's process, whose CPU the step pays as much as its own). On CUDA after a synchronise:
    a step's kernels may still be queued when its last Python line returns."""
    import psutil
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()

    r = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r.ru_utime + r.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            cpu += t.user + t.system
            status = Path(f"/proc/{child.pid}/status").read_text()
        except (psutil.NoSuchProcess, OSError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                CHILD_PEAK_MIB[0] = max(CHILD_PEAK_MIB[0], int(line.split()[1]) / 1024)
    return time.perf_counter(), cpu


def step_times(
    marks: list[tuple[float, float]], warmup: int, steps: int
) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of the ``steps`` steps after ``warmup``, from the end marks of every
    step. Each side runs one step more, untimed: conspo's last step also evaluates (the final
    evaluation of a run), which TRL's does not."""
    timed = marks[warmup - 1 : warmup + steps] if warmup else marks[: steps + 1]
    walls = [b[0] - a[0] for a, b in zip(timed, timed[1:], strict=False)]
    cpus = [b[1] - a[1] for a, b in zip(timed, timed[1:], strict=False)]
    return walls, cpus


def bench_conspo(shape: Shape, args: argparse.Namespace, model: str) -> dict:
    from conspo import metrics as M
    from conspo.config import RunConfig
    from conspo.models.builtins import builtin_store
    from conspo.sink import MemorySink
    from conspo.training.trainer import train

    if not shape.share:  # the ablation: every row prefills its own prompt
        import conspo.generation.engines
        import conspo.generation.forward

        native = conspo.generation.engines.NativeEngine.sample
        conspo.generation.engines.NativeEngine.sample = lambda self, *a, **k: native(
            self, *a, **{**k, "group_size": 1}
        )  # type: ignore[method-assign]
        conspo.generation.forward.shares_prompts = lambda batch, g: False  # type: ignore[assignment]

    class TimedSink(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.marks: list[tuple[float, float]] = []

        def log_step(self, record: Any) -> None:
            self.marks.append(usage())
            super().log_step(record)

    bf16 = {"dtype": "bfloat16", "mixed_precision": True} if args.dtype == "bf16" else {}
    real = {"lora": {**SMOL_LORA, "rank": args.lora_rank}} if shape.real else {}
    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "params": {"loss_agg": "seq-mean-token-mean", "beta": 0.0},
        "steps": args.warmup + args.steps + 1,
        "task": shape.task,
        "prompt": {"chat_template": "on" if shape.real else "auto"},
        "model": {"name": model, "device": args.device, **bf16, **real},
        "sampling": {"prompts_per_step": shape.prompts, "group_size": shape.group,
                     "max_new_tokens": shape.max_new_tokens, "temperature": shape.temperature,
                     "engine": args.engine},
        "optim": {"lr": 1e-4, "mini_batches": 1, "memory_budget": args.memory_budget},
        "eval": {"every": 0, "at_start": False},
        "checkpoint": {"every": 0},
        "logging": {"rollout_sample": 0},
    })  # fmt: skip
    sink = TimedSink()
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir, model_store=builtin_store())
    walls, cpus = step_times(sink.marks, args.warmup, args.steps)
    lengths = []
    for s in range(args.warmup + 1, args.warmup + args.steps + 1):
        m = sink.steps[s].metrics
        rate = m[M.BATCH_PASS_RATE]
        pos, neg = m[M.LEN_POS], m[M.LEN_NEG]
        lengths.append((rate * pos if rate else 0.0) + ((1 - rate) * neg if rate < 1 else 0.0))
    rollout_s = [sink.steps[s].metrics[M.TIME_ROLLOUT_S]
                 for s in range(args.warmup + 1, args.warmup + args.steps + 1)]  # fmt: skip
    return {"walls": walls, "cpus": cpus, "mean_len": statistics.mean(lengths),
            "rollout_s": rollout_s}  # fmt: skip


def bench_trl(shape: Shape, args: argparse.Namespace, model: str) -> dict:
    import random

    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from conspo.config import PromptConfig, TaskConfig
    from conspo.models.builtins import builtin_store
    from conspo.tasks import make_task
    from conspo.tasks.prompts import PromptRenderer, with_prompts
    from conspo.training.loop import step_seed

    path = builtin_store().resolve(model) if shape.tiny or shape.real else model
    task = make_task(TaskConfig.model_validate(shape.task))
    if shape.real:  # the same rendered chat prompts conspo's trainer samples from
        chat = PromptConfig.model_validate({"chat_template": "on"})
        task = with_prompts(task, PromptRenderer(chat, AutoTokenizer.from_pretrained(path)))
    # The prompts conspo's trainer draws at each step (conspo.training.rollouts: seed 0, the
    # step's seed, round 0), in order, and TRL's sampler told not to shuffle them: step k of
    # both sides samples the same prompts.
    total = args.warmup + args.steps + 1
    examples = [ex for step in range(1, total + 1)
                for ex in task.train_prompts(random.Random(step_seed(0, step, "p0")),
                                             shape.prompts)]  # fmt: skip
    by_prompt = {ex.prompt: ex for ex in examples}
    dataset = Dataset.from_list([{"prompt": ex.prompt} for ex in examples])
    lengths: list[float] = []

    def reward(
        prompts: list[str], completions: list[str], completion_ids: Any = None, **_: Any
    ) -> list[float]:
        if completion_ids is not None:
            lengths.extend(len(c) for c in completion_ids)
        return [task.verify(c, by_prompt[p]) for p, c in zip(prompts, completions, strict=True)]

    class StepMarks(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[tuple[float, float]] = []

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.marks.append(usage())

    marks = StepMarks()
    with tempfile.TemporaryDirectory() as out:
        # At the real-model shape TRL's training pass over all 64 rollouts at once holds every
        # layer's activations and was killed by the kernel at 23 GB: it takes them in micro-
        # batches, accumulated into the one optimiser step per generation batch of 64 (the
        # same update; "grpo" loss: per-sequence means, averaged over the 64 rollouts).
        micro = shape.rollouts
        if shape.real:  # the largest divisor of the batch up to TRL_SMOL_MICRO_BATCH
            micro = max(d for d in range(1, TRL_SMOL_MICRO_BATCH + 1) if shape.rollouts % d == 0)
        accumulate = shape.rollouts // micro
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulate,
            num_generations=shape.group,
            steps_per_generation=accumulate,  # one generation batch of 64 per optimiser step
            num_iterations=1,
            max_completion_length=shape.max_new_tokens,
            max_steps=max(args.warmup, 1) + args.steps,  # step_times: a mark before the first
            learning_rate=1e-4,
            beta=0.0,
            loss_type="grpo",
            temperature=shape.temperature,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            use_cpu=args.device == "cpu",
            bf16=args.dtype == "bf16",
            gradient_checkpointing=False,  # small models: recompute only costs time
            disable_tqdm=True,
            shuffle_dataset=False,
            seed=0,
        )
        lora = None
        if shape.real and args.lora_rank:
            from peft import LoraConfig, TaskType

            lora = LoraConfig(r=args.lora_rank, lora_alpha=SMOL_LORA["alpha"],
                              lora_dropout=0.0, target_modules="all-linear",
                              task_type=TaskType.CAUSAL_LM)  # fmt: skip
        trainer = GRPOTrainer(
            model=trl_model(path, args),
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(path),
            callbacks=[marks],
            peft_config=lora,
        )
        trainer.train()
    walls, cpus = step_times(marks.marks, args.warmup, args.steps)
    timed = lengths[args.warmup * shape.rollouts : (args.warmup + args.steps) * shape.rollouts]
    return {"walls": walls, "cpus": cpus, "mean_len": statistics.mean(timed)}


def trl_model(path: str, args: argparse.Namespace) -> Any:
    """TRL's policy. ``--trl-generation autocast`` (with ``--dtype bf16``): its ``generate``
    runs under bfloat16 autocast, as conspo samples in bfloat16; by default TRL autocasts only
    its training forward and generates in float32. The forwards' output dtypes are counted
    (``generation_dtypes``, printed with the result) to show which ran."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    generate = model.generate
    seen: dict[str, int] = {}
    GENERATION_DTYPES.append(seen)

    def counted(*a: Any, **k: Any) -> Any:
        hook = model.lm_head.register_forward_hook(
            lambda _m, _i, out: seen.__setitem__(str(out.dtype), seen.get(str(out.dtype), 0) + 1)
        )
        try:
            if args.trl_generation == "autocast" and args.dtype == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return generate(*a, **k)
            return generate(*a, **k)
        finally:
            hook.remove()

    model.generate = counted
    return model


GENERATION_DTYPES: list[dict[str, int]] = []  # per TRL model: its generation forwards by dtype


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    shape = Shape(args.shape, args)
    patch_task(shape)
    result = (bench_conspo if args.impl == "conspo" else bench_trl)(shape, args, args.model)
    # With vllm, the engine's process lives beside the trainer: their peaks add up (an upper
    # bound on what both held at once).
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["peak_rss_mib"] += CHILD_PEAK_MIB[0]
    if torch.cuda.is_initialized():
        result["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if GENERATION_DTYPES:
        result["trl_generation_dtypes"] = GENERATION_DTYPES[0]
    print(json.dumps(result))


def run_child(impl: str, shape: str, model: str, args: argparse.Namespace) -> dict:
    impl, _, engine = impl.partition(":")
    cmd = [sys.executable, __file__, "--impl", impl, "--shapes", shape, "--model", model,
           "--engine", engine or "native",
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--threads", str(args.threads),
           "--new-tokens", str(args.new_tokens), "--dtype", args.dtype,
           "--prompts", str(args.prompts), "--group", str(args.group),
           "--memory-budget", str(args.memory_budget), "--device", args.device,
           "--lora-rank", str(args.lora_rank),
           "--trl-generation", args.trl_generation]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode < 0:  # killed: SIGKILL is most often the kernel's out-of-memory killer
        why = f"killed by signal {-out.returncode}"
        why += " (out of memory? see dmesg)" if out.returncode == -9 else ""
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"{impl} at shape {shape}: {why}; largest child so far {peak:.0f} MiB", flush=True)
        return {"failed": why}
    if out.returncode != 0:
        raise SystemExit(f"{impl} at shape {shape} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(runs: list[dict], rollouts: int) -> dict[str, float]:
    """Per-step CPU and wall, min and median over every timed step of every repeat."""
    walls = [w for r in runs for w in r["walls"]]
    cpus = [c for r in runs for c in r["cpus"]]
    mean_len = statistics.mean(r["mean_len"] for r in runs)
    wall_med = statistics.median(walls)
    return {"cpu_min": min(cpus), "cpu_med": statistics.median(cpus), "wall_min": min(walls),
            "wall_med": wall_med, "rollouts_s": rollouts / wall_med,
            "rollouts_cpu_s": rollouts / statistics.median(cpus),
            "rollouts_cpu_best": rollouts / min(cpus),
            "tokens_s": rollouts * mean_len / wall_med, "mean_len": mean_len,
            "rss": max(r["peak_rss_mib"] for r in runs),
            "gpu": max(r.get("peak_gpu_mib", float("nan")) for r in runs)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["both", "conspo", "trl"], default="both")
    parser.add_argument("--shapes", default="tiny,b,c,b-noshare")
    parser.add_argument("--model", default="", help="(child) model name or directory")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bf16"], default="float32")
    parser.add_argument("--quick", action="store_true", help="64 new tokens, 2 repeats")
    parser.add_argument("--prompts", type=int, default=0, help="smol shapes: prompts per step")
    parser.add_argument("--group", type=int, default=0, help="smol shapes: rollouts per prompt")
    parser.add_argument("--memory-budget", type=float, default=0.0,
                        help="conspo's optim.memory_budget in GiB (0: automatic)")  # fmt: skip
    parser.add_argument("--engines", default="native",
                        help="conspo's sampling.engine(s), comma-separated: native, hf, vllm"
                        " (each its own row, interleaved with the rest)")  # fmt: skip
    parser.add_argument("--engine", default="native", help="(child) conspo's sampling.engine")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=SMOL_LORA["rank"],
        help="real-model shapes: LoRA rank on both sides (0: full fine-tuning)",
    )
    parser.add_argument("--trl-generation", choices=["default", "autocast"], default="default",
                        help="with --dtype bf16: TRL generates in float32 (its default) or"
                        " under bfloat16 autocast, as conspo samples")  # fmt: skip
    args = parser.parse_args()
    if args.impl != "both":
        args.shape = args.shapes
        child(args)
        return
    if args.quick:
        args.new_tokens, args.repeats = 64, 2
    shapes = [Shape(s, args) for s in args.shapes.split(",")]
    from conspo.models.precision import bfloat16_note

    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)")
    print(bfloat16_note())
    with tempfile.TemporaryDirectory() as tmp:
        forced = Path(tmp) / "forced-qwen2"
        build_forced_model(forced)
        engines = args.engines.split(",")
        ours = ["conspo"] if engines == ["native"] else [f"conspo:{e}" for e in engines]
        results: dict[str, dict[str, list[dict]]] = {
            s.name: {impl: [] for impl in [*ours, "trl"]} for s in shapes
        }
        for _ in range(args.repeats):
            for shape in shapes:
                model = "tiny-arith" if shape.tiny else str(forced)
                model = SMOL_MODEL if shape.real else model
                impls = ours if not shape.share else [*ours, "trl"]
                for impl in impls:
                    results[shape.name][impl].append(run_child(impl, shape.name, model, args))
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"{args.repeats} interleaved repeats x ({args.warmup} warm-up + {args.steps} timed"
          f" steps), {args.threads} thread(s), {args.dtype}, {args.device}, real-model LoRA rank"
          f" {args.lora_rank or 'none (full fine-tuning)'}; per step: CPU, wall s")  # fmt: skip
    print(f"{'shape':<10} {'impl':<12} {'rollouts':>8} {'len':>5} {'CPU min':>8} {'CPU med':>8} "
          f"{'wall min':>8} {'wall med':>8} {'rollouts/s':>10} {'tokens/s':>9} "
          f"{'RSS MiB':>8} {'GPU MiB':>8}")  # fmt: skip
    stats: dict[str, dict[str, dict[str, float]]] = {}
    for shape in shapes:
        for impl, all_runs in results[shape.name].items():
            runs = [r for r in all_runs if "failed" not in r]
            for failed in (r for r in all_runs if "failed" in r):
                print(f"{shape.name:<10} {impl:<12} failed: {failed['failed']}")
            if not runs:
                continue
            s = summary(runs, shape.rollouts)
            stats.setdefault(shape.name, {})[impl] = s
            print(f"{shape.name:<10} {impl:<12} {shape.rollouts:8d} {s['mean_len']:5.1f} "
                  f"{s['cpu_min']:8.3f} {s['cpu_med']:8.3f} {s['wall_min']:8.3f} "
                  f"{s['wall_med']:8.3f} "
                  f"{s['rollouts_s']:10.1f} {s['tokens_s']:9.0f} {s['rss']:8.0f}"
                  f" {s['gpu']:8.0f}")  # fmt: skip
            each = "; ".join(" ".join(f"{c:.1f}/{w:.1f}" for c, w in
                                      zip(r["cpus"], r["walls"], strict=True))
                             for r in runs)  # fmt: skip
            print(f"{'':<10} {impl:<12} each repeat's steps, CPU/wall s: {each}")
            if impl == "trl" and "trl_generation_dtypes" in runs[0]:
                print(f"{'':<10} {impl:<12} generation forwards by output dtype"
                      f" ({args.trl_generation}): {runs[0]['trl_generation_dtypes']}")  # fmt: skip
    trl_b = stats.get("b", {}).get("trl")
    for name, by_impl in stats.items():
        trl = by_impl.get("trl") or trl_b
        if trl is None:
            continue
        for impl, ours in by_impl.items():
            if impl == "trl":
                continue
            best_ratio = ours["rollouts_cpu_best"] / trl["rollouts_cpu_best"]
            cpu_ratio = ours["rollouts_cpu_s"] / trl["rollouts_cpu_s"]
            wall_ratio = ours["rollouts_s"] / trl["rollouts_s"]
            target = {"b": f" (target >= {TARGET_B:.1f}x)",
                      "smol": f" (target >= {TARGET_SMOL:.1f}x)"}.get(name, "")  # fmt: skip
            against = "" if "trl" in by_impl else " against TRL at b"
            # The median CPU time is the headline; the min (the figure least moved by other
            # processes) and the wall-time ratio are printed beside it.
            print(f"  {name}: {impl}/TRL {cpu_ratio:.2f}x on median CPU time ({best_ratio:.2f}x"
                  f" on min CPU, {wall_ratio:.2f}x on median wall){against}{target}")  # fmt: skip


if __name__ == "__main__":
    main()
