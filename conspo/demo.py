"""The demo's settings, written once: 1-digit a±b±c arithmetic from the SFT-warm-started tiny
model, 300 steps (about a minute a run on a quiet 2-core CPU, several on a loaded one).

Everything that offers a starting config starts from ``DEMO_CONFIG`` so that a run made from it
is comparable with the demo's runs: the study ``conspo-lab serve --demo`` queues (its arms set
the algorithm), the new-run form's defaults (``GET /api/presets``), ``examples/run.yaml`` and the
README's examples (tests/lab/test_readme.py holds the last two to it)::

    from conspo.demo import DEMO_CONFIG
    config = RunConfig.model_validate({**DEMO_CONFIG, "algorithm": "grpo"})

The task, sampling and eval settings decide what a curve means (operands, response cap, eval
size); the library's own defaults (``RunConfig()``) are smaller and not comparable with them.
"""

from __future__ import annotations

from typing import Any

DEMO_CONFIG: dict[str, Any] = {
    "steps": 300,
    "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 256},
    "model": {"name": "tiny-arith"},
    "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 6},
    # warmup: without it AdamW's first steps cost ~10-15 points of accuracy at the first
    # evaluation before RL recovers them.
    "optim": {"warmup_steps": 20},
    "eval": {"every": 20, "pass_k": 4},
    "checkpoint": {"every": 50},
}
