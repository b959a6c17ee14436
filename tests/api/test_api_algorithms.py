"""Every registered algorithm trains through the worker, in the regime where they differ.

The form and the API take any registered objective (their parameters come from the registry);
this runs each one for two steps through the worker's own code (``execute_run``) on tiny-arith
(right about half the time, so groups are mixed) with two mini-batches, so the second update
is off-policy (ratio ≠ 1) and every objective's clipping, gates and constraints act, and
checks the run ends with finite losses.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from conspo.registry import objective_names
from tests.api.conftest import run_in_worker, tiny_config

pytestmark = pytest.mark.services

# What some objectives need beside their defaults on the tiny model's 6-token answers.
EXTRA: dict[str, dict[str, Any]] = {
    "dapo": {"params": {"overlong_buffer": 2}},
    "ispo": {"rewards": [{"name": "verifier"}, {"name": "info_gain"}]},
}


def test_every_registered_algorithm_trains_through_the_worker(own_api: Any) -> None:
    names = objective_names()
    assert {"grpo", "conspo", "dapo", "rloo", "gspo", "cispo", "disco"} <= set(names)
    failed = {}
    for name in names:
        config = tiny_config(
            2,
            algorithm=name,
            model={"name": "tiny-arith"},
            sampling={"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
            optim={"mini_batches": 2},
            **EXTRA.get(name, {}),
        )
        run = run_in_worker(own_api, config)
        if run["status"] != "succeeded":
            failed[name] = run["error"]
            continue
        loss = own_api.get(f"/api/runs/{run['id']}/metrics?keys=optim/loss").json()["series"]
        values = loss["optim/loss"]["values"]
        if len(values) != 2 or not all(v is not None and math.isfinite(v) for v in values):
            failed[name] = f"losses {values}"
    assert not failed, failed
