"""Throughput levers of the native sampler and the training forward, each measured alone.

    .venv/bin/python bench/levers.py [--model b|smol] [--repeats 3] [--rows 64]
                                     [--prompt-tokens 10] [--new-tokens 128] [--threads 1]
                                     [--quick]

``--model b`` (the default) is the ~10M-parameter random-init Qwen2 of bench/throughput.py's
shape (b) (hidden 384, 4 layers, MLP 1536, the character tokenizer). ``--model smol`` is the
real-model shape of bench/throughput.py: SmolLM2-135M-Instruct (hidden 576, 30 layers, MLP
1536, grouped-query attention with 3 key/value heads, a 49,152-token vocabulary) with LoRA rank
16 on every linear layer, its prompts the chat-template renderings of reasoning-gym sums
(~50 tokens); there only ``hf``, ``loop``, ``loop bf16`` and the shipped training passes run
(the others are the small model's questions, and at this size cost minutes each).

Every variant runs in this one process, one thread, its repeats interleaved with the other
variants' (A B C A B C ...), so a change of load on the machine hits every variant alike.
Reported per variant: CPU time (process time) and wall time per generated token step, min and
median over the repeats, and the speed-up over the baseline on the CPU-time median.

Sampling variants (answers are forced to ``--new-tokens``: the EOS id is one the model can never
draw, so every variant decodes the same number of tokens):

* ``hf``: transformers' forward per token, its KV cache growing by concatenation (the sampler
  before the decode loop; ``sample(decode_loop=False)``)
* ``hf static``: transformers' ``StaticCache``, preallocated and written in place
  (``sample(static_cache=True)``); attention then runs over every preallocated position
* ``loop``: ``conspo.generation.decode.DecodeLoop`` (the default for Llama/Qwen2/Mistral): keys
  and values in place, attention over the written positions only, fused q/k/v and gate/up matmuls
* ``loop+check8``: also asks "has every row finished?" every 8 tokens instead of every token
* ``hf bf16`` / ``loop bf16``: bfloat16 autocast over float32 weights (``model.dtype: bfloat16``
  with ``mixed_precision: true``); the loop casts the weights once per call, autocast once per
  matmul per token

Training variants: the forward + backward of the token log-probs over the same rollouts, float32
and bfloat16 autocast, each as shipped (float32: transformers' default ``sdpa``, the CPU
flash-attention kernel; bf16 at this shape: its ``eager`` attention, explicit matmuls and a
softmax, ``conspo.generation.forward.EAGER_ATTENTION_BYTES``) and with the other attention forced;
with the max |Δ log-prob| of bf16 against fp32.

Tried and left out (not in the table): ``torch.compile`` of ``DecodeLoop.step`` (inductor, CPU):
the first call took ~100 s of CPU and it recompiled for every token position (the position is
a Python int the step slices with) until dynamo's recompile limit sent it back to eager; a
fixed-shape step would have to attend over the whole preallocated buffer, the cost ``hf static``
shows. The decode step is matmul- and memory-bound (the linear layers and the reads of the KV
cache), which compiling the elementwise ops around them cannot change much.

The matmul ceiling: float32 (and bf16) GFLOP/s of ``torch.mm`` at the model's shapes; each
variant's achieved GFLOP/s is given as a fraction of it (FLOPs: 2 per multiply-add of every
linear layer, the LM head included, attention scores and values added).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import conspo.generation.forward  # noqa: E402
from bench.throughput import MODEL_DIMS  # noqa: E402  (shape b's model: the same dims)
from conspo.generation.batch import RolloutBatch  # noqa: E402
from conspo.generation.rollout import sample  # noqa: E402
from conspo.models.precision import bfloat16_note  # noqa: E402
from conspo.models.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402
from conspo.training.logprobs import token_logprobs  # noqa: E402

GROUP = 8
SMOL_ONLY = ("hf", "loop", "loop bf16", "train fp32", "train bf16")  # --model smol's variants


def smol_setup(rows: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """SmolLM2-135M-Instruct with bench/throughput.py's LoRA, in training mode as the trainer
    holds it, and (rows // GROUP) chat prompts of its task, left-padded, each repeated GROUP
    times: (model, ids, mask)."""
    import random

    from bench.throughput import SMOL_LORA, SMOL_MODEL, SMOL_TASK
    from conspo.config import ModelConfig, PromptConfig, TaskConfig
    from conspo.models.loading import load_pretrained, prepare_for_training
    from conspo.models.store import ModelStore
    from conspo.tasks import make_task
    from conspo.tasks.prompts import PromptRenderer, with_prompts

    cfg = ModelConfig.model_validate({"name": SMOL_MODEL, "device": "cpu", "lora": SMOL_LORA})
    model, tokenizer = load_pretrained(ModelStore().resolve(SMOL_MODEL), torch.device("cpu"),
                                       torch.float32)  # fmt: skip
    model = prepare_for_training(model, cfg)
    chat = PromptConfig.model_validate({"chat_template": "on"})
    task = with_prompts(make_task(TaskConfig.model_validate(SMOL_TASK)),
                        PromptRenderer(chat, tokenizer))  # fmt: skip
    prompts = [ex.prompt for ex in task.train_prompts(random.Random(0), rows // GROUP)]
    enc = tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids = enc["input_ids"].repeat_interleave(GROUP, dim=0)
    return model, ids, enc["attention_mask"].repeat_interleave(GROUP, dim=0)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 20) -> float:
    """Best GFLOP/s of (m, k) @ (k, n) in ``dtype`` over ``repeats`` calls, on CPU time: the
    clock the achieved figures use, so a loaded machine cannot put a variant above 100%."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        a @ b
        best = min(best, time.process_time() - t0)
    return 2 * m * k * n / max(best, 1e-9) / 1e9


def model_flops_per_token(cfg: object, context: int) -> float:
    """FLOPs of one token through the model (2 per multiply-add), attending to ``context``."""
    h, f, layers, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size  # type: ignore[attr-defined]
    heads = cfg.num_attention_heads  # type: ignore[attr-defined]
    kv = h // heads * getattr(cfg, "num_key_value_heads", heads)  # grouped-query: narrower k, v
    per_layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * f) + 2 * 2 * h * context
    return layers * per_layer + 2 * h * v


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["b", "smol"], default="b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64, help="rollouts (groups of 8)")
    parser.add_argument("--prompt-tokens", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="32 rows, 64 new tokens")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.new_tokens = 32, 64
    torch.set_num_threads(args.threads)
    n, t = args.rows, args.new_tokens
    if args.model == "smol":
        model, ids, mask = smol_setup(n)
        p = ids.shape[1]
    else:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, 0, MODEL_DIMS).eval()
        p = args.prompt_tokens
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(4, model.config.vocab_size, (n // GROUP, p), generator=gen)
        ids = prompts.repeat_interleave(GROUP, dim=0)
        mask = torch.ones_like(ids)
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    n_params = n_params or sum(p.numel() for p in model.parameters())  # no LoRA: all of them
    never = cfg.vocab_size  # an EOS id the model cannot draw: every answer is t tokens long

    def sampler(loop: bool, static: bool, check: int, bf16: bool) -> Callable[[], RolloutBatch]:
        def run() -> RolloutBatch:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            with ctx, torch.no_grad():
                return sample(model, ids, mask, max_new_tokens=t, eos_id=never, pad_id=0,
                              generator=torch.Generator().manual_seed(1), group_size=GROUP,
                              static_cache=static, stop_check_every=check,
                              decode_loop=loop)  # fmt: skip

        return run

    sampling = {
        "hf": sampler(False, False, 1, False),
        "hf static": sampler(False, True, 1, False),
        "loop": sampler(True, False, 1, False),
        "loop+check8": sampler(True, False, 8, False),
        "hf bf16": sampler(False, False, 1, True),
        "loop bf16": sampler(True, False, 1, True),
    }
    if args.model == "smol":
        sampling = {k: v for k, v in sampling.items() if k in SMOL_ONLY}
    with torch.no_grad():
        batch = sampling["hf"]()
        same = {
            name: torch.equal(batch.response_ids, sampling[name]().response_ids)
            for name in ("hf static", "loop")
            if name in sampling
        }

    def train_pass(bf16: bool, attention: str) -> Callable[[], torch.Tensor]:
        """``attention``: "shipped" (sdpa in float32; eager under bf16 autocast at this shape,
        ``conspo.generation.forward.EAGER_ATTENTION_BYTES``), or "sdpa" / "eager" forced."""

        def run() -> torch.Tensor:
            if attention != "shipped":
                conspo.generation.forward.EAGER_ATTENTION_BYTES = 0  # no automatic switch
                model.set_attn_implementation(attention)
            model.zero_grad(set_to_none=True)
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            lps = []
            for rows in torch.arange(n).split(micro):  # gradients accumulate over micro-batches
                with ctx:
                    lp, _ = token_logprobs(model, batch.select(rows), 1.0, group_size=GROUP)
                lp.float().mean().backward()
                lps.append(lp.detach())
            lp = torch.cat(lps)
            conspo.generation.forward.EAGER_ATTENTION_BYTES = eager_budget
            model.set_attn_implementation("sdpa")
            return lp.detach().float()

        return run

    eager_budget = conspo.generation.forward.EAGER_ATTENTION_BYTES
    # SmolLM2's forward over all 64 x ~180 positions at once holds ~16 GB of activations: the
    # training passes take it 16 rows at a time (the trainer's micro-batches), the same FLOPs.
    micro = 16 if args.model == "smol" else n
    training = {
        "train fp32": train_pass(False, "shipped"),
        "train fp32 eager": train_pass(False, "eager"),
        "train bf16 sdpa": train_pass(True, "sdpa"),
        "train bf16": train_pass(True, "shipped"),
    }
    if args.model == "smol":
        training = {k: v for k, v in training.items() if k in SMOL_ONLY}
    lp32, lp16 = training["train fp32"](), training["train bf16"]()  # also their warm-ups
    variants = {**sampling, **training}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():  # interleaved: A B C ... A B C ...
            times[name].append(timed(fn))

    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size

    def best_of(m: int, dtype: torch.dtype, repeats: int) -> float:
        """The faster of the MLP's and the LM head's matmul shape: the ceiling is the best the
        CPU does at this model's shapes, not the worst."""
        return max(matmul_gflops(m, h, f, dtype, repeats), matmul_gflops(m, h, v, dtype, repeats))

    ceiling = {
        "fp32": best_of(n, torch.float32, 20),
        "bf16": best_of(n, torch.bfloat16, 20),
        "fp32 train": best_of(n * (p + t), torch.float32, 3),
        "bf16 train": best_of(n * (p + t), torch.bfloat16, 3),
    }
    # Work done, not padding skipped: each group's prompt once (the shared-prompt prefill),
    # then every row's t tokens. Training: forward + backward; the backward of a frozen base
    # (LoRA) computes only the inputs' gradients (1x the forward), of a trained one also the
    # weights' (2x).
    prompt_flops = n // GROUP * sum(model_flops_per_token(cfg, i) for i in range(p))
    decode_flops = prompt_flops + n * sum(model_flops_per_token(cfg, p + i) for i in range(t))
    frozen = any(not q.requires_grad for q in model.parameters())
    train_flops = (2 if frozen else 3) * decode_flops
    print(f"model {args.model}: {n_params / 1e6:.1f}M params; {n} rollouts "
          f"({n // GROUP} prompts x {GROUP}), "
          f"{p}-token prompts (padded), {t} new tokens (forced), {args.threads} thread(s), "
          f"{args.repeats} interleaved repeats")  # fmt: skip
    print("the same tokens as transformers' forward (fp32, same seed): "
          + ", ".join(f"{k} {v}" for k, v in same.items()))  # fmt: skip
    diff = (lp16 - lp32).abs()
    print(f"bf16 autocast vs fp32 token log-probs: max |diff| {diff.max():.4f}, "
          f"mean |diff| {diff.mean():.5f} (log-probs ~ {lp32.mean():.2f})")  # fmt: skip
    print(bfloat16_note())
    print("matmul ceiling GFLOP/s (CPU time) at the model's shapes: "
          + ", ".join(f"{k} {v:.0f}" for k, v in ceiling.items()))  # fmt: skip
    base_cpu = {"sample": statistics.median(c for c, _ in times["hf"]),
                "train": statistics.median(c for c, _ in times["train fp32"])}  # fmt: skip
    print(f"{'variant':<15} {'CPU min':>8} {'CPU med':>8} {'wall min':>8} {'wall med':>8} "
          f"{'ms/token':>8} {'speed-up':>8} {'of ceiling':>10}")  # fmt: skip
    each: list[str] = []
    for name, ts in times.items():
        cpu, wall = [c for c, _ in ts], [w for _, w in ts]
        is_train = name.startswith("train")
        base = base_cpu["train" if is_train else "sample"]
        flops = train_flops if is_train else decode_flops
        ceil = ceiling[("bf16" if "bf16" in name else "fp32") + (" train" if is_train else "")]
        achieved = flops / min(cpu) / 1e9  # CPU time: a preempted process does no work
        each.append(f"{name} " + " ".join(f"{c:.1f} ({flops / c / 1e9 / ceil:.0%})" for c in cpu))
        print(f"{name:<15} {min(cpu):8.3f} {statistics.median(cpu):8.3f} {min(wall):8.3f} "
              f"{statistics.median(wall):8.3f} {1e3 * statistics.median(cpu) / t:8.2f} "
              f"{base / statistics.median(cpu):7.2f}x {achieved / ceil:9.0%}")  # fmt: skip
    print("each repeat, CPU s (of ceiling): " + "; ".join(each))


if __name__ == "__main__":
    main()
