"""ConSPO vs GRPO (and DisCO) on a real pretrained model, SmolLM2-135M-Instruct, on one GPU.

    PYTHONPATH=. .venv/bin/python bench/gpu_real_model.py            # the GPU study (~10 min)
    PYTHONPATH=. .venv/bin/python bench/gpu_real_model.py --smoke    # a tiny CPU version (5 min)
        [--seeds 0 1 2 3 4] [--steps N] [--jobs N] [--arms grpo,conspo,disco]
        [--out gpu_real_model.json]

The study of examples/studies/smollm2_gsm.yaml, run the way a GPU allows: full fine-tuning in
bfloat16 (no LoRA), 5 seeds per arm, every arm evaluated greedily on the same held-out problems
at step 0 and at the end, ``--jobs`` runs at a time on the one GPU (a 135M model leaves it
mostly idle, so runs overlap well). Runs are bench/regime_study.py's: each in a subprocess of its
own, seeded so that the runs of one seed draw the same prompts whatever the algorithm (paired
by seed), and appended to ``--out`` as they finish (an interrupted study resumes).

Printed: per arm the final held-out accuracy, then the verdict lines of the platform's study
statistics (backend/studies/stats.py, the same as a study page): each arm minus GRPO, paired by
seed, with its 95% interval, seeds won and p.

``--smoke`` checks the script end to end on a CPU: full fine-tuning too, but float32, 2 seeds,
2 steps of 2 prompts × 2 rollouts × 16 tokens, 8 held-out problems; its verdict means nothing.
It took 302 s on a shared 2-core box (6 runs of 20-70 s each).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from regime_study import run_config, spawn  # noqa: E402  # bench/ is not a package

STUDY = ROOT / "examples" / "studies" / "smollm2_gsm.yaml"
ARMS = ["grpo", "conspo", "disco"]
BASELINE = "grpo"

# What the GPU changes in the study's base config: full fine-tuning in bfloat16 on CUDA, the
# shape of the issue (8 prompts × 8 rollouts × 128 new tokens), 200 held-out problems.
GPU: dict[str, Any] = {
    "model": {"device": "cuda", "dtype": "bfloat16", "lora": {"rank": 0}},
    "sampling": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 128},
    "optim": {"lr": 5.0e-6},
    "steps": 40,
    "eval_size": 200,
}
SMOKE: dict[str, Any] = {
    "model": {"device": "cpu", "dtype": "float32", "lora": {"rank": 0}},
    "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16},
    "steps": 2,
    "eval_size": 8,
}


def base_config(smoke: bool, steps: int | None) -> dict[str, Any]:
    """The study's base config with the GPU's (or the smoke test's) changes."""
    base = yaml.safe_load(STUDY.read_text())["config"]
    change = SMOKE if smoke else GPU
    base["model"] = {**base["model"], **change["model"]}
    base["optim"] = {**base.get("optim", {}), **change.get("optim", {})}
    base["sampling"] = {**base["sampling"], **change.get("sampling", {})}
    base["task"] = {**base["task"], "eval_size": change["eval_size"]}
    base["eval"] = {**base.get("eval", {}), "pass_k": 1}
    base["steps"] = steps or change["steps"]
    base.setdefault("algorithm", BASELINE)
    return base


def materialise_model() -> None:
    """Build smollm2-135m-instruct into the model store once, before the runs start."""
    from conspo.models.builtins import builtin_store

    started = time.perf_counter()
    path = builtin_store().resolve("smollm2-135m-instruct")
    print(f"model store: {path} ({time.perf_counter() - started:.0f} s)", flush=True)


def verdict(results: list[dict[str, Any]]) -> list[str]:
    """The platform's verdict lines (backend/studies/stats.py), accuracy in points."""
    from backend.studies.stats import summarise

    arms: dict[str, dict[int, float]] = {}
    for r in results:
        arms.setdefault(r["arm"], {})[r["seed"]] = r["final_accuracy"]
    return summarise(arms, baseline=BASELINE, scale=100, unit="points").verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny CPU run of the script")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--jobs", type=int, help="runs at a time (default: 5 on a GPU, 1 smoke)")
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated, {BASELINE} among them (the baseline)",
    )
    parser.add_argument("--out", default="gpu_real_model.json")
    args = parser.parse_args()
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            sys.exit("no CUDA device here: run with --smoke for the CPU check")
    arms = args.arms.split(",")
    if BASELINE not in arms or not set(arms) <= set(ARMS):
        sys.exit(f"--arms: pick from {', '.join(ARMS)}, {BASELINE} (the baseline) among them")
    seeds = args.seeds or ([0, 1] if args.smoke else [0, 1, 2, 3, 4])
    jobs = args.jobs or (1 if args.smoke else 5)
    base = base_config(args.smoke, args.steps)
    materialise_model()
    out = Path(args.out)
    study = json.loads(out.read_text()) if out.exists() else {"base": base, "runs": []}
    if study["base"] != base:
        sys.exit(f"{out} holds a study of another config; pick another --out")
    done = {(r["arm"], r["seed"]) for r in study["runs"]}
    todo = [(a, s) for s in seeds for a in arms if (a, s) not in done]
    print(f"{len(todo)} runs, {base['steps']} steps each, {jobs} at a time", flush=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(spawn, a, s, run_config(base, a, s, None)) for a, s in todo]
        for future in futures:
            result = future.result()
            study["runs"].append(result)
            out.write_text(json.dumps(study, indent=1))
            print(
                f"{result['arm']:<8} seed {result['seed']}: held-out accuracy"
                f" {result['start_accuracy']:.3f} -> {result['final_accuracy']:.3f}"
                f" ({result['wall_s']:.0f} s)",
                flush=True,
            )
    print(f"study: {time.perf_counter() - started:.0f} s wall")
    label = "SMOKE TEST (CPU, 2 steps: not a result)" if args.smoke else "GPU study"
    print(f"verdict, {label}, final greedy held-out accuracy vs {BASELINE}:")
    for line in verdict(study["runs"]):
        print(f"  {line}")


if __name__ == "__main__":
    main()
