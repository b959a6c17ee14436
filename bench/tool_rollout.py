"""What a tool turn costs: SmolLM2-135M-Instruct rollouts that call the python tool (native engine
and hf), beside plain rollouts of the same prompts and length cap.

The prompts show the tool format twice (two solved turns in the chat), so the model calls
`<code>print(a * b)</code>` on the question. With tools, generation pauses there, the sandbox runs
the code and the interpreter's output is fed back (the KV cache extended, native) or the prefix
recomputed (hf: one `generate` per turn). Without tools the same model writes the same format
and makes up the interpreter's block itself, so both arms produce rollouts of about the same
length: the difference is what the pause, the sandbox and the feeding cost.

Arms run interleaved in every repeat; each prints wall and CPU seconds (this process's CPU, and
the sandbox processes' it reaped), the tokens per rollout, the seconds spent waiting for tools,
and tokens per CPU-second. Medians at the end.

    PYTHONPATH=. .venv/bin/python bench/tool_rollout.py --repeats 3
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch

from conspo.config import ToolsConfig
from conspo.generation.batch import RolloutBatch, SampleRequest
from conspo.generation.engines import HfEngine, NativeEngine
from conspo.generation.rollout import encode_prompts, end_token_ids
from conspo.generation.tool_rollout import ToolUse
from conspo.models.builtins import builtin_store
from conspo.models.loading import load_pretrained
from conspo.sandbox import sandbox_available
from conspo.tools import make_toolbox
from tests.support import product_demos, tool_demo_chat


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--store", default="data/models")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("sandbox:", sandbox_available().reason)
    path = builtin_store(args.store).resolve("smollm2-135m-instruct")
    model, tok = load_pretrained(path, torch.device("cpu"), torch.float32)
    model.eval()
    questions = [(1234 + 97 * i, 5678 - 41 * i) for i in range(args.prompts)]
    texts = [
        tool_demo_chat(tok, product_demos(), f"What is {a} * {b}?")
        for a, b in questions
        for _ in range(args.group_size)
    ]
    ids, mask = encode_prompts(tok, texts, torch.device("cpu"))
    use = ToolUse(make_toolbox(ToolsConfig(names=["python"])), tok)

    def request(seed: int) -> SampleRequest:
        return SampleRequest(
            max_new_tokens=args.max_new_tokens,
            eos_id=end_token_ids(tok, model),
            pad_id=tok.pad_token_id,
            temperature=1.0,
            generator=torch.Generator().manual_seed(seed),
            group_size=args.group_size,
        )

    arms: dict[str, Callable[[SampleRequest], RolloutBatch]] = {
        "native+tools": lambda r: NativeEngine().sample_with_tools(model, ids, mask, r, use),
        "native plain": lambda r: NativeEngine().sample(model, ids, mask, r),
        "hf+tools": lambda r: HfEngine().sample_with_tools(model, ids, mask, r, use),
        "hf plain": lambda r: HfEngine().sample(model, ids, mask, r),
    }
    rows: dict[str, list[tuple[float, float, float, float, float]]] = {a: [] for a in arms}
    print(
        f"{'repeat':>6} {'arm':>13} {'wall s':>7} {'cpu s':>7} {'sandbox cpu':>11}"
        f" {'tools s':>7} {'tok/rollout':>11} {'calls':>5} {'tok/cpu-s':>9}"
    )
    for repeat in range(args.repeats):
        for arm, sample in arms.items():
            wall0, cpu0, child0 = time.perf_counter(), time.process_time(), children_cpu()
            batch = sample(request(repeat))
            wall = time.perf_counter() - wall0
            cpu, child = time.process_time() - cpu0, children_cpu() - child0
            tokens = float(batch.lengths.float().mean())
            calls = sum(len(c) for c in batch.tool_calls) if batch.tool_calls else 0
            rate = float(batch.lengths.sum()) / (cpu + child)
            rows[arm].append((wall, cpu, child, batch.tool_seconds, rate))
            print(
                f"{repeat:>6} {arm:>13} {wall:>7.2f} {cpu:>7.2f} {child:>11.2f}"
                f" {batch.tool_seconds:>7.2f} {tokens:>11.1f} {calls:>5} {rate:>9.1f}"
            )
    print("medians:")
    for arm, values in rows.items():
        wall, cpu, child, tools, rate = (statistics.median(v[i] for v in values) for i in range(5))
        print(
            f"  {arm:>13}: wall {wall:.2f} s, cpu {cpu:.2f} s + sandbox {child:.2f} s,"
            f" waiting for tools {tools:.2f} s, {rate:.1f} tokens per CPU-second"
        )


if __name__ == "__main__":
    main()
