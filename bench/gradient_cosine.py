"""Cosine between the GRPO and ConSPO parameter gradients on the same mini-batches (issue 12).

    PYTHONPATH=. .venv/bin/python bench/gradient_cosine.py [--config examples/paper_tiny.yaml]
        [--batches 20] [--driver conspo] [--out gradient_cosine.json]

Two regimes of the config's model and task: the config's own (paper_tiny: 4 mini-batches × 2
epochs, π_old frozen over the 8 updates) and the default one (mini_batches 1, epochs 1: one
update per rollout batch, ratio 1). For each of ``--batches`` training steps the trainer's own
functions sample a rollout batch (``collect_rollouts``) and freeze π_old (``no_grad_logprobs``);
at the step's first update (π_θ = π_old) and, with several updates, at its last (π_θ has taken
the step's earlier updates: ratio ≠ 1, GRPO's clip acts), the gradients of GRPO (its defaults),
ConSPO (the config's params) and its linear-contrast ablation with respect to every trainable
parameter are taken on that mini-batch (``policy_batch``), and their cosines printed (mean, min,
max over the steps). Between measurements the ``--driver`` objective trains as the trainer does
(``optimise_chunk``), so later steps see a policy that has moved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conspo import metrics as M  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.models.builtins import builtin_store  # noqa: E402
from conspo.objectives.base import ObjectiveParams  # noqa: E402
from conspo.objectives.grpo import GRPOParams  # noqa: E402
from conspo.registry import get_objective  # noqa: E402
from conspo.training.logprobs import logprob_mode, token_logprobs  # noqa: E402
from conspo.training.loop import TrainState, setup  # noqa: E402
from conspo.training.rollouts import Rollouts, collect_rollouts, mixed_groups  # noqa: E402
from conspo.training.update import (  # noqa: E402
    no_grad_logprobs,
    optimise_chunk,
    policy_batch,
    update_plan,
)

PAIRS = [("grpo", "conspo"), ("grpo", "conspo-linear"), ("conspo", "conspo-linear")]


def objectives(conspo_params: dict[str, Any]) -> dict[str, tuple[Any, ObjectiveParams]]:
    """name → (objective, params): GRPO's defaults, ConSPO's ``conspo_params`` and its linear
    ablation."""
    conspo = get_objective("conspo")
    params = conspo.params.model_validate(conspo_params)
    return {
        "grpo": (get_objective("grpo").fn, GRPOParams()),
        "conspo": (conspo.fn, params),
        "conspo-linear": (conspo.fn, params.model_copy(update={"contrast": "linear"})),
    }


def gradients(
    state: TrainState,
    arms: dict[str, tuple[Any, ObjectiveParams]],
    r: Rollouts,
    rows: torch.Tensor,
    old: torch.Tensor | None,
    step: int,
) -> tuple[dict[str, torch.Tensor], float]:
    """Each arm's flattened gradient in the trainable parameters on the rows' mini-batch, through
    one forward at the current π_θ (as the single-piece path of update.backward), and GRPO's clip
    fraction there."""
    cfg = state.cfg
    sub = r.batch.select(rows)
    with state.precision.autocast():
        logprobs, _ = token_logprobs(
            state.model, sub, cfg.sampling.temperature, group_size=cfg.sampling.group_size
        )
    grads, outs = {}, {}
    for name, (fn, params) in arms.items():
        outs[name] = fn(policy_batch(state, r, rows, logprobs, old, None, step), params)
        parts = torch.autograd.grad(
            outs[name].loss, state.trainable, retain_graph=True, allow_unused=True
        )
        grads[name] = torch.cat([
            (g if g is not None else torch.zeros_like(p)).flatten().float()
            for g, p in zip(parts, state.trainable, strict=True)
        ])  # fmt: skip
    return grads, float(outs["grpo"].stats[M.CLIP_FRAC])


def cosines(grads: dict[str, torch.Tensor]) -> dict[str, float]:
    return {
        f"{a} vs {b}": float(torch.nn.functional.cosine_similarity(grads[a], grads[b], dim=0))
        for a, b in PAIRS
    }


def measure(
    cfg: RunConfig, conspo_params: dict[str, Any], batches: int
) -> dict[str, list[dict[str, float]]]:
    """Per step: the cosines (and GRPO's clip fraction) at its first update and, with several
    updates, at its last one; steps whose mini-batch has no group with both outcomes are left out
    (every group-relative gradient is 0 there)."""
    state = setup(cfg, builtin_store())
    arms = objectives(conspo_params)
    g = cfg.sampling.group_size
    torch.manual_seed(cfg.seed)
    seen: dict[str, list[dict[str, float]]] = {"first update": [], "last update": []}
    for step in range(1, batches + 1):
        r = collect_rollouts(state, step, lambda: False)
        assert r is not None
        logprob_mode(state.model)
        plan = update_plan(cfg, len(r.group_ids) // cfg.sampling.group_size, step)
        frozen = no_grad_logprobs(state, r.batch)[0] if len(plan) > 1 else None
        for group in state.optimizer.param_groups:
            group["lr"] = cfg.optim.lr  # the regime's lr from the first step: no warmup here
        view = state.params.separation_view(step / cfg.steps)
        for i, chunk in enumerate(plan):
            rows = (r.group_ids[:, None] == chunk[None]).any(-1).to(state.device)
            old = None if frozen is None else frozen[rows]
            at = "first update" if i == 0 else "last update" if i == len(plan) - 1 else None
            if at and mixed_groups(r.correct[rows.cpu()], g).any():
                grads, clip_frac = gradients(state, arms, r, rows, old, step)
                seen[at].append({**cosines(grads), "grpo clip_frac": clip_frac})
            optimise_chunk(state, r, rows, old, step, view)
    return seen


def summary(values: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        pair: {
            "mean": statistics.fmean(v[pair] for v in values),
            "min": min(v[pair] for v in values),
            "max": max(v[pair] for v in values),
            "n": len(values),
        }
        for pair in (values[0] if values else {})
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/paper_tiny.yaml")
    parser.add_argument("--batches", type=int, default=20, help="training steps measured")
    parser.add_argument("--driver", default="conspo", help="the objective that trains between")
    parser.add_argument("--out", default="gradient_cosine.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = yaml.safe_load(Path(args.config).read_text())
    own = base.get("params", {})
    conspo_params = own if base["algorithm"] == "conspo" else {}
    driver_params = own if args.driver == base["algorithm"] else {}
    base = {**base, "algorithm": args.driver, "params": driver_params}
    regimes = {
        "config": base,
        "mini_batches=1": {**base, "optim": {**base["optim"], "mini_batches": 1, "epochs": 1}},
    }
    report: dict[str, Any] = {"config": args.config, "driver": args.driver}
    for regime, raw in regimes.items():
        cfg = RunConfig.model_validate(raw)
        for at, values in measure(cfg, conspo_params, args.batches).items():
            if not values:
                continue
            report[f"{regime}, {at}"] = stats = summary(values)
            for pair, s in stats.items():
                print(f"{regime:<15} {at:<13} {pair:<25} mean {s['mean']:+.3f}"
                      f"  min {s['min']:+.3f}  max {s['max']:+.3f}  (n={s['n']})")  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
