"""GRPO trained on a reward model, drawn beside the verifier's truth: does the proxy part ways
with the truth as training goes on (Goodhart), and does InstructGPT's KL in the reward hold it?

    PYTHONPATH=. .venv/bin/python bench/proxy_vs_truth.py --rm-run /tmp/rm-bench/run \
        [--steps 12] [--kl 0 0.05] [--prompts 4] [--group 4] [--threads 2]
    PYTHONPATH=. .venv/bin/python bench/proxy_vs_truth.py --proxy judge [--judgements 2] ...

The proxy is a reward model or a judge (``--proxy judge``: SmolLM2 itself grading each answer
with the judge reward's default rubric, ``--judgements`` per answer). The reward model: the
last checkpoint of bench/reward_model.py's run (``--rm-run``, its
workdir), exported as a plain ``AutoModelForSequenceClassification`` directory (LoRA merged).
The policy: SmolLM2-135M-Instruct + LoRA r16 on the same task (reasoning-gym chain_sum, 1-digit
a ± b), GRPO, trained on the proxy alone: rewards [verifier at weight 0 (scored and logged: the
truth), reward_model at weight 1 (the proxy)], ``truth: verifier``. One run per ``--kl`` β
(``params.kl_in_reward``), the same seed and prompts. Printed per step: the proxy and the truth
on the step's rollouts, their gap, the pair agreement within groups and Spearman's ρ, the
sequence KL in the reward; and at each evaluation (``--eval-every``) the held-out greedy
accuracy and the proxy-vs-truth figures on the held-out samples. Everything is on this CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.reward_model import MODEL, TASK  # noqa: E402
from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.models.export import export_merged  # noqa: E402
from conspo.sink import MemorySink  # noqa: E402
from conspo.training.checkpoint import latest_checkpoint  # noqa: E402
from conspo.training.trainer import train  # noqa: E402

STEP_KEYS = (
    ("proxy", M.PROXY_REWARD),
    ("truth", M.PROXY_TRUTH),
    ("gap", M.PROXY_GAP),
    ("agree", M.PROXY_AGREEMENT),
    ("rho", M.PROXY_SPEARMAN),
    ("kl_seq", M.KL_IN_REWARD),
)
EVAL_KEYS = (
    ("acc", M.EVAL_ACCURACY),
    ("proxy", M.EVAL_PROXY_REWARD),
    ("truth", M.EVAL_PROXY_TRUTH),
    ("agree", M.EVAL_PROXY_AGREEMENT),
    ("rho", M.EVAL_PROXY_SPEARMAN),
)


def exported_rm(run_dir: Path, out: Path) -> Path:
    if (out / "config.json").is_file():
        return out
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise SystemExit(f"no checkpoint under {run_dir}: run bench/reward_model.py first")
    return export_merged(latest[1], None, out)


def proxy_reward(args: argparse.Namespace, rm: Path | None) -> dict[str, object]:
    if args.proxy == "judge":  # SmolLM2 itself grading, k judgements per answer
        judge = {"model": MODEL, "samples": args.judgements, "max_new_tokens": 48,
                 "temperature": 0.7, "timeout_s": 1800}  # fmt: skip
        return {"name": "judge", "weight": 1, "params": judge}
    return {"name": "reward_model", "weight": 1, "params": {"model": str(rm)}}


def config(args: argparse.Namespace, rm: Path | None, kl: float) -> RunConfig:
    return RunConfig.model_validate({
        "name": f"GRPO on a {args.proxy}, kl_in_reward {kl}",
        "algorithm": "grpo",
        "params": {"kl_in_reward": kl},
        "steps": args.steps,
        "seed": args.seed,
        "model": {"name": MODEL, "dtype": "float32", "lora": {"rank": 16, "alpha": 32}},
        "task": {**TASK, "eval_size": args.eval_size},
        "prompt": {"chat_template": "on"},
        "sampling": {"prompts_per_step": args.prompts, "group_size": args.group,
                     "max_new_tokens": args.max_new_tokens, "temperature": 0.7},
        "optim": {"lr": args.lr},
        "rewards": [{"name": "verifier", "weight": 0}, proxy_reward(args, rm)],
        "truth": "verifier",
        "eval": {"every": args.eval_every, "at_start": True, "pass_k": args.pass_k},
        "checkpoint": {"every": 0},
    })  # fmt: skip


def fmt(value: float | None) -> str:
    return "   –  " if value is None or math.isnan(value) else f"{value:+.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy", choices=["reward_model", "judge"], default="reward_model")
    ap.add_argument("--rm-run", type=Path, help="bench/reward_model.py's run dir (--proxy rm)")
    ap.add_argument("--judgements", type=int, default=2, help="--proxy judge: k per answer")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kl", type=float, nargs="+", default=[0.0, 0.05])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-size", type=int, default=24)
    ap.add_argument("--pass-k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/proxy-vs-truth"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    store = builtin_store(args.out / "models")
    rm = None
    if args.proxy == "reward_model":
        if args.rm_run is None:
            ap.error("--proxy reward_model needs --rm-run")
        rm = exported_rm(args.rm_run, args.out / "rm")
        print(f"reward model: {rm}")
    for kl in args.kl:
        sink = MemorySink()
        t0 = time.perf_counter()
        workdir = args.out / f"{args.proxy}-kl{kl}"
        result = train(config(args, rm, kl), sink, workdir=workdir, model_store=store)
        wall = time.perf_counter() - t0
        print(f"\n== kl_in_reward {kl}: {result.status} in {wall:.0f} s")
        print("step  " + "  ".join(f"{name:>6}" for name, _ in STEP_KEYS))
        for step in sorted(sink.steps):
            got = sink.steps[step].metrics
            if step > 0:
                print(f"{step:4d}  " + "  ".join(f"{fmt(got.get(k)):>6}" for _, k in STEP_KEYS))
        print("held-out  step  " + "  ".join(f"{name:>6}" for name, _ in EVAL_KEYS))
        for step in sorted(sink.steps):
            got = sink.steps[step].metrics
            if M.EVAL_ACCURACY in got:
                cells = "  ".join(f"{fmt(got.get(k)):>6}" for _, k in EVAL_KEYS)
                print(f"          {step:4d}  {cells}")


if __name__ == "__main__":
    main()
