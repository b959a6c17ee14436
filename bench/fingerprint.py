"""Behaviour fingerprint: every logged metric (but times) and every sampled rollout of a fixed set
of small runs, written as JSON, so a refactor can show it changed nothing.

    python bench/fingerprint.py --out before.json      # on the old code
    python bench/fingerprint.py --out after.json --compare before.json

Each config trains a few steps of a tiny model on the CPU; together they pass through what a
renovation of the trainer moves: refill rounds, micro-batches, mini-batches and epochs, the
reference model (β > 0), LoRA, batched rewards (info_gain's continuation log-probs), every
non-RL job kind, and two local ranks (ddp and fsdp). Values are compared exactly (NaN equals
NaN); timing and throughput keys are dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from conspo.config import RunConfig
from conspo.jobs import train_job
from conspo.models.store import ModelStore

try:
    from conspo.launch.local import launch_local
    from conspo.models.builtins import builtin_store
except ImportError:  # the code before conspo.launch (a fingerprint of an older tree)
    from conspo.distributed.launch import launch_local  # type: ignore[no-redef]

    builtin_store = ModelStore  # type: ignore[assignment,misc]
from conspo.sink import MemorySink

BASE: dict[str, Any] = {
    "steps": 3,
    "seed": 7,
    "task": {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 16},
    "model": {"name": "tiny-arith"},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
    "eval": {"every": 2, "pass_k": 2},
    "checkpoint": {"every": 2},
    "logging": {"rollout_sample": 16},
}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merged(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    "grpo": ({"algorithm": "grpo"}, 1),
    "conspo": ({"algorithm": "conspo", "params": {"tau": 5}}, 1),
    "dapo_refill": ({"algorithm": "dapo"}, 1),
    "grpo_micro_mini_epochs": (
        {"algorithm": "grpo", "optim": {"micro_batch_tokens": 24, "mini_batches": 2, "epochs": 2}},
        1,
    ),
    "conspo_micro": ({"algorithm": "conspo", "optim": {"micro_batch_tokens": 24}}, 1),
    "grpo_beta": ({"algorithm": "grpo", "params": {"beta": 0.05}}, 1),
    "grpo_lora_beta": (
        {"algorithm": "grpo", "params": {"beta": 0.05}, "model": {"lora": {"rank": 4}}},
        1,
    ),
    "reinforce_pp": ({"algorithm": "reinforce_pp", "optim": {"mini_batches": 2}}, 1),
    "disco": ({"algorithm": "disco"}, 1),
    "ispo_info_gain": (
        {
            "algorithm": "grpo",
            "rewards": [
                {"name": "verifier"},
                {"name": "info_gain", "weight": 0.1},
                {"name": "format", "weight": 0.1},
                {"name": "length", "weight": 0.1, "params": {"buffer": 3}},
            ],
        },
        1,
    ),
    "sft": ({"kind": "sft", "kind_params": {"batch_size": 8}}, 1),
    "distill": ({"kind": "distill", "kind_params": {"teacher": "tiny-arith"}}, 1),
    "ddp2": ({"algorithm": "conspo", "optim": {"micro_batch_tokens": 24}}, 2),
    "fsdp2": (
        {"algorithm": "grpo", "resources": {"strategy": "fsdp"}, "optim": {"mini_batches": 2}},
        2,
    ),
}

DROPPED = ("time/", "throughput/")


def clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def run(name: str, extra: dict[str, Any], nprocs: int, store: ModelStore) -> dict[str, Any]:
    config = RunConfig.model_validate(merged(BASE, extra))
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as workdir:
        torch.manual_seed(0)
        if nprocs == 1:
            train_job(config, sink, workdir=workdir, model_store=store)
        else:
            launch_local(config, sink, workdir=workdir, nprocs=nprocs, model_store=store)
    steps = {}
    for step, record in sorted(sink.steps.items()):
        metrics = {k: v for k, v in record.metrics.items() if not k.startswith(DROPPED)}
        steps[str(step)] = {
            "metrics": dict(sorted(metrics.items())),
            "rollouts": [vars(r) for r in record.rollouts],
            "prompts": [vars(p) for p in record.prompts],
        }
    events = [kind for kind, _ in sink.events]
    return clean({"steps": steps, "events": events})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="a fingerprint to compare against")
    parser.add_argument("--only", help="comma-separated config names")
    args = parser.parse_args()
    torch.set_num_threads(1)
    store = builtin_store(tempfile.mkdtemp(prefix="fingerprint-store-"))
    names = args.only.split(",") if args.only else list(CONFIGS)
    result = {}
    for name in names:
        extra, nprocs = CONFIGS[name]
        result[name] = run(name, extra, nprocs, store)
        print(f"{name}: {len(result[name]['steps'])} records", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    if not args.compare:
        return
    before = json.loads(Path(args.compare).read_text())
    differ = [n for n in names if before.get(n) != result[n]]
    for n in differ:
        old, new = before.get(n, {}).get("steps", {}), result[n]["steps"]
        for step in sorted(set(old) | set(new), key=int):
            if old.get(step) != new.get(step):
                a, b = old.get(step, {}), new.get(step, {})
                keys = [
                    k
                    for k in set(a.get("metrics", {})) | set(b.get("metrics", {}))
                    if a.get("metrics", {}).get(k) != b.get("metrics", {}).get(k)
                ]
                print(
                    f"  {n} step {step}: metrics differ {sorted(keys)[:8]};"
                    f" rollouts {'same' if a.get('rollouts') == b.get('rollouts') else 'differ'}"
                )
                break
    print(f"identical: {len(names) - len(differ)} of {len(names)}; differ: {differ or 'none'}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
