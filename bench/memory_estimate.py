"""The memory estimate against the measured peak, per job kind: SFT, DPO and a GRPO run with a tool.

    PYTHONPATH=. .venv/bin/python bench/memory_estimate.py [--store DIR] [--only sft dpo ...]
        [--threads 2]

Each run is SmolLM2-135M-Instruct (the built-in, float32, LoRA as the examples train it) on this
machine's CPU for one step and the final evaluation, in a fresh process (``python -m conspo
train``), at two shapes per kind. The measured peak is the run's ``system/peak_rss_gib`` (the
process's resident high-water mark from the end of setup on: ``conspo.system``), sampled every
0.5 s; the estimate is ``conspo.models.resources.estimate_memory`` of the same config, as the
worker computes it (the CLI sets no memory limit). Printed per run: the estimate, its parts, the
measured peak and their ratio; the estimate is held to within 1.5x of the peak either way.

Measured on the development machine (2 shared cores; GiB; shapes as in RUNS below):

    kind       shape   estimate  peak RSS  ratio   before (issue 49)
    sft        small     1.63      1.88     1.15   1.57 (1.20)
    sft        large     9.05      7.51     0.83   1.57 (4.73)
    dpo        small     2.08      1.94     0.93   1.57 (1.47)
    dpo        large    12.66     11.45     0.90   1.57 (7.21)
    grpo+tool  small     1.57      1.79     1.13   unchanged
    grpo+tool  large     1.67      2.17     1.30   unchanged

Before, SFT and DPO were estimated as RL steps of the sampling defaults (chunked logits, a
split gradient pass): the same 1.6 GiB whatever their batch.

The DPO runs train on pairs the bench writes (arith problems: the right sum as the chosen answer,
a wrong one as the rejected). The tool runs use the calculator (no sandbox needed; the estimate's
tool term is the same for every tool).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conspo import metrics as M  # noqa: E402
from conspo.access import ModelSources  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.models.resources import estimate_memory, source_dims  # noqa: E402

GIB = 2**30
MODEL = {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 16, "alpha": 32}}
BASE: dict[str, Any] = {
    "steps": 1,
    "model": MODEL,
    "task": {"name": "arith"},
    "prompt": {"chat_template": "on"},
    "eval": {"every": 0, "at_start": False, "pass_k": 1},
    "checkpoint": {"every": 0},
    "logging": {"system_interval_s": 0.5},
}
# SFT and DPO rows (a prompt and its target) are sized by sampling.max_new_tokens in the estimate
# (conspo.models.resources._supervised_estimate): set near the rows' length, as a config should.
# An arith prompt under SmolLM2's chat template is 34 tokens; its SFT target 2-4 more, a DPO
# answer ("12 + 34 = 46.") about 10.
SFT_ROW_TOKENS = 40
DPO_ROW_TOKENS = 48
# (kind, shape): what the config adds to BASE. Two shapes per kind, the second several times
# the first's batch and evaluation (and for GRPO its answer length).
RUNS: dict[tuple[str, str], dict[str, Any]] = {
    ("sft", "small"): {
        "kind": "sft",
        "kind_params": {"batch_size": 8},
        "sampling": {"max_new_tokens": SFT_ROW_TOKENS},
        "task": {"name": "arith", "eval_size": 16},
    },
    ("sft", "large"): {
        "kind": "sft",
        "kind_params": {"batch_size": 64},
        "sampling": {"max_new_tokens": SFT_ROW_TOKENS},
        "task": {"name": "arith", "eval_size": 64},
    },
    ("dpo", "small"): {
        "kind": "dpo",
        "kind_params": {"batch_size": 4},
        "sampling": {"max_new_tokens": DPO_ROW_TOKENS},
        "task": {"name": "arith", "eval_size": 16},
    },
    ("dpo", "large"): {
        "kind": "dpo",
        "kind_params": {"batch_size": 32},
        "sampling": {"max_new_tokens": DPO_ROW_TOKENS},
        "task": {"name": "arith", "eval_size": 64},
    },
    ("grpo+tool", "small"): {
        "algorithm": "grpo",
        "tools": {"names": ["calculator"], "max_turns": 2},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 64},
        "task": {"name": "arith", "eval_size": 16},
    },
    ("grpo+tool", "large"): {
        "algorithm": "grpo",
        "tools": {"names": ["calculator"], "max_turns": 2},
        "sampling": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 128},
        "task": {"name": "arith", "eval_size": 64},
    },
}
WITHIN = 1.5  # the factor the estimate is held to, either way


def write_pairs(path: Path, n: int = 256) -> None:
    """DPO pairs of sums: the right answer chosen, one off rejected."""
    with path.open("w") as f:
        for i in range(n):
            a, b = 10 + i % 89, 3 + (7 * i) % 97
            row = {"prompt": f"What is {a} + {b}?", "chosen": f"{a} + {b} = {a + b}.",
                   "rejected": f"{a} + {b} = {a + b + 1}."}  # fmt: skip
            f.write(json.dumps(row) + "\n")


def config_of(kind: str, shape: str, pairs: Path) -> dict[str, Any]:
    extra = RUNS[(kind, shape)]
    cfg = {**BASE, **extra}
    if cfg.get("kind") == "dpo":
        cfg["kind_params"] = {**cfg["kind_params"], "path": str(pairs)}
    return cfg


def measured_peak(config: dict[str, Any], workdir: Path, store: Path, threads: int) -> float:
    """The run's highest ``system/peak_rss_gib``, in bytes (a fresh process)."""
    path = workdir / "run.json"
    path.write_text(json.dumps(config))
    quiet = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), **quiet}
    out = workdir / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "conspo", "train", str(path), "--out", str(out),
         "--model-store", str(store)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    peaks = [row[M.SYS_PEAK_RSS_GIB] for row in rows if M.SYS_PEAK_RSS_GIB in row]
    if not peaks:
        raise RuntimeError(f"no {M.SYS_PEAK_RSS_GIB} logged: {rows}")
    return max(peaks) * GIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default=None, help="model store (default: a temporary one)")
    parser.add_argument("--only", nargs="*", default=None, help="kinds to run (sft dpo grpo+tool)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    dims = source_dims(ModelSources().locate(MODEL["name"]))
    assert dims is not None
    failed = 0
    with tempfile.TemporaryDirectory(prefix="conspo-memory-") as tmp:
        store = Path(args.store) if args.store else Path(tmp) / "store"
        pairs = Path(tmp) / "pairs.jsonl"
        write_pairs(pairs)
        print(f"{'kind':<10} {'shape':<6} {'estimate':>9} {'peak RSS':>9} {'ratio':>6}  parts")
        for (kind, shape), _ in RUNS.items():
            if args.only and kind not in args.only:
                continue
            config = config_of(kind, shape, pairs)
            estimate = estimate_memory(RunConfig.model_validate(config), dims, 4)
            workdir = Path(tmp) / f"{kind}-{shape}"
            workdir.mkdir()
            peak = measured_peak(config, workdir, store, args.threads)
            ratio = peak / estimate.total
            ok = 1 / WITHIN <= ratio <= WITHIN
            failed += not ok
            print(
                f"{kind:<10} {shape:<6} {estimate.total / GIB:>7.2f} G {peak / GIB:>7.2f} G"
                f" {ratio:>6.2f}{'' if ok else ' !'} {estimate.describe()}",
                flush=True,
            )
    print(f"{failed} of the runs outside {WITHIN}x" if failed else f"all within {WITHIN}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
