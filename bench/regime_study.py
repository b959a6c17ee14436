"""Held-out accuracy of each algorithm in the scaled-down paper regime, paired by seed (issue 12).

    PYTHONPATH=. .venv/bin/python bench/regime_study.py [--config examples/paper_tiny.yaml]
        [--algorithms grpo conspo conspo-linear dapo rloo gspo cispo disco] [--seeds 0 1 2 3 4]
        [--steps N] [--jobs 1] [--out regime_study.json]

Every (algorithm, seed) run trains the config's model and task in a subprocess of its own with
one torch thread (``--jobs`` of them at a time). Runs of one seed draw the same prompts and the
same sampling noise at every step whatever the algorithm (the trainer seeds both from
(seed, step) alone) and start from the same weights, so the differences to GRPO are paired.

Printed per algorithm: final greedy held-out accuracy, mean ± 95% CI over seeds (Student t); the
paired difference to GRPO by seed (mean, t, two-sided p, wins/ties/losses); wall and CPU seconds
per run. Each finished run is appended to ``--out`` at once, and runs already there are not run
again, so an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# An arm is an algorithm and the params that replace the config's. The config's own params are
# ConSPO's, so every other algorithm starts from its defaults.
ARMS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "grpo": ("grpo", {}),
    "conspo": ("conspo", None),  # None: the config's params as they are
    "conspo-linear": ("conspo", {"contrast": "linear"}),  # merged over the config's params
    # DAPO's default buffer (8) is refused at max_new_tokens 6; 2 keeps DAPO's 1:5 buffer:length
    # ratio roughly (4k of 20k) and leaves the 1-3 token answers of tiny-arith unpenalised.
    "dapo": ("dapo", {"overlong_buffer": 2}),
    "dr_grpo": ("dr_grpo", {}),
    "rloo": ("rloo", {}),
    "reinforce_pp": ("reinforce_pp", {}),
    "gspo": ("gspo", {}),
    "cispo": ("cispo", {}),
    "gmpo": ("gmpo", {}),
    "sapo": ("sapo", {}),
    "disco": ("disco", {}),
    "mcpo": ("mcpo", {}),
}
DEFAULT_ARMS = ["grpo", "conspo", "conspo-linear", "dapo", "rloo", "gspo", "cispo", "disco"]
BASELINE = "grpo"


def run_config(base: dict[str, Any], arm: str, seed: int, steps: int | None) -> dict[str, Any]:
    """The config of one run: ``base`` with the arm's algorithm and params, the seed, and no
    evaluation but the start's and the last step's (eval.every 0) nor checkpoints but the last."""
    algorithm, params = ARMS[arm]
    cfg = {**base, "algorithm": algorithm, "seed": seed, "name": f"{arm}-s{seed}"}
    if params is not None:
        own = base.get("params", {}) if algorithm == base["algorithm"] else {}
        cfg["params"] = {**own, **params}
    if steps is not None:
        cfg["steps"] = steps
    cfg["eval"] = {**base.get("eval", {}), "every": 0, "at_start": True}
    cfg["checkpoint"] = {"every": 0, "keep": 1}
    cfg["logging"] = {**base.get("logging", {}), "rollout_sample": 0}
    return cfg


def train_one(cfg: dict[str, Any]) -> dict[str, Any]:
    """Child process: train ``cfg`` with one thread; the start and final held-out accuracy."""
    import torch

    from conspo import metrics as M
    from conspo.config import RunConfig
    from conspo.models.builtins import builtin_store
    from conspo.sink import MemorySink
    from conspo.training.trainer import train

    torch.set_num_threads(1)
    config = RunConfig.model_validate(cfg)
    sink = MemorySink()
    wall, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as workdir:
        train(config, sink, workdir=workdir, model_store=builtin_store())
    last = sink.steps[config.steps].metrics
    clip = [s.metrics.get(M.CLIP_FRAC) for s in sink.steps.values() if M.CLIP_FRAC in s.metrics]
    return {
        "start_accuracy": sink.steps[0].metrics[M.EVAL_ACCURACY],
        "final_accuracy": last[M.EVAL_ACCURACY],
        "final_pass_at_k": last[M.EVAL_PASS_AT_K],
        "mean_clip_frac": statistics.fmean(clip) if clip else None,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
    }


def spawn(arm: str, seed: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run ``cfg`` in a child with one intra-op thread; its result line, tagged with the run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(cfg)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed:\n{proc.stderr[-3000:]}")
    return {"arm": arm, "seed": seed, **json.loads(proc.stdout.strip().splitlines()[-1])}


# --------------------------------------------------------------------------------------------
# Statistics: Student t without scipy (the venv has none)
# --------------------------------------------------------------------------------------------


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with integer ``df``: the closed-form series of Abramowitz &
    Stegun 26.7.3-4, exact for integer df (the same numbers scipy.stats.t.sf gives)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: A = 2/π (θ + sinθ cosθ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + …))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    else:  # even: A = sinθ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + …)
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    return max(0.0, 1.0 - inside)


def t_critical(df: int, p: float = 0.05) -> float:
    """The t with two-sided tail ``p`` (2.776 for df 4 at 0.05), by bisection on the series."""
    low, high = 0.0, 1000.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided_p(mid, df) > p else (low, mid)
    return (low + high) / 2


def mean_ci(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% Student-t interval); half-width NaN for one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, t_critical(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def paired(arm: list[float], base: list[float]) -> dict[str, float]:
    """Paired t over seeds of arm − base: mean d, its 95% half-width, t, p, wins/ties/losses."""
    d = [a - b for a, b in zip(arm, base, strict=True)]
    mean, half = mean_ci(d)
    sd = statistics.stdev(d)
    # Identical differences on every seed leave no spread to test against.
    t = mean / (sd / math.sqrt(len(d))) if sd > 0 else float("nan")
    p = t_two_sided_p(t, len(d) - 1) if sd > 0 else float("nan")
    wins = sum(x > 0 for x in d)
    losses = sum(x < 0 for x in d)
    return {"d": mean, "d_ci": half, "t": t, "p": p, "wins": wins, "ties": len(d) - wins - losses,
            "losses": losses}  # fmt: skip


def summarise(results: list[dict[str, Any]], arms: list[str]) -> list[dict[str, Any]]:
    """One row per arm: accuracy over its seeds, the paired difference to GRPO, cost per run."""
    by = {(r["arm"], r["seed"]): r for r in results}
    rows = []
    for arm in arms:
        seeds = sorted(s for a, s in by if a == arm)
        if not seeds:
            continue
        acc = [by[arm, s]["final_accuracy"] for s in seeds]
        mean, half = mean_ci(acc)
        row: dict[str, Any] = {
            "arm": arm, "n": len(seeds), "accuracy": mean, "accuracy_ci": half,
            "start_accuracy": statistics.fmean(by[arm, s]["start_accuracy"] for s in seeds),
            "wall_s": statistics.fmean(by[arm, s]["wall_s"] for s in seeds),
            "cpu_s": statistics.fmean(by[arm, s]["cpu_s"] for s in seeds),
        }  # fmt: skip
        clip = [by[arm, s]["mean_clip_frac"] for s in seeds]
        row["clip_frac"] = None if None in clip else statistics.fmean(clip)
        both = [s for s in seeds if (BASELINE, s) in by]
        if arm != BASELINE and len(both) > 1:
            base = [by[BASELINE, s]["final_accuracy"] for s in both]
            mine = [by[arm, s]["final_accuracy"] for s in both]
            row["vs_grpo"] = {"n": len(both), **paired(mine, base)}
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """clip: the objective's clip fraction (``grpo/clip_frac``: tokens for the GRPO family,
    for GSPO the tokens of clipped sequences) averaged over steps and seeds; "-": none logged."""
    print(f"start accuracy (step 0, every run): {rows[0]['start_accuracy']:.4f}")
    print(f"{'arm':<14}{'n':>3}  {'accuracy ± 95% CI':<19}{'Δ vs grpo ± CI':<18}"
          f"{'t':>7}{'p':>8}  {'W/T/L':<8}{'clip':>7}{'wall s':>8}{'cpu s':>8}")  # fmt: skip
    for r in rows:
        vs = r.get("vs_grpo")
        diff = (
            f"{vs['d']:+.4f} ± {vs['d_ci']:.4f}  {vs['t']:>7.2f}{vs['p']:>8.3f}  "
            f"{vs['wins']}/{vs['ties']}/{vs['losses']:<4}"
            if vs
            else f"{'':<18}{'':>7}{'':>8}  {'':<8}"
        )
        clip = "-" if r["clip_frac"] is None else f"{r['clip_frac']:.3f}"
        print(f"{r['arm']:<14}{r['n']:>3}  {r['accuracy']:.4f} ± {r['accuracy_ci']:.4f}   {diff}"
              f"{clip:>7}{r['wall_s']:>8.0f}{r['cpu_s']:>8.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "paper_tiny.yaml"))
    parser.add_argument("--algorithms", nargs="+", default=DEFAULT_ARMS, choices=sorted(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, help="default: the config's steps")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", default="regime_study.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: one config as JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(train_one(json.loads(args.one))))
        return
    base = yaml.safe_load(Path(args.config).read_text())
    out = Path(args.out)
    study = json.loads(out.read_text()) if out.exists() else {"runs": []}
    steps = args.steps or base["steps"]
    if study.get("steps", steps) != steps or study.get("config", args.config) != args.config:
        sys.exit(f"{out} holds a study of another config or step count; pick another --out")
    study.update(config=args.config, steps=steps)
    done = {(r["arm"], r["seed"]) for r in study["runs"]}
    # Seed-major, so that with --jobs 1 an interrupted study still has whole pairs.
    todo = [(a, s) for s in args.seeds for a in args.algorithms if (a, s) not in done]
    print(f"{len(todo)} runs to do ({len(done)} already in {out}), {steps} steps each", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(spawn, a, s, run_config(base, a, s, steps)) for a, s in todo]
        for future in futures:
            result = future.result()
            study["runs"].append(result)
            out.write_text(json.dumps(study, indent=1))
            print(
                f"{result['arm']:<14} seed {result['seed']}: {result['start_accuracy']:.4f} ->"
                f" {result['final_accuracy']:.4f} ({result['wall_s']:.0f} s)",
                flush=True,
            )
    study["summary"] = summarise(study["runs"], args.algorithms)
    out.write_text(json.dumps(study, indent=1))
    print_table(study["summary"])


if __name__ == "__main__":
    main()
