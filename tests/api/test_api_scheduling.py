"""Scheduling by resources: a run's job goes to the queue of its capacity class, a worker never
claims a run it cannot hold, and a queued run says why it waits, computed from the live workers
(in the API's run JSON, the runs list, and at once on submit). Both databases.

The end-to-end paths (a real Celery worker, a local Ray cluster) are in test_api_ray.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from backend.db import Database
from backend.liveness import WorkerIdentity
from backend.models import Run, RunStatus
from backend.runs.queue import JobQueue, make_celery
from backend.runs.scheduling import Capacity, Cluster, LiveWorker, queue_for, queues_served
from conspo.config import ResourcesConfig
from tests.api.conftest import TINY, Api, tiny_config
from tests.api.test_api_engines import alive
from worker.tasks import execute_run

pytestmark = pytest.mark.services

FOUR_GPUS = [{"index": i, "name": "NVIDIA H200", "memory_bytes": 150 * 10**9} for i in range(4)]


def resources(gpus: int = 1, nodes: int = 1) -> ResourcesConfig:
    return ResourcesConfig(gpus=gpus, nodes=nodes)


def test_each_capacity_class_has_a_queue_and_workers_serve_what_they_hold() -> None:
    assert [queue_for(resources(g, n), "gpu") for g, n in [(1, 1), (8, 1), (1, 2)]] == [
        "gpu",
        "gpu-8",
        "gpu-ray",
    ]
    four = Capacity.advertised(FOUR_GPUS, {"cpu_processes": 2, "ray": None})
    assert queues_served(four, "gpu") == ["gpu", "gpu-2", "gpu-3", "gpu-4"]
    cpu_ray = Capacity.advertised([], {"cpu_processes": 2, "ray": "auto"})
    assert queues_served(cpu_ray, "gpu") == ["gpu", "gpu-2", "gpu-ray"]
    assert Capacity.advertised([], {}) == Capacity(1, 0, False)  # a row from before capacities
    # A worker serves a queue exactly when it holds that class's runs.
    for capacity in (four, cpu_ray):
        for need in (resources(1), resources(3), resources(4), resources(5), resources(1, 2)):
            served = queue_for(need, "gpu") in queues_served(capacity, "gpu")
            assert served == capacity.holds(need), (capacity, need)


def test_the_reason_names_what_is_missing() -> None:
    four = Capacity.advertised(FOUR_GPUS, {})
    cpu = Capacity.advertised([], {"cpu_processes": 2})
    idle = Cluster((LiveWorker(four, busy=False), LiveWorker(cpu, busy=False)))
    assert idle.why_waiting(resources(4)) is None
    assert idle.why_waiting(resources(8)) == "needs 8 GPUs; largest live worker has 4 GPUs"
    assert idle.why_waiting(resources(1, 2)) == (
        "needs Ray (2 nodes × 1 GPU): no live worker has a Ray cluster (CONSPO_RAY_ADDRESS)"
    )
    busy = Cluster((LiveWorker(four, busy=True), LiveWorker(cpu, busy=False)))
    assert busy.why_waiting(resources(2)) is None  # the idle CPU worker holds 2 processes
    assert busy.why_waiting(resources(4)) == (
        "needs 4 GPUs; largest idle worker has 2 CPU processes"
    )
    assert Cluster(()).why_waiting(resources(1)) == "no worker is alive"


def test_on_cpu_only_workers_a_run_needs_cpu_processes_not_gpus() -> None:
    cpu = Capacity.advertised([], {"cpu_processes": 1})
    busy = Cluster((LiveWorker(cpu, busy=True),))
    assert busy.why_waiting(resources(1)) == (
        "needs 1 CPU process; every live worker that can hold it is busy"
    )
    assert Cluster((LiveWorker(cpu, busy=False),)).why_waiting(resources(2)) == (
        "needs 2 CPU processes; largest live worker has 1 CPU process"
    )


def test_a_runs_resources_read_as_the_machine_it_gets(own_api: Api) -> None:
    """On a CPU-only cluster a queued run occupies "1 CPU process"; once it has trained, the
    device it trained on says what it occupied."""
    settings = own_api.settings
    alive(settings, WorkerIdentity(host="cpu-1", pid=1, gpus=[], capabilities={}))
    queued = submit(own_api)
    assert own_api.get(f"/api/runs/{queued['id']}").json()["resources_text"] == "1 CPU process"
    db = Database(settings)
    with db.session() as session:
        session.execute(update(Run).where(Run.id == queued["id"]).values(device="cuda:0 (H200)"))
        session.commit()
    db.dispose()
    assert own_api.get(f"/api/runs/{queued['id']}").json()["resources_text"] == "1 GPU"


def submit(api: Api, **res: int) -> dict[str, Any]:
    world = res.get("gpus", 1) * res.get("nodes", 1)  # every process trains whole groups
    sampling = {**TINY["sampling"], "prompts_per_step": max(2, world)}
    r = api.post("/api/runs", json={"config": tiny_config(1, resources=res, sampling=sampling)})
    assert r.status_code == 201, r.text
    return r.json()["runs"][0]


def test_a_run_no_live_worker_can_hold_waits_with_the_reason_shown(own_api: Api) -> None:
    settings = own_api.settings
    alive(settings, WorkerIdentity(host="gpu-4", pid=1, gpus=FOUR_GPUS, capabilities={}))
    # Accepted (a bigger worker may join), and the reason is there at once.
    big = submit(own_api, gpus=8)
    assert big["waiting_reason"] == "needs 8 GPUs; largest live worker has 4 GPUs"
    ray = submit(own_api, gpus=1, nodes=2)
    assert "no live worker has a Ray cluster" in ray["waiting_reason"]
    fits = submit(own_api, gpus=4)
    assert fits["waiting_reason"] is None
    # The same in the run's JSON and in the runs list.
    assert own_api.get(f"/api/runs/{big['id']}").json()["waiting_reason"] == big["waiting_reason"]
    listed = {r["id"]: r for r in own_api.get("/api/runs").json()["items"]}
    assert listed[ray["id"]]["waiting_reason"] == ray["waiting_reason"]
    assert listed[fits["id"]]["waiting_reason"] is None
    # Each job waits on its class's queue.
    jobs = JobQueue(make_celery(settings), settings.queue)
    assert [jobs.waiting(f"{settings.queue}-{c}") for c in ("8", "ray", "4")] == [1, 1, 1]
    assert jobs.waiting() == 0
    # Once the 4-GPU worker is busy (a run of its host is running), the fitting run waits too.
    db = Database(settings)
    with db.session() as session:
        session.execute(
            update(Run)
            .where(Run.id == big["id"])
            .values(status=RunStatus.running, worker_host="gpu-4")
        )
        session.commit()
    db.dispose()
    reason = own_api.get(f"/api/runs/{fits['id']}").json()["waiting_reason"]
    assert reason == "needs 4 GPUs; every live worker that can hold it is busy"


def test_a_worker_never_claims_a_run_it_cannot_hold(own_api: Api) -> None:
    """A job on a queue this worker serves (sent before the run's queue existed, say) for a run
    bigger than this worker: not claimed, sent on to the run's own queue."""
    settings = own_api.settings
    run = submit(own_api, gpus=settings.worker_cpu_processes + 1)
    jobs = JobQueue(make_celery(settings), settings.queue)
    own_queue = f"{settings.queue}-{settings.worker_cpu_processes + 1}"
    assert jobs.waiting(own_queue) == 1
    db = Database(settings)
    try:
        assert execute_run(db, jobs, settings, run["id"]) == "rerouted"
    finally:
        db.dispose()
    after = own_api.get(f"/api/runs/{run['id']}").json()
    assert after["status"] == "queued" and after["attempt"] == 0
    assert jobs.waiting(own_queue) == 2 and jobs.waiting() == 0
