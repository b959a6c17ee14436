"""vLLM against the native decode loop on SmolLM2-135M-Instruct, and the weight push per step.

    .venv/bin/python bench/vllm_engine.py [--rows 64] [--new-tokens 128] [--repeats 3]
                                          [--dtype bf16|float32] [--threads 1] [--eager]
                                          [--quick]

Decode: the same 64 rows (8 chat prompts x 8 samples, reasoning-gym basic_arithmetic questions)
sampled at temperature 1 for up to 128 new tokens by ``NativeEngine`` and by ``VllmEngine``
(``sampling.engine: vllm``: vLLM in its own process, ``make vllm``), interleaved native, vllm,
native, ... in one process. Both stop at <|im_end|>, so the figure is tokens written per second
of CPU (the trainer's own CPU plus, for vllm, its engine process's) and per second of wall time.
vLLM's start (and, the first time on a machine, its compilation) is printed apart, outside the
repeats.

Sync: the policy is SmolLM2 with LoRA rank 16 (α 32, every linear layer, as the real-model
shape trains); after a change of the adapters the next sample pushes the merged weights
(written to shared memory, reloaded by vLLM in place). Its seconds per push are printed per
repeat: what a training step pays for vLLM beyond sampling.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import torch  # noqa: E402

SMOL = "smollm2-135m-instruct"
LORA = {"rank": 16, "alpha": 32, "target_modules": ["all-linear"]}


def cpu_seconds(pids: list[int]) -> float:
    """This process's CPU seconds plus those of the live processes ``pids``."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["bf16", "float32"], default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="vLLM without compilation")
    parser.add_argument("--quick", action="store_true", help="64 new tokens, 2 repeats")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.repeats = 64, 2
    torch.set_num_threads(args.threads)

    from conspo.config import ModelConfig, PromptConfig, SamplingConfig, TaskConfig
    from conspo.generation.batch import SampleRequest
    from conspo.generation.engines import NativeEngine
    from conspo.generation.rollout import encode_prompts, end_token_ids
    from conspo.generation.vllm_engine import VllmEngine
    from conspo.generation.vllm_interpreter import vllm_python
    from conspo.models.builtins import builtin_store
    from conspo.models.loading import load_pretrained, prepare_for_training
    from conspo.models.precision import bfloat16_note
    from conspo.tasks import make_task
    from conspo.tasks.prompts import PromptRenderer

    if vllm_python() is None:
        raise SystemExit("no interpreter with vllm: run `make vllm` first")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)")
    print(bfloat16_note())
    path = builtin_store().resolve(SMOL)
    model, tokenizer = load_pretrained(path, torch.device("cpu"), dtype)
    model.eval()
    task = make_task(TaskConfig(name="reasoning_gym", params={"dataset": "basic_arithmetic"}))
    render = PromptRenderer(PromptConfig(chat_template="on"), tokenizer)
    examples = task.train_prompts(random.Random(1), args.rows // args.group)
    ids, mask = encode_prompts(tokenizer, [render(e.prompt) for e in examples], torch.device("cpu"))
    ids, mask = ids.repeat_interleave(args.group, 0), mask.repeat_interleave(args.group, 0)
    stop = end_token_ids(tokenizer, model)

    def request(seed: int) -> SampleRequest:
        return SampleRequest(
            max_new_tokens=args.new_tokens,
            eos_id=stop,
            pad_id=tokenizer.pad_token_id,
            temperature=1.0,
            generator=torch.Generator().manual_seed(seed),
            group_size=args.group,
        )

    sampling = SamplingConfig(
        engine="vllm",
        prompts_per_step=args.rows // args.group,
        group_size=args.group,
        max_new_tokens=args.new_tokens,
        vllm_enforce_eager=args.eager,
    )
    vllm = VllmEngine(sampling, path, dtype)
    started = time.perf_counter()
    vllm.sample(model, ids[:1], mask[:1], request(0))  # start (compile on a first run) + push
    mode = "eager" if args.eager else "compiled"
    print(f"vLLM start + first push: {time.perf_counter() - started:.1f} s wall"
          f" ({mode}; vllm {vllm.info.get('version')})")  # fmt: skip
    engines = {"native": NativeEngine(), "vllm": vllm}
    assert vllm._process is not None
    pids = {"native": [], "vllm": [vllm._process.pid]}
    figures: dict[str, list[tuple[float, float, int]]] = {name: [] for name in engines}
    for repeat in range(args.repeats):
        for name, engine in engines.items():
            cpu0, wall0 = cpu_seconds(pids[name]), time.perf_counter()
            with torch.no_grad():
                batch = engine.sample(model, ids, mask, request(100 + repeat))
            wall = time.perf_counter() - wall0
            cpu = cpu_seconds(pids[name]) - cpu0
            tokens = int(batch.lengths.sum())
            figures[name].append((cpu, wall, tokens))
            print(f"repeat {repeat} {name:<6} {tokens:6d} tokens  CPU {cpu:6.2f} s  wall"
                  f" {wall:6.2f} s  {tokens / cpu:6.1f} tokens/CPU-s  {tokens / wall:6.1f}"
                  f" tokens/s", flush=True)  # fmt: skip
    vllm_rss = peak_rss_mib(vllm._process.pid)

    # The weight push a LoRA step pays: adapters changed, merged weights pushed on next sample.
    lora_model = prepare_for_training(model, ModelConfig(name=SMOL, lora=LORA), 0)
    syncs = []
    for repeat in range(args.repeats):
        with torch.no_grad():
            for name, p in lora_model.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p) * 1e-3)
        vllm.sync(lora_model)
        before = len(vllm.sync_seconds)
        vllm.sample(lora_model, ids[:1], mask[:1], request(200 + repeat))
        syncs.append(vllm.sync_seconds[before])
        print(f"repeat {repeat} push of the merged LoRA weights: {syncs[-1]:.2f} s", flush=True)
    vllm.close()

    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"{args.rows} rows x up to {args.new_tokens} new tokens, {args.dtype},"
          f" {args.threads} thread(s), {args.repeats} interleaved repeats")  # fmt: skip
    for name, runs in figures.items():
        per_cpu = [t / c for c, _, t in runs]
        per_wall = [t / w for _, w, t in runs]
        print(f"{name:<6} tokens/CPU-s {' '.join(f'{x:.1f}' for x in per_cpu)}"
              f" (median {statistics.median(per_cpu):.1f}); tokens/s"
              f" {' '.join(f'{x:.1f}' for x in per_wall)} (median"
              f" {statistics.median(per_wall):.1f})")  # fmt: skip
    ratio = statistics.median(t / c for c, _, t in figures["vllm"]) / statistics.median(
        t / c for c, _, t in figures["native"]
    )
    print(f"vllm/native tokens per CPU-second (medians): {ratio:.2f}x")
    pushes = " ".join(f"{s:.2f}" for s in syncs)
    print(f"weight push per step (LoRA r16 merged, {args.dtype}): {pushes} s"
          f" (median {statistics.median(syncs):.2f})")  # fmt: skip
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: trainer {own:.0f} MiB, vLLM's process {vllm_rss:.0f} MiB")


if __name__ == "__main__":
    main()
