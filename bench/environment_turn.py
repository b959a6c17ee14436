"""What an environment's turns cost a step's generation, beside a plain rollout of the same
length: SmolLM2-135M-Instruct samples guess_number games turn by turn (each turn's end token
plays the turn, the observation is fed back as tokens into the KV cache) and the same prompts
plainly, every row writing to the same token budget.

    PYTHONPATH=. .venv/bin/python bench/environment_turn.py [--rows 8] [--tokens 128]
        [--repeats 3] [--threads 2]

Both sides: the native engine, float32, temperature 1.0, the same prompts (the games' first
observations in SmolLM2's chat template), the same budget. The plain side has no end token, so
each of its rows writes the whole budget; the environment side's rows end with their episodes
(or the budget), so the figure to compare is the cost per token fed (the model's and the
environment's, which take one decode column each). Repeats alternate the sides; every repeat's
wall and CPU seconds are printed, then the medians.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from conspo.config import PromptConfig, TaskConfig, ToolsConfig  # noqa: E402
from conspo.environments.runner import EnvironmentLimits  # noqa: E402
from conspo.generation.batch import SampleRequest  # noqa: E402
from conspo.generation.engines import NativeEngine  # noqa: E402
from conspo.generation.rollout import encode_prompts, end_token_ids  # noqa: E402
from conspo.generation.tool_rollout import (  # noqa: E402
    EnvironmentPlay,
    ToolEngine,
    ToolUse,
    turn_format,
)
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.models.loading import load_pretrained  # noqa: E402
from conspo.tasks import make_task  # noqa: E402
from conspo.tasks.environment import episode_starter  # noqa: E402
from conspo.tasks.prompts import PromptRenderer, with_prompts  # noqa: E402
from conspo.tools import make_toolbox  # noqa: E402


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    path = builtin_store().resolve("smollm2-135m-instruct")
    model, tokenizer = load_pretrained(path, device, torch.float32)
    model.eval()
    game = {"environment": "guess_number", "environment_params": {"high": 8}}
    render = PromptRenderer(PromptConfig(system="Answer with one number only."), tokenizer)
    task = with_prompts(make_task(TaskConfig(name="environment", params=game)), render)
    start = episode_starter(task, EnvironmentLimits(max_turns=args.turns))
    assert start is not None
    play = EnvironmentPlay(start, turn_format(tokenizer, render.chat))
    playing = ToolEngine(NativeEngine(), ToolUse(make_toolbox(ToolsConfig()), tokenizer, play))
    plain = NativeEngine()
    examples = task.train_prompts(random.Random(0), args.rows)
    ids, mask = encode_prompts(tokenizer, [ex.prompt for ex in examples], device)
    never = len(tokenizer) + 1  # an end token no row can draw: the plain rows fill the budget

    def request(end: object, seed: int) -> SampleRequest:
        return SampleRequest(
            max_new_tokens=args.tokens,
            eos_id=end,  # type: ignore[arg-type]
            pad_id=tokenizer.pad_token_id,
            temperature=1.0,
            generator=torch.Generator().manual_seed(seed),
            examples=examples,
        )

    print(
        f"SmolLM2-135M-Instruct, float32, {torch.get_num_threads()} threads: {args.rows} rows,"
        f" {args.tokens}-token budget, guess_number [1, 8] up to {args.turns} turns"
    )
    results: dict[str, list[tuple[float, float, int, float]]] = {"plain": [], "environment": []}
    for r in range(args.repeats):
        for side in ("plain", "environment") if r % 2 == 0 else ("environment", "plain"):
            engine, end = (
                (plain, never) if side == "plain" else (playing, end_token_ids(tokenizer, model))
            )
            wall, cpu = time.perf_counter(), cpu_seconds()
            batch = engine.sample(model, ids, mask, request(end, r))
            wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
            fed = int(batch.lengths.sum())
            turns = (
                statistics.mean(e.turn_count for e in batch.episodes if e is not None)
                if batch.episodes
                else 0.0
            )
            results[side].append((wall, cpu, fed, turns))
            print(
                f"  repeat {r} {side:>11}: {wall:6.2f} s wall, {cpu:6.2f} s CPU, {fed} tokens fed"
                f" ({1000 * wall / fed:.1f} ms wall per token), mean turns {turns:.2f}"
            )
    print("medians:")
    per_token = {}
    for side, rows in results.items():
        wall = statistics.median(w for w, _, _, _ in rows)
        cpu = statistics.median(c for _, c, _, _ in rows)
        fed = statistics.median(f for _, _, f, _ in rows)
        per_token[side] = statistics.median(1000 * w / f for w, _, f, _ in rows)
        print(
            f"  {side:>11}: {wall:.2f} s wall, {cpu:.2f} s CPU, {fed:.0f} tokens fed,"
            f" {per_token[side]:.2f} ms wall per token"
        )
    ratio = per_token["environment"] / per_token["plain"]
    print(f"environment / plain, wall per token fed: {ratio:.2f}×")


if __name__ == "__main__":
    main()
