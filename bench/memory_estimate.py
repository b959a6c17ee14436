"""The memory estimate against the measured peak, per job kind: SFT, DPO, GRPO with and without a
tool, LoRA and full fine-tuning.

    PYTHONPATH=. .venv/bin/python bench/memory_estimate.py [--store DIR] [--only sft "grpo/full"]
        [--threads 2]

Each run is SmolLM2-135M-Instruct (the built-in, float32, LoRA r16 unless "full") on this
machine's CPU for one step and the final evaluation, in a fresh process (``python -m conspo
train``). The measured peak is the run's ``system/peak_rss_gib`` (the process's resident
high-water mark from the end of setup on: ``conspo.system``), sampled every 0.5 s; the estimate
is ``conspo.models.resources.estimate_memory`` of the same config as the worker computes it (the
task built, an sft step's rows measured on it; the CLI sets no memory limit). Printed per run:
the estimate, its parts, the measured peak and peak / estimate; held within 1.5x either way.

Measured on the development machine (2 shared cores, loaded by other work; GiB; shapes as in
RUNS below; the estimates of this version; the peaks of runs of this bench before or after
the estimate's change, which altered neither the training nor its planned split; "form": the
SmolLM2 catalogue entry's recommended settings, a reasoning_gym gcd task
with 128-token answers, where the issue's walk found the estimate 2.1-2.4x under):

    kind       shape      estimate  peak RSS  ratio   before: estimate (ratio)
    sft        small        1.92      1.65     0.86   1.63 (1.01)
    sft        large        8.41      7.51*    0.89   9.05 (0.83)
    dpo        small        2.50      2.29     0.92   2.08 (1.10)
    dpo        large       13.08     11.45*    0.88   12.66 (0.90)
    grpo+tool  small        1.99      1.82     0.91   1.57 (1.16)
    grpo+tool  large        2.09      2.11     1.01   1.67 (1.26)
    sft        form b8      3.16      2.67     0.85   3.96 (0.68); at its default 16 tokens 1.09
    sft        form b32     9.68      7.69     0.79   14.13 (0.54)
    sft        full b8      3.84      3.18     0.83   4.21 (0.75)
    grpo       form         1.99      2.05     1.03   1.57 (1.30)
    grpo       form 4x4     1.99      1.92     0.96   1.57 (1.22)
    grpo       full         3.42      3.64     1.06   3.00 (1.21)

    * peaks measured for the previous version of this table (commit 8f48c41), not run again
      here (their 7.5 and 11.5 GiB did not fit beside the other work on the machine). Peaks
      vary between runs: sft small gave 1.88 then, 1.65 now; dpo small 1.94, 2.29; grpo+tool
      1.79 and 2.17, now 1.82 and 2.11.

Before, the process (430 MiB: the interpreter, torch, transformers, the tokenizer) was left out,
which put every small run under its peak, and an SFT row was sized by sampling.max_new_tokens:
the form's 128 tokens over-counted gcd's 76-token rows (0.54x at batch 32), the default 16
under-counted them (1.09 GiB estimated at batch 8; the walk saw 1.3 against 3.15). The API,
which builds no task, assumes a 48-token question (``DEFAULT_QUESTION_TOKENS``): the form
shapes' estimates there are 3.35, 10.42 and 3.96, but arith's 4-character questions are
over-counted, 3.35 and 19.84 for sft small and large (0.49x and 0.38x of the peak).

The GGUF build of the built-in (dequantising the package's Q4_1 file, once per model store)
peaked at 1.16 GiB in a process of its own: under every SmolLM2 run's estimate, so not a term.

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
from conspo.tasks import make_task  # noqa: E402

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
# DPO rows (a prompt and its answers, read from a file) are sized by sampling.max_new_tokens in
# the estimate (conspo.models.resources._supervised_estimate): set near the rows' length, as a
# config should; an SFT step's rows are measured on the task. An arith prompt under SmolLM2's
# chat template is 34 tokens; its SFT target 2-4 more, a DPO answer ("12 + 34 = 46.") about 10.
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
# The form's SmolLM2 shapes (its catalogue entry's recommended settings: a reasoning_gym task,
# 128-token answers, 8 x 8 rollouts in 4 mini-batches), where the walk found the estimate
# 2.1-2.4x under the peak: SFT rows sized by the config's default max_new_tokens, the
# process left out. The rows' real length comes from the task here (``row_tokens``), not from
# a max_new_tokens set to match it.
GCD = {
    "name": "reasoning_gym",
    "params": {
        "dataset": "gcd",
        "config": {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 60},
        "answer_format": "last_number",
    },
    "eval_size": 16,
}
FORM = {
    "task": GCD,
    "sampling": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 128},
    "optim": {"lr": 1.0e-4, "mini_batches": 4},
}
FULL = {**MODEL, "lora": {"rank": 0}}
RUNS |= {
    ("sft", "form b8"): {**FORM, "kind": "sft", "kind_params": {"batch_size": 8}},
    ("sft", "form b32"): {**FORM, "kind": "sft", "kind_params": {"batch_size": 32}},
    ("sft", "full b8"): {**FORM, "kind": "sft", "kind_params": {"batch_size": 8}, "model": FULL},
    ("grpo", "form"): {**FORM, "algorithm": "grpo"},
    ("grpo", "form 4x4"): {
        **FORM,
        "algorithm": "grpo",
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 128},
    },
    ("grpo", "full"): {**FORM, "algorithm": "grpo", "model": FULL},
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
        print(f"{'kind':<10} {'shape':<9} {'estimate':>9} {'peak RSS':>9} {'ratio':>6}  parts")
        for (kind, shape), _ in RUNS.items():
            if args.only and kind not in args.only and f"{kind}/{shape}" not in args.only:
                continue
            config = config_of(kind, shape, pairs)
            cfg = RunConfig.model_validate(config)
            # as the worker computes it: the task built, an sft step's rows measured on it
            estimate = estimate_memory(cfg, dims, 4, None, make_task(cfg.task))
            workdir = Path(tmp) / f"{kind}-{shape}"
            workdir.mkdir()
            peak = measured_peak(config, workdir, store, args.threads)
            ratio = peak / estimate.total
            ok = 1 / WITHIN <= ratio <= WITHIN
            failed += not ok
            print(
                f"{kind:<10} {shape:<9} {estimate.total / GIB:>7.2f} G {peak / GIB:>7.2f} G"
                f" {ratio:>6.2f}{'' if ok else ' !'} {estimate.describe()}",
                flush=True,
            )
    print(f"{failed} of the runs outside {WITHIN}x" if failed else f"all within {WITHIN}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
