"""optim/update_size: how far a step moved the policy, ‖θ_after − θ_before‖ / ‖θ_before‖, the
step-size diagnostic that makes two objectives' effective step sizes comparable."""

from __future__ import annotations

import pytest
import torch

from conspo import metrics as M
from conspo.training.update import UPDATE_SIZE_ELEMENTS, measured_parameters
from tests.conspo.test_no_signal import config, run_update, silenced


def test_the_update_size_is_the_relative_change_of_the_weights(model_store, arith_base,
                                                               monkeypatch):  # fmt: skip
    rollouts, stats, _, taken, _, before, after = run_update(
        config("grpo"), model_store, None, monkeypatch, False
    )
    assert taken == 1
    moved = torch.cat([(a - b).flatten() for a, b in zip(after, before, strict=True)]).norm()
    size = torch.cat([b.flatten() for b in before]).norm()
    assert float(stats[M.OPTIM_UPDATE_SIZE]) == pytest.approx(float(moved / size), rel=1e-4)
    assert float(stats[M.OPTIM_UPDATE_SIZE]) > 0
    _, quiet, *_ = run_update(config("grpo"), model_store, silenced(rollouts), monkeypatch, False)
    assert float(quiet[M.OPTIM_UPDATE_SIZE]) == 0.0  # no optimiser step, nothing moved


def test_a_large_model_is_measured_on_a_spread_sample_within_the_budget():
    params = [torch.nn.Parameter(torch.zeros(1_000_000)) for _ in range(30)]
    picked = measured_parameters(params)
    assert sum(p.numel() for p in picked) <= UPDATE_SIZE_ELEMENTS
    assert picked[0] is params[0] and len(picked) >= 5  # spread from the first layer on
    last = next(i for i, p in enumerate(params) if p is picked[-1])
    assert last >= 24  # ... to the last few
    small = params[:3]
    assert measured_parameters(small) == small  # all of them when they fit
