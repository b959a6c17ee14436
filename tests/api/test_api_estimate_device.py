"""The memory estimate counts a weight's bytes where ``model.device: auto`` will run (issue 49's
walk: the form said bfloat16's 2 bytes for an SFT stage its CPU worker trained in float32, 2.1×
under the peak): with live workers and none with a GPU, float32's 4, as an explicit cpu;
with a GPU worker alive, or none known, bfloat16's 2 (submitting checks the same estimate:
``backend.runs.submit.problems``). Both databases."""

from __future__ import annotations

from typing import Any

import pytest

from backend.liveness import WorkerIdentity
from tests.api.conftest import Api, tiny_config
from tests.api.test_api_engines import CPU_NODE, GPU_NODE, H200, alive

pytestmark = pytest.mark.services


def estimated(api: Api, **model: Any) -> int:
    config = tiny_config(1)
    config["model"] = {**config["model"], **model}
    r = api.post("/api/runs/estimate", user=None, json={"config": config})
    assert r.status_code == 200, r.text
    total = r.json()["total_bytes"]
    assert isinstance(total, int)
    return total


def test_auto_is_counted_where_the_live_workers_run(own_api: Api) -> None:
    on_cpu, on_gpu = estimated(own_api, device="cpu"), estimated(own_api, device="cuda")
    assert on_cpu > on_gpu  # float32 weights against bfloat16's
    assert estimated(own_api, device="auto") == on_gpu  # no worker known yet: the smaller
    alive(own_api.settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=CPU_NODE))
    assert estimated(own_api, device="auto") == on_cpu  # every live worker is a CPU
    alive(own_api.settings, WorkerIdentity(host="gpu-1", pid=2, gpus=H200, capabilities=GPU_NODE))
    assert estimated(own_api, device="auto") == on_gpu  # a GPU worker may take it
