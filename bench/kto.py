"""KTO on a model's own right and wrong answers: held-out greedy accuracy at step 0 and after.

    PYTHONPATH=. .venv/bin/python bench/kto.py [--prompts 256] [--k 8] [--temperature 1.0]
        [--steps 100] [--beta 0.5] [--desirable-weight 3.5] [--lr 1e-5] [--seed 0]
        [--threads 2] [--out /tmp/kto-bench]

1. Sampling: for ``--prompts`` distinct training problems of the arith task (1-digit a±b±c,
   examples/run.yaml's), ``--k`` answers each from the built-in ``tiny-arith`` at
   ``--temperature`` (1.0: the RL runs' sampling), each verified by the task: what a finished
   run's stored rollouts hold.
2. Examples: those answers handed to the kind as a finished run's stored rollouts (prompt as
   the policy saw it, answer, reward), through the worker's path (``prepare_inputs`` with
   ``kind_params.from_run``): right answers desirable, wrong ones undesirable, distinct per
   problem and side, at most ``--per-prompt`` of each, written to ``OUT/run-SEED/
   kto_examples.jsonl``; the sides as unbalanced as the model's accuracy makes them.
3. The ``kto`` job kind on that file from the same base: the task's held-out problems (never
   trained on: the procedural split is a fixed hashed subset) answered greedily at step 0 and at
   each evaluation, printed with the problem count n and a 95% Wilson interval; beside it, the
   per-step KTO metrics (z_0, the two sides' implicit rewards, the weight ratio).

Every figure is printed; CPU only. Measured here (2-core box, one thread, ~20-60 s a run; held-out
n = 256 problems, greedy, 0.559 at step 0 in every run; batch 32; "data" is prompts × k at T):

    data                   n_D/n_U  λ_D   β    lr    steps seed  step-end accuracy
    256 × 8 at T = 1.0      0.29    1.0  0.1  1e-4   100   0    0.000  (−55.9 points)
    256 × 8 at T = 1.0      0.29    3.5  0.1  1e-4   100   0    0.270  (−28.9)
    256 × 8 at T = 1.0      0.29    3.5  0.1  3e-5   100   0    0.387  (−17.2)
    256 × 8 at T = 1.0      0.29    3.5  0.1  1e-5   100   0    0.574  (+1.6)
    256 × 8 at T = 1.0      0.29    3.5  0.5  1e-5   100   0    0.602  (+4.3)
    256 × 8 at T = 1.0              3.5  0.5  1e-5   100   1    0.516  (−4.3)
    1024 × 8 at T = 1.0     0.29    3.5  0.5  1e-5   300   0    0.562  (+0.4)
    512 × 8 at T = 0.7      0.39    1.0  0.5  1e-5   150   0    0.117  (−44.1)
    512 × 8 at T = 0.7      0.39    2.5  0.5  1e-5   150   0    0.559  (0.0)

Left at λ_D = 1 on data whose wrong answers outnumber the right ones 3 to 1 (λ_D·n_D/(λ_U·n_U)
≈ 0.3, far under the paper's [1, 4/3]), KTO pushes nearly every completion down and the model
stops answering: the collapse the weight ratio metric is there to warn of. Balanced, at lr 1e-5,
it stays within the noise of the start (−4.3 to +4.3 points over seeds and settings, each
Wilson interval ±6): one offline pass over a fixed sample of this fragile model's answers does
not move it reliably (DPO on the same 256 × 8 sample, 235 pairs, batch 16, lr 3e-5: 0.457 after
100 steps). Defaults below are the balanced setting.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.jobs import prepare_inputs, train_job  # noqa: E402
from conspo.jobs.preferences import EXAMPLES_FILE  # noqa: E402
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.models.loading import load_pretrained  # noqa: E402
from conspo.models.store import ModelStore  # noqa: E402
from conspo.objectives.base import is_positive  # noqa: E402
from conspo.sink import MemorySink  # noqa: E402
from conspo.tasks import make_task  # noqa: E402
from conspo.tasks.base import distinct_prompts  # noqa: E402
from conspo.tasks.prompts import PromptRenderer  # noqa: E402

MODEL = "tiny-arith"
TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 3, "operators": "+-"}}


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
        "name": "kto on tiny-arith's own answers",
        "kind": "kto",
        "kind_params": kind_params,
        "steps": args.steps,
        "seed": args.seed,
        "model": {"name": MODEL},
        "task": {**TASK, "eval_size": args.eval_size},
        "optim": {"lr": args.lr, "warmup_steps": args.warmup},
        "eval": {"every": args.eval_every, "at_start": True, "pass_k": 1},
        "checkpoint": {"every": 0},
    })  # fmt: skip


def sample_rollouts(args: argparse.Namespace, store: ModelStore) -> list[tuple[str, str, float]]:
    """(prompt as rendered, answer, reward) for k samples of each training problem: what a
    finished run's stored rollouts hold."""
    from conspo.generation.rollout import decode_responses, encode_prompts, end_token_ids, sample

    config = run_config(args, {"from_run": 1})
    task = make_task(config.task)
    cpu = torch.device("cpu")
    model, tokenizer = load_pretrained(store.resolve(MODEL), cpu, torch.float32)
    model.eval()
    render = PromptRenderer(config.prompt, tokenizer)
    examples = distinct_prompts(task, random.Random(args.seed), args.prompts)
    generator = torch.Generator().manual_seed(args.seed)
    rollouts: list[tuple[str, str, float]] = []
    per_batch = max(1, 256 // args.k)
    for i in range(0, len(examples), per_batch):
        chunk = examples[i : i + per_batch]
        ids, mask = encode_prompts(tokenizer, [render(ex.prompt) for ex in chunk], cpu)
        ids, mask = ids.repeat_interleave(args.k, 0), mask.repeat_interleave(args.k, 0)
        with torch.no_grad():
            batch = sample(
                model,
                ids,
                mask,
                max_new_tokens=6,
                eos_id=end_token_ids(tokenizer, model),
                pad_id=tokenizer.pad_token_id,
                temperature=args.temperature,
                generator=generator,
                group_size=args.k,
            )
        for j, text in enumerate(decode_responses(tokenizer, batch)):
            ex = chunk[j // args.k]
            rollouts.append((render(ex.prompt), text, task.verify(text, ex)))
    return rollouts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0, help="of the sampled answers")
    ap.add_argument("--per-prompt", type=int, default=4, help="examples per problem and side")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-size", type=int, default=256, help="held-out problems (n)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--desirable-weight", type=float, default=3.5)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/kto-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    store = builtin_store()

    t0 = time.perf_counter()
    rollouts = sample_rollouts(args, store)
    right = sum(is_positive(r) for _, _, r in rollouts)
    kind_params = {
        "from_run": 1,
        "max_per_prompt": args.per_prompt,
        "batch_size": args.batch_size,
        "beta": args.beta,
        "desirable_weight": args.desirable_weight,
    }
    config = run_config(args, kind_params)
    workdir = args.out / f"run-{args.seed}"
    shutil.rmtree(workdir, ignore_errors=True)  # a finished run's checkpoint would be resumed
    workdir.mkdir(parents=True)
    prepare_inputs(config, workdir, lambda run: rollouts)  # as the worker does, from stored ones
    written = (workdir / EXAMPLES_FILE).read_text().splitlines()
    desirable = sum(json.loads(line)["desirable"] for line in written)
    counts = {"desirable": desirable, "undesirable": len(written) - desirable}
    print(
        f"sampled {len(rollouts)} answers to {args.prompts} training problems"
        f" ({time.perf_counter() - t0:.0f} s): {right} right ({right / len(rollouts):.3f});"
        f" examples: {counts['desirable']} desirable, {counts['undesirable']} undesirable"
        f" (n_D/n_U = {counts['desirable'] / max(counts['undesirable'], 1):.2f})"
    )

    print(
        f"training: {args.steps} steps × {args.batch_size} completions, β {args.beta},"
        f" λ_D {args.desirable_weight}, λ_U 1, lr {args.lr}, seed {args.seed}"
    )
    sink = MemorySink()
    t0 = time.perf_counter()
    result = train_job(config, sink, workdir=workdir, model_store=store)
    print(f"run: {result.status} at step {result.last_step} in {time.perf_counter() - t0:.0f} s")
    for step in sorted(sink.steps):
        m = sink.steps[step].metrics
        line = f"  step {step:4d}"
        if M.KTO_KL in m:
            line += (
                f"  loss {m[M.LOSS]:.4f}  z0 {m[M.KTO_KL]:.3f}"
                f"  β·r desirable {m[M.KTO_REWARD_DESIRABLE]:+.3f}"
                f"  undesirable {m[M.KTO_REWARD_UNDESIRABLE]:+.3f}"
                f"  side acc {m[M.KTO_ACCURACY]:.2f}  λn ratio {m[M.KTO_WEIGHT_RATIO]:.2f}"
            )
        if M.EVAL_ACCURACY in m:
            n = int(m[M.EVAL_PROBLEMS])
            acc = m[M.EVAL_ACCURACY]
            low, high = wilson(acc * n, n)
            line += f"  held-out accuracy {acc:.3f} (n = {n}, 95% CI {low:.3f}-{high:.3f})"
        if M.KTO_KL in m and step % args.eval_every and step != args.steps:
            continue
        print(line)
    first, last = sink.steps[0].metrics, sink.steps[args.steps].metrics
    n = int(first[M.EVAL_PROBLEMS])
    moved = last[M.EVAL_ACCURACY] - first[M.EVAL_ACCURACY]
    print(
        f"held-out greedy accuracy: {first[M.EVAL_ACCURACY]:.3f} at step 0 ->"
        f" {last[M.EVAL_ACCURACY]:.3f} at step {args.steps} ({moved * 100:+.1f} points, n = {n})"
    )


if __name__ == "__main__":
    main()
