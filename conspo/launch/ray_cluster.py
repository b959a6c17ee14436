"""Multi-node runs on a Ray cluster (``conspo.launch.launch`` picks it for ``resources.nodes`` >
1): ``train_on_ray`` has ``conspo.training.trainer.train``'s signature.

    from conspo.launch.ray_cluster import train_on_ray
    result = train_on_ray(config, sink, should_stop, workdir="/shared/runs/7",
                          address="ray://head:10001", name="conspo-run-7-a1")

The caller's process is the Ray driver. It submits a Ray Train ``TorchTrainer`` with
``resources.nodes × resources.gpus`` workers (one per device; CPU workers where the cluster has no
GPUs); each worker calls ``conspo.training.trainer.train`` inside the torch.distributed group Ray
Train sets up (NCCL on GPUs, gloo on CPU), so all three paths (one process, N local processes, Ray)
share one trainer.

Records flow back through the caller's sink, one path for every run: rank 0 trains with a
``RelaySink`` that puts each ``StepRecord`` and event on a small ``Relay`` actor, and the driver
drains it into ``sink`` (the worker's ``DbSink``, so the database writes, their idempotence and
the live stream stay as they are). ``flush`` goes through too: rank 0 waits until the driver has
flushed ``sink``, so a checkpoint never covers a step the database lacks.

Cancel: ``should_stop`` is read by the driver; once true it raises the relay's stop flag, which
every rank's ``should_stop`` reads, and the trainer stops at the next step boundary after a
checkpoint. A run that has not stopped ``stop_grace_s`` later is torn down (the driver
disconnects, which ends the Ray job and its workers).

Storage: ``workdir`` must be on a path every node sees (NFS, say): the checkpoints are written
there by rank 0 and read by every rank when a later attempt resumes. On one machine that is
just the local disk. Every node needs this package installed (the same image as the workers).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conspo.config import RunConfig
from conspo.sink import Sink, StepRecord, flush_sink
from conspo.training.loop import TrainResult

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often the driver drains the relay and reads should_stop
STOP_GRACE_S = 120.0  # after a cancel, how long the ranks get to checkpoint and stop


class Relay:
    """The Ray actor between rank 0 and the driver: a FIFO of records, the stop flag, and how
    many flushes the driver has done (so rank 0's ``flush`` can wait for its turn)."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []
        self.stop = False
        self.flushed = 0

    def put(self, item: tuple[Any, ...]) -> None:
        self.items.append(item)

    def take(self) -> list[tuple[Any, ...]]:
        items, self.items = self.items, []
        return items

    def request_stop(self) -> None:
        self.stop = True

    def stop_requested(self) -> bool:
        return self.stop

    def ack_flush(self, n: int) -> None:
        self.flushed = max(self.flushed, n)

    def flushes_done(self) -> int:
        return self.flushed


class RelaySink:
    """Rank 0's sink: every record goes to the relay, in order; ``flush`` returns once the
    driver has flushed its own sink up to here."""

    def __init__(self, relay: Any) -> None:
        self.relay = relay
        self.flushes = 0

    def log_step(self, record: StepRecord) -> None:
        self.relay.put.remote(("step", record))

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        self.relay.put.remote(("event", kind, data))

    def flush(self) -> None:
        import ray

        self.flushes += 1
        ray.get(self.relay.put.remote(("flush", self.flushes)))
        while ray.get(self.relay.flushes_done.remote()) < self.flushes:
            time.sleep(POLL_S / 2)


class SilentSink:
    """The other ranks' sink: only rank 0 reports."""

    def log_step(self, record: StepRecord) -> None:
        pass

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        pass


def train_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs: ``conspo.training.trainer.train`` on its rank."""
    import ray
    import ray.train
    import ray.train.torch
    import torch

    from conspo.training.trainer import train

    rank = ray.train.get_context().get_world_rank()
    if torch.cuda.is_available():  # the trainer trains on the current CUDA device
        torch.cuda.set_device(ray.train.torch.get_device())
    relay = loop_config["relay"]
    result = train(
        RunConfig.model_validate(loop_config["config"]),
        RelaySink(relay) if rank == 0 else SilentSink(),
        lambda: bool(ray.get(relay.stop_requested.remote())),
        workdir=Path(loop_config["workdir"]),  # shared: rank 0 alone checkpoints
        model_store=loop_config["model_store"],
        files=loop_config["files"],
        memory_limit=loop_config["memory_limit"],
    )
    if rank == 0:
        ray.get(relay.put.remote(("result", result.status, result.last_step)))


class _Fit:
    """``TorchTrainer.fit`` running in a thread of the driver (the driver's own thread pumps
    records meanwhile); ``error`` is what it raised."""

    def __init__(self, trainer: Any) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            name="ray-fit", daemon=True, target=self._fit, args=(trainer,)
        )
        self.thread.start()

    def _fit(self, trainer: Any) -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # reported by train_on_ray
            self.error = exc


def train_on_ray(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    address: str,
    name: str,
    model_store: Any = None,
    files: Any = None,
    memory_limit: int | None = None,
    on_submitted: Callable[[str], None] = lambda ray_id: None,
    stop_grace_s: float = STOP_GRACE_S,
) -> TrainResult:
    """Train ``config`` on the Ray cluster at ``address``; ``on_submitted`` gets the id
    ("<Ray job id>/<name>") once the trainer is submitted. Raises what the run raised."""
    import ray

    workdir = Path(workdir).resolve()
    _connect(address)
    try:
        relay = ray.remote(num_cpus=0)(Relay).remote()
        trainer = _trainer(config, relay, workdir, name, model_store, files, memory_limit)
        fit = _Fit(trainer)
        on_submitted(f"{ray.get_runtime_context().get_job_id()}/{name}")
        result = _pump(relay, sink, should_stop, fit, stop_grace_s)
    finally:
        ray.shutdown()
    if result is None:
        if fit.error is not None:
            raise RuntimeError(f"the Ray run {name} failed: {fit.error}") from fit.error
        return TrainResult("cancelled", 0)  # torn down after a cancel
    return result


def _connect(address: str) -> None:
    """``ray.init`` as the driver. Ray enables ``faulthandler`` on ``sys.stderr``, which a
    Celery worker has replaced by a logging proxy without a file descriptor: the process's
    real stderr stands in while Ray connects."""
    import ray

    stderr = sys.stderr
    if not _has_fd(stderr):
        sys.stderr = sys.__stderr__
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    finally:
        sys.stderr = stderr


def _has_fd(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _trainer(
    config: RunConfig,
    relay: Any,
    workdir: Path,
    name: str,
    model_store: Any,
    files: Any,
    memory_limit: int | None,
) -> Any:
    import ray
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    use_gpu = ray.cluster_resources().get("GPU", 0) > 0  # the cluster's nodes, not the driver's
    return TorchTrainer(
        train_loop,
        train_loop_config={
            "config": config.model_dump(mode="json"),
            "relay": relay,
            "workdir": str(workdir),
            "model_store": model_store,
            "files": files,
            "memory_limit": memory_limit,
        },
        scaling_config=ScalingConfig(
            num_workers=config.resources.world_size,
            use_gpu=use_gpu,
            resources_per_worker={"GPU": 1} if use_gpu else {"CPU": 1},
        ),
        run_config=RayRunConfig(name=name, storage_path=str(workdir / "ray")),
    )


def _pump(
    relay: Any, sink: Sink, should_stop: Callable[[], bool], fit: _Fit, stop_grace_s: float
) -> TrainResult | None:
    """Forward rank 0's records into ``sink`` until the trainer ends; its result, or None when
    it failed or was torn down after a cancel."""
    import ray

    result: TrainResult | None = None
    stop_sent_at: float | None = None
    while True:
        finished = not fit.thread.is_alive()  # read before the last drain: nothing is missed
        for item in ray.get(relay.take.remote()):
            result = _forward(item, sink, relay) or result
        if finished:
            return result
        if stop_sent_at is None and should_stop():
            relay.request_stop.remote()
            stop_sent_at = time.monotonic()
        elif stop_sent_at is not None and time.monotonic() - stop_sent_at > stop_grace_s:
            log.warning(
                "the Ray run did not stop within %.0f s of a cancel; tearing it down", stop_grace_s
            )
            return None
        fit.thread.join(POLL_S)


def _forward(item: tuple[Any, ...], sink: Sink, relay: Any) -> TrainResult | None:
    kind = item[0]
    if kind == "step":
        sink.log_step(item[1])
    elif kind == "event":
        sink.log_event(item[1], item[2])
    elif kind == "flush":
        flush_sink(sink)
        relay.ack_flush.remote(item[1])
    elif kind == "result":
        return TrainResult(item[1], item[2])
    return None
