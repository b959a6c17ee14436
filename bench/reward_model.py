"""A Bradley–Terry reward model trained on a verifiable task's own right and wrong answers:
SmolLM2-135M-Instruct + LoRA, its held-out pair accuracy with a 95% Wilson interval.

    PYTHONPATH=. .venv/bin/python bench/reward_model.py [--prompts 100] [--k 8] [--steps 40]
        [--threads 2] [--out /tmp/rm-bench]

1. Sampling: for ``--prompts`` distinct training problems of reasoning-gym's chain_sum (1-digit
   a ± b, the answer read as the reply's last number: examples/smollm2_gsm.yaml's task, about a
   fifth of this model's samples right), ``--k`` answers each from the base model at T = 0.7 in
   its chat template, each verified by the task.
2. Pairs: per problem, a right answer against a wrong one (``conspo.jobs.preferences
   .build_pairs``, at most ``--pairs-per-prompt``), the prompt the bare question (what the
   ``reward_model`` reward reads); written to ``OUT/pairs.jsonl`` (reused if there).
3. The ``reward_model`` job kind on them: the same base + LoRA, ``--eval-fraction`` of the
   problems held out with all their pairs; its held-out pair accuracy and margin at step 0 and
   at each evaluation, printed with the held-out pair count and a Wilson interval, beside a
   baseline on the same held-out pairs that reads no model: "the shorter answer wins" (a wrong
   answer of this model often rambles: how much of the accuracy a length cue alone gives).

Every figure is printed; the run is CPU-only (what the issue asks to measure is this CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.jobs import train_job  # noqa: E402
from conspo.jobs.preferences import Pair, build_pairs, write_rows  # noqa: E402
from conspo.jobs.reward_model import split_by_prompt  # noqa: E402
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.models.loading import load_pretrained  # noqa: E402
from conspo.models.store import ModelStore  # noqa: E402
from conspo.objectives.base import is_positive  # noqa: E402
from conspo.sink import MemorySink  # noqa: E402
from conspo.tasks import make_task  # noqa: E402
from conspo.tasks.base import distinct_prompts  # noqa: E402
from conspo.tasks.prompts import PromptRenderer  # noqa: E402
from conspo.training.loop import step_seed  # noqa: E402

MODEL = "smollm2-135m-instruct"
TASK = {
    "name": "reasoning_gym",
    "params": {
        "dataset": "chain_sum",
        "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        "answer_format": "last_number",
    },
}


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def run_config(args: argparse.Namespace, kind_params: dict[str, object]) -> RunConfig:
    return RunConfig.model_validate({
        "name": "reward model on chain_sum's own answers",
        "kind": "reward_model",
        "kind_params": kind_params,
        "steps": args.steps,
        "seed": args.seed,
        "model": {"name": MODEL, "dtype": "float32", "lora": {"rank": 16, "alpha": 32}},
        "task": {**TASK, "eval_size": 4},
        "prompt": {"chat_template": "on"},
        "optim": {"lr": args.lr, "warmup_steps": 4},
        "eval": {"every": args.eval_every, "at_start": True, "pass_k": 1},
        "checkpoint": {"every": 0},
    })  # fmt: skip


def sample_pairs(
    args: argparse.Namespace, store: ModelStore
) -> tuple[list[Pair], dict[str, float]]:
    """Sample k answers per problem from the base, verify, pair (right vs wrong)."""
    from conspo.generation.rollout import (
        decode_responses,
        encode_prompts,
        end_token_ids,
        sample,
    )

    config = run_config(args, {"from_run": 1})
    task = make_task(config.task)
    cpu = torch.device("cpu")
    model, tokenizer = load_pretrained(store.resolve(MODEL), cpu, torch.float32)
    model.eval()
    render = PromptRenderer(config.prompt, tokenizer)
    examples = distinct_prompts(task, random.Random(args.seed), args.prompts)
    generator = torch.Generator().manual_seed(args.seed)
    rollouts: list[tuple[str, str, bool]] = []
    t0 = time.perf_counter()
    per_batch = max(1, args.batch // args.k)
    for i in range(0, len(examples), per_batch):
        chunk = examples[i : i + per_batch]
        ids, mask = encode_prompts(tokenizer, [render(ex.prompt) for ex in chunk], cpu)
        ids, mask = ids.repeat_interleave(args.k, 0), mask.repeat_interleave(args.k, 0)
        with torch.no_grad():
            batch = sample(
                model,
                ids,
                mask,
                max_new_tokens=args.max_new_tokens,
                eos_id=end_token_ids(tokenizer, model),
                pad_id=tokenizer.pad_token_id,
                temperature=0.7,
                generator=generator,
                group_size=args.k,
            )
        texts = decode_responses(tokenizer, batch)
        for j, text in enumerate(texts):
            ex = chunk[j // args.k]
            rollouts.append((ex.prompt, text, is_positive(task.verify(text, ex))))
        print(f"  sampled {len(rollouts)} answers ({time.perf_counter() - t0:.0f} s)", flush=True)
    pairs, counts = build_pairs(rollouts, args.pairs_per_prompt)
    right = sum(c for _, _, c in rollouts)
    stats = {
        **counts,
        "answers": len(rollouts),
        "right": right,
        "pairs": len(pairs),
        "sample_s": time.perf_counter() - t0,
    }
    return pairs, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--pairs-per-prompt", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=64, help="answers per generation pass")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-fraction", type=float, default=0.3)
    ap.add_argument("--batch-size", type=int, default=8, help="pairs per step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/rm-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    store = builtin_store()

    pairs_file = args.out / "pairs.jsonl"
    if pairs_file.is_file():
        pairs = [Pair(**json.loads(line)) for line in pairs_file.read_text().splitlines()]
        print(f"pairs: {len(pairs)} reused from {pairs_file}")
    else:
        print(f"sampling {args.k} answers to each of {args.prompts} chain_sum problems ...")
        pairs, stats = sample_pairs(args, store)
        write_rows(pairs, pairs_file)
        print("sampling:", json.dumps({k: round(v, 1) for k, v in stats.items()}))
        print(
            f"  answers right: {stats['right']} of {stats['answers']}"
            f" ({stats['right'] / stats['answers']:.3f}); problems with a pair:"
            f" {stats['paired_prompts']} of {stats['prompts']}; pairs: {stats['pairs']}"
        )

    kind_params = {
        "path": str(pairs_file),
        "eval_fraction": args.eval_fraction,
        "batch_size": args.batch_size,
    }
    config = run_config(args, kind_params)
    _, held = split_by_prompt(
        pairs, args.eval_fraction, step_seed(config.seed, 0, "reward_model/split")
    )
    n = len(held)
    print(
        f"training: {args.steps} steps × {args.batch_size} pairs, LoRA r16, lr {args.lr};"
        f" held out: {n} pairs of {len({p.prompt for p in held})} problems"
    )
    sink = MemorySink()
    t0 = time.perf_counter()
    result = train_job(config, sink, workdir=args.out / "run", model_store=store)
    train_s = time.perf_counter() - t0
    print(f"run: {result.status} at step {result.last_step} in {train_s:.0f} s")
    for step in sorted(sink.steps):
        m = sink.steps[step].metrics
        if M.EVAL_RM_ACCURACY in m:
            acc = m[M.EVAL_RM_ACCURACY]
            lo, hi = wilson(acc * n, n)
            print(
                f"  step {step:3d}: held-out pair accuracy {acc:.3f} [{lo:.3f}, {hi:.3f}]"
                f" (n={n}), margin {m[M.EVAL_RM_MARGIN]:+.3f}"
            )
    train_acc = [sink.steps[s].metrics[M.RM_ACCURACY] for s in sorted(sink.steps) if s > 0]
    last = train_acc[-10:]
    mean_last = sum(last) / len(last)
    print(f"  training-batch accuracy, mean of the last {len(last)} steps: {mean_last:.3f}")
    shorter = sum(len(p.chosen) < len(p.rejected) for p in held) / max(n, 1)
    ties = sum(len(p.chosen) == len(p.rejected) for p in held)
    lo, hi = wilson(shorter * n, n)
    print(
        f"baseline 'the shorter answer wins' on the held-out pairs: {shorter:.3f}"
        f" [{lo:.3f}, {hi:.3f}] ({ties} ties counted wrong)"
    )


if __name__ == "__main__":
    main()
