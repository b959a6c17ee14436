"""The one launcher: ``launch`` trains a config on the processes its ``resources`` ask for.

    result = launch(config, sink, should_stop, workdir="out", model_store=store)

* one process (``resources.gpus`` 1, ``nodes`` 1): the config's job kind in this process
  (``conspo.jobs.train_job``);
* ``gpus`` > 1 on one machine: that many local ranks (``conspo.launch.local``: rank 0 in this
  process, so ``sink`` and ``should_stop`` work as for one);
* ``nodes`` > 1: a Ray cluster (``conspo.launch.ray_cluster``), reached through ``ray``: where it
  is and what to call the job; without one such a config is refused.

The worker and the CLI both call this; job kinds other than rl train on one process
(``RunConfig`` refuses more). ``conspo.distributed`` holds only the collectives the ranks use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conspo.sink import Sink

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.training.loop import TrainResult


@dataclass(frozen=True)
class RayCluster:
    """Where a multi-node run goes: the cluster's ``address`` (``ray://head:10001``), the Ray
    job's ``name``, and ``on_submitted(ray_job_id)``, called once the job is submitted."""

    address: str
    name: str
    on_submitted: Callable[[str], None] = lambda ray_job_id: None


def launch(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
    ray: RayCluster | None = None,
) -> TrainResult:
    """Train ``config`` to ``config.steps`` on one process, local ranks or a Ray cluster (see the
    module), resuming from ``workdir``'s latest checkpoint. The keyword arguments are
    ``conspo.training.trainer.train``'s, plus ``ray`` for ``resources.nodes`` > 1."""
    where: dict[str, Any] = {
        "workdir": workdir,
        "model_store": model_store,
        "files": files,
        "memory_limit": memory_limit,
    }
    resources = config.resources
    if resources.nodes > 1:
        if ray is None:
            raise RuntimeError(f"resources.nodes is {resources.nodes}: no Ray cluster to submit to")
        from conspo.launch.ray_cluster import train_on_ray

        return train_on_ray(
            config,
            sink,
            should_stop,
            address=ray.address,
            name=ray.name,
            on_submitted=ray.on_submitted,
            **where,
        )
    if resources.gpus > 1:
        from conspo.launch.local import launch_local

        return launch_local(config, sink, should_stop, nprocs=resources.gpus, **where)
    from conspo.jobs import train_job

    return train_job(config, sink, should_stop, **where)
