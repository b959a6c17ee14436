"""Routing runs by the resources they need, and saying why a queued run waits.

A run's job goes to the Celery queue of its capacity class (``queue_for``), named after the
base queue (``Settings.queue``, "gpu"):

* one process on one node (the default ``resources``) → ``gpu``;
* N processes on one node (``resources.gpus: N``) → ``gpu-N``;
* several nodes (``resources.nodes > 1``, trained on the Ray cluster) → ``gpu-ray``.

A worker consumes exactly the queues of the classes it can hold (``queues_served``): one with 4
GPUs ``gpu, gpu-2, gpu-3, gpu-4``; one without GPUs up to ``worker_cpu_processes`` (gloo
processes); and ``gpu-ray`` when Ray is installed and ``ray_address`` is set. So a worker never
receives a run it cannot hold, and nothing is rejected and requeued: no storm of redeliveries
while a big run waits for a big worker (the worker still checks, ``Capacity.holds``).

Why a queued run waits is computed when it is read, from the live workers' rows (what each
advertised at start, ``worker.capabilities``) and the running runs (which hosts are busy):
``Cluster.load`` once per request, then ``Cluster.why_waiting`` per run. A run no live worker
could ever hold is still accepted (a bigger worker may join); its reason says so at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import liveness
from backend.config import Settings
from backend.models import Run, RunStatus, utcnow
from conspo.config import ResourcesConfig

RAY_QUEUE_SUFFIX = "ray"


def queue_for(resources: ResourcesConfig, base: str) -> str:
    """The queue a run needing ``resources`` is sent to."""
    if resources.nodes > 1:
        return f"{base}-{RAY_QUEUE_SUFFIX}"
    return base if resources.gpus == 1 else f"{base}-{resources.gpus}"


def resources_of(config: dict[str, Any] | None) -> ResourcesConfig:
    """The ``resources`` section of a stored config (the defaults when absent or unreadable:
    configs stored before the section existed)."""
    try:
        return ResourcesConfig.model_validate((config or {}).get("resources") or {})
    except (ValidationError, AttributeError):
        return ResourcesConfig()


@dataclass(frozen=True)
class Capacity:
    """What one worker can hold: runs of up to ``processes`` processes on its node (its GPUs;
    without GPUs, its CPU slots), and multi-node runs when it has a Ray cluster."""

    processes: int
    gpus: int  # 0: a CPU-only host (processes are then gloo processes)
    ray: bool

    @classmethod
    def advertised(cls, gpus: list[Any] | None, capabilities: dict[str, Any] | None) -> Capacity:
        """From a worker's ``workers`` row (a row written before capacities existed: 1 slot)."""
        caps = capabilities or {}
        n = len(gpus or [])
        return cls(n or max(1, int(caps.get("cpu_processes") or 1)), n, bool(caps.get("ray")))

    def holds(self, resources: ResourcesConfig) -> bool:
        if resources.nodes > 1:
            return self.ray
        return resources.gpus <= self.processes

    def describe(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU" + ("s" if self.gpus > 1 else "")
        return f"{self.processes} CPU process" + ("es" if self.processes > 1 else "")


def queues_served(capacity: Capacity, base: str) -> list[str]:
    """The queues a worker of ``capacity`` consumes: every class it can hold."""
    queues = [base] + [f"{base}-{n}" for n in range(2, capacity.processes + 1)]
    return queues + ([f"{base}-{RAY_QUEUE_SUFFIX}"] if capacity.ray else [])


def describe_needs(resources: ResourcesConfig, machine: str = "GPU") -> str:
    """ "2 GPUs", "2 nodes × 8 GPUs", "1 CPU process": what the run asks for, in the terms of
    the ``machine`` that will hold it ("GPU", "CPU process", or "process" when unknown).
    ``resources.gpus`` counts processes; on a CPU-only worker each is a CPU (gloo) process."""
    n = resources.gpus
    plural = "es" if machine.endswith("process") else "s"
    each = f"{n} {machine}" + (plural if n > 1 else "")
    return f"{resources.nodes} nodes × {each}" if resources.nodes > 1 else each


def machine_of(device: str | None, cluster: Cluster | None) -> str:
    """What one of a run's processes is: where it trained (``device``) when it has started,
    else what the live workers offer (CPU-only workers: CPU processes); "process" when neither
    is known."""
    if device:
        return "CPU process" if device.startswith("cpu") else "GPU"
    if cluster is not None and cluster.workers:
        return "CPU process" if cluster.cpu_only else "GPU"
    return "process"


@dataclass(frozen=True)
class LiveWorker:
    capacity: Capacity
    busy: bool  # training a run now


@dataclass(frozen=True)
class Cluster:
    """The live workers, read once: what each can hold and whether it is busy."""

    workers: tuple[LiveWorker, ...]

    @property
    def cpu_only(self) -> bool:
        """No live worker has a GPU: a run's processes will be CPU processes."""
        return all(w.capacity.gpus == 0 for w in self.workers)

    @classmethod
    def load(cls, session: Session, settings: Settings) -> Cluster:
        """Live workers (``liveness.alive``), each marked busy while a run of its host runs.

        Runs record the host, not the worker process: on a host with several workers, that
        many of them count as busy as it has running runs (the smallest first, so a reason
        never understates what is idle)."""
        live = liveness.alive(session, utcnow() - timedelta(seconds=settings.worker_alive_s))
        running = Counter(
            session.scalars(
                select(Run.worker_host).where(
                    Run.status == RunStatus.running, Run.external.is_(False)
                )
            )
        )
        workers = []
        for row in sorted(live, key=lambda w: len(w.gpus or [])):
            busy = running[row.host] > 0
            running[row.host] -= busy
            workers.append(LiveWorker(Capacity.advertised(row.gpus, row.capabilities), busy))
        return cls(tuple(workers))

    def why_waiting(self, resources: ResourcesConfig) -> str | None:
        """Why a queued run needing ``resources`` is not being taken; None when an idle live
        worker can hold it (it is about to be claimed)."""
        if not self.workers:
            return "no worker is alive"
        holders = [w for w in self.workers if w.capacity.holds(resources)]
        if any(not w.busy for w in holders):
            return None
        needs = f"needs {describe_needs(resources, machine_of(None, self))}"
        if resources.nodes > 1:
            needs = f"needs Ray ({describe_needs(resources)})"
            if not holders:
                return f"{needs}: no live worker has a Ray cluster (CONSPO_RAY_ADDRESS)"
            return f"{needs}: every worker with a Ray cluster is busy"
        if not holders:
            return f"{needs}; largest live worker has {_largest(self.workers)}"
        idle = [w for w in self.workers if not w.busy]
        if not idle:
            return f"{needs}; every live worker that can hold it is busy"
        return f"{needs}; largest idle worker has {_largest(idle)}"


def _largest(workers: list[LiveWorker] | tuple[LiveWorker, ...]) -> str:
    return max(workers, key=lambda w: (w.capacity.processes, w.capacity.gpus)).capacity.describe()
