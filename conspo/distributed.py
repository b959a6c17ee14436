"""Data-parallel training on ``torch.distributed``: who this process is, how a step's groups are
shared between processes, the collectives the trainer needs, and a local launcher.

    result = launch_local(config, sink, should_stop, workdir="out", nprocs=2)

``conspo.trainer.train`` runs unchanged inside any initialized process group (this launcher's,
or Ray Train's ``TorchTrainer``); without one, or with a world of 1, nothing here does anything.
In a group:

* every rank holds the whole step's rollout batch (``gather_objects``), but samples, rewards and
  differentiates only the groups it owns (``owned``: group j belongs to rank j mod world), so a
  group is never split across ranks and the union of the ranks' groups is the 1-process batch;
* the objective runs on the whole mini-batch on every rank, with the log-probs every rank
  computed for its own rows (``gather_rows``); each rank backpropagates the objective's gradient
  in its own rows' log-probs and the gradients are summed (``reduce_gradients``). So every
  batch-level normaliser (token-mean, group counts, the batch reward std, micro-batch two-pass
  weights) is the whole batch's by construction, for every registered objective, and the update
  equals the 1-process one up to float summation order;
* rank 0 alone writes to the sink, checkpoints and evaluates; ``agreed`` makes its answer to
  ``should_stop`` everyone's, so all ranks stop at the same step boundary.

Why no ``DistributedDataParallel`` wrapper (``resources.strategy: ddp`` means a full replica per
rank with gradients summed after each backward): DDP averages gradients, while ours are partial
derivatives of one shared objective that must be summed; and DDP's hooks need every rank to run
the same number of backward passes, which token-budget micro-batches (``optim.micro_batch_tokens``)
do not guarantee. One bucketed all-reduce per optimiser step replaces them.
``resources.strategy: fsdp`` shards weights, gradients and optimiser state with FSDP2 instead
(``shard``; why and how it stays in lockstep: the fsdp section below).

The launcher runs rank 0 in the calling process (the worker's sink, heartbeat and cancel keep
working) and ranks 1..n-1 as ``python -m conspo.distributed`` children that die with their parent
(``PR_SET_PDEATHSIG``: the signal follows the *thread* that started them, so call it from a
thread that lives as long as the run, e.g. the Celery task's); a child that fails fails the run
with its own traceback. gloo notices a dead peer at once; NCCL may only at the collective
timeout (``timeout_s``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from conspo.sink import Sink, StepRecord

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models import ModelStore
    from conspo.trainer import TrainResult

log = logging.getLogger(__name__)

# How long a collective may wait for the slowest rank: rank 0 evaluates alone while the others
# wait at the next step's first collective, so this bounds an evaluation too.
DEFAULT_TIMEOUT_S = 1800.0
# Bound on the gradient all-reduce's staging buffer (elements), so a large model's gradients
# are not copied into one buffer as big as the model.
BUCKET_ELEMENTS = 64 * 1024 * 1024
# The children's start (python, torch, transformers imports) and rendezvous.
JOIN_TIMEOUT_S = 300.0


# --------------------------------------------------------------------------------------------
# Who this process is
# --------------------------------------------------------------------------------------------

T = TypeVar("T")


def active() -> bool:
    """Whether this process trains in a group of more than one."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0, or the only process: the one that writes to the sink and checkpoints."""
    return rank() == 0


def owned(group_ids: torch.Tensor) -> torch.Tensor:
    """(N,) bool: which rows this rank trains, whole groups (group j belongs to rank j mod
    world). Interleaved rather than in blocks, so every contiguous mini-batch of at least
    ``world`` groups gives every rank a share."""
    return group_ids % world_size() == rank()


def owner(group_ids: torch.Tensor) -> torch.Tensor:
    """(N,) the rank that trains each row."""
    return group_ids % world_size()


def my_share(n: int) -> list[int]:
    """The indices in ``range(n)`` this rank samples (the same interleaving as ``owned``)."""
    return list(range(rank(), n, world_size()))


# --------------------------------------------------------------------------------------------
# Collectives (each a no-op without a group)
# --------------------------------------------------------------------------------------------


def agreed(should_stop: Callable[[], bool]) -> Callable[[], bool]:
    """``should_stop`` as rank 0 answers it, broadcast: every rank calls the result at the same
    points and gets the same answer, so all stop at the same step boundary."""
    if not active():
        return should_stop

    def stop() -> bool:
        return bool(broadcast_object(should_stop() if is_main() else None))

    return stop


def main_first(fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0, then on the other ranks: what rank 0 builds (a model store's built-in
    model) is there before they look. Never let another rank build it: transformers'
    ``save_pretrained`` writes no model files on a rank other than 0 of an initialized group."""
    if not active():
        return fn()
    if is_main():
        try:
            return fn()
        finally:
            dist.barrier()
    dist.barrier()
    return fn()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (any picklable value)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (tensors travel on the CPU)."""
    if not active():
        return [obj]
    everyone: list[Any] = [None] * world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


def gather_rows(owners: torch.Tensor, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Whole-batch tensors from each rank's rows: ``parts`` are this rank's (b, T) tensors for
    the rows where ``owners`` (B,) equals its rank, in order; returns (B, T') tensors holding
    every rank's rows where they belong (T' the widest T, right-padded with 0)."""
    everyone = gather_objects([p.detach().cpu() for p in parts])
    out = []
    for j, local in enumerate(parts):
        pieces = [e[j] for e in everyone]
        width = max(p.shape[1] for p in pieces)
        dtype = pieces[0].dtype
        for p in pieces[1:]:
            dtype = torch.promote_types(dtype, p.dtype)
        full = torch.zeros(len(owners), width, dtype=dtype, device=local.device)
        for k, piece in enumerate(pieces):
            full[(owners == k).to(local.device), : piece.shape[1]] = piece.to(full)
        out.append(full)
    return out


def reduce_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum every rank's ``.grad`` in place (each holds its rows' share of one objective's
    gradient). A parameter without a gradient on every rank keeps none, as in one process, so
    AdamW skips it there too."""
    if not active():
        return
    present = torch.tensor(
        [p.grad is not None for p in params], dtype=torch.int32, device=_collective_device()
    )
    dist.all_reduce(present, op=dist.ReduceOp.MAX)
    grads: list[torch.Tensor] = []
    for p, has in zip(params, present.tolist(), strict=True):
        if has and p.grad is None:
            p.grad = torch.zeros_like(p)
        if has and p.grad is not None:
            grads.append(p.grad)
    for bucket in _buckets(grads):
        flat = torch._utils._flatten_dense_tensors(bucket)
        dist.all_reduce(flat)
        for grad, summed in zip(
            bucket, torch._utils._unflatten_dense_tensors(flat, bucket), strict=True
        ):
            grad.copy_(summed)


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive gradients of one dtype and device, at most ``BUCKET_ELEMENTS`` each (a
    larger tensor alone)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        last = buckets[-1] if buckets else None
        fits = last is not None and size + g.numel() <= BUCKET_ELEMENTS
        if last is None or not fits or (last[0].dtype, last[0].device) != (g.dtype, g.device):
            buckets.append([g])
            size = g.numel()
        else:
            last.append(g)
            size += g.numel()
    return buckets


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Rank 0's weights and buffers on every rank (they load the same checkpoint and seed; this
    makes the replicas identical whatever the loader did)."""
    if not active():
        return
    for tensor in model.state_dict().values():
        dist.broadcast(tensor.data, src=0)


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------
# resources.strategy: fsdp (FSDP2 ``fully_shard``)
# --------------------------------------------------------------------------------------------
#
# Parameters, gradients and optimiser state live sharded across the ranks (``fully_shard`` on the
# root module: one flat group, so one all-gather and one reduce-scatter per optimiser step). The
# ranks do not run the same number of forwards and backwards (generation stops at EOS; each rank
# micro-batches its own rows by token budget; rank 0 evaluates alone), while FSDP's hooks
# all-gather in a forward and reduce-scatter in a backward. So the full parameters are made
# resident once per optimiser step (``unshard``: every forward and backward in between runs
# without a collective, ``reshard_after_forward``/``_backward`` off) and every backward only
# accumulates the unsharded gradient (``requires_gradient_sync`` off); ``sync_sharded_gradients``
# then runs one zero-weight backward on every rank with the sync on: its reduce-scatter SUMS the
# accumulated gradients into each rank's shard (divide factor 1, sum-only ops: gloo has no
# PREMUL_SUM), the optimiser steps on the shards, and ``unshard`` gathers the new weights.
# The memory saved: the optimiser state (two fp32 moments) and the gradients between updates are
# 1/world per rank; the full parameters and their unsharded gradient are resident during a step
# (generation needs the full parameters anyway).


def shard(model: torch.nn.Module) -> None:
    """Shard ``model``'s parameters across the group (FSDP2), then gather the full parameters
    for the first step. Build the optimiser on ``model.parameters()`` BEFORE this returns'
    ``unshard``: take them with ``sharded_parameters``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = _collective_device().type
    fsdp = fully_shard(
        model, mesh=init_device_mesh(device, (world_size(),)), reshard_after_forward=False
    )
    fsdp.set_gradient_divide_factor(1.0)  # each rank holds a share of one objective: sum
    fsdp.set_force_sum_reduction_for_comms(True)
    fsdp.set_reduce_scatter_unused_params(True)  # the same flat buffer on every rank
    fsdp.set_reshard_after_backward(False)
    fsdp.set_requires_gradient_sync(False)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gather_parameters(model: torch.nn.Module) -> None:
    """Make the full parameters resident on every rank (collective; a no-op unless sharded)."""
    if is_sharded(model):
        model.unshard()  # type: ignore[operator]  # an FSDPModule


def sync_sharded_gradients(model: torch.nn.Module, zero_backward: Callable[[], None]) -> None:
    """Sum every rank's accumulated gradient into its shard of ``.grad`` (collective).
    ``zero_backward`` runs one forward and a backward whose gradient is exactly zero: FSDP's
    post-backward hook reduce-scatters what the rank's earlier backwards accumulated. After this
    the parameters are sharded again (the optimiser steps on the shards); ``gather_parameters``
    before the next forward."""
    fsdp: Any = model
    fsdp.set_requires_gradient_sync(True, recurse=False)
    fsdp.set_reshard_after_backward(True, recurse=False)
    try:
        zero_backward()
    finally:
        fsdp.set_requires_gradient_sync(False, recurse=False)
        fsdp.set_reshard_after_backward(False, recurse=False)


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """A regular tensor from a (replicated or sharded) DTensor: a sharded model's gradient norm
    or gradient (collective for a sharded one); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole model's and optimiser's state, on the CPU, on rank 0 (empty elsewhere). A
    collective: every rank calls it. The optimiser's is keyed by parameter name (``torch.
    distributed.checkpoint``'s format), which ``load_full_state_dicts`` reads back."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    gather_parameters(model)  # the state-dict hooks swapped the sharded parameters in
    return model_state, optimizer_state


def load_full_state_dicts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
) -> None:
    """Load whole (unsharded) states, as ``full_state_dicts`` returns them, into the sharded
    model and its optimiser; every rank passes the whole states (each keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    model.reshard()  # type: ignore[operator]  # an FSDPModule: load into the shards
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
    gather_parameters(model)


# --------------------------------------------------------------------------------------------
# The local launcher
# --------------------------------------------------------------------------------------------


class NullSink:
    """What ranks other than 0 log to: nothing."""

    def log_step(self, record: StepRecord) -> None:
        pass

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        pass


class RankFailed(RuntimeError):
    """A child rank of ``launch_local`` failed; the message carries its traceback."""


def launch_local(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    nprocs: int,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TrainResult:
    """``train`` on ``nprocs`` processes of this machine: rank 0 here, the others children.

    gloo on the CPU, NCCL with one CUDA device per rank when the config trains on CUDA. The
    group is destroyed and every child reaped before this returns or raises; a child's failure
    (its exit code and traceback) becomes this call's ``RankFailed``.
    """
    from conspo.jobs import train_job
    from conspo.models import pick_device
    from conspo.trainer import train

    if nprocs == 1:  # one process trains any job kind; more train rl only (RunConfig refuses)
        return train_job(
            config,
            sink,
            should_stop,
            workdir=workdir,
            model_store=model_store,
            files=files,
            memory_limit=memory_limit,
        )
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("launch_local: this process is already in a process group")
    cuda = pick_device(config.model)[0].type == "cuda"
    if cuda and torch.cuda.device_count() < nprocs:
        raise RuntimeError(
            f"resources.gpus is {nprocs} but this machine has {torch.cuda.device_count()} CUDA"
            " devices"
        )
    backend = "nccl" if cuda else "gloo"
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        nprocs,
        is_master=True,
        timeout=timedelta(seconds=JOIN_TIMEOUT_S),
        wait_for_workers=False,
    )
    scratch = Path(tempfile.mkdtemp(prefix="conspo-ranks-"))
    spec = {
        "config": config,
        "workdir": str(workdir),
        "model_store": model_store,
        "files": files,
        "memory_limit": memory_limit,
        "port": store.port,
        "world": nprocs,
        "backend": backend,
        "timeout_s": timeout_s,
        "threads": torch.get_num_threads(),
    }
    (scratch / "spec.pkl").write_bytes(pickle.dumps(spec))
    children = [_spawn(r, scratch) for r in range(1, nprocs)]
    try:
        _await_children(store, children, scratch)
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group(
            backend,
            store=store,
            rank=0,
            world_size=nprocs,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            result = train(
                config,
                sink,
                should_stop,
                workdir=workdir,
                model_store=model_store,
                files=files,
                memory_limit=memory_limit,
            )
        finally:
            dist.destroy_process_group()
        _wait_children(children, scratch, timeout=JOIN_TIMEOUT_S)
        return result
    except BaseException as exc:
        failure = _child_failure(children, scratch, grace=10.0)
        if failure is not None and not isinstance(exc, RankFailed):
            raise RankFailed(failure) from exc
        raise
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


def _spawn(rank_: int, scratch: Path) -> subprocess.Popen[bytes]:
    """Rank ``rank_`` as a child that dies with this process (``PR_SET_PDEATHSIG``)."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "conspo.distributed", str(scratch), str(rank_)],
        env=env,
        preexec_fn=_die_with_parent,
        stdin=subprocess.DEVNULL,
    )


def _await_children(
    store: dist.TCPStore, children: list[subprocess.Popen[bytes]], scratch: Path
) -> None:
    """Wait until every child has reached the store, failing as soon as one has died:
    ``init_process_group`` itself would wait for a dead child until its timeout."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    waiting = [f"joined/{r}" for r in range(1, len(children) + 1)]
    while not store.check(waiting):
        failure = _child_failure(children, scratch, grace=0.0)
        if failure is not None:
            raise RankFailed(failure)
        if any(c.poll() is not None for c in children):
            raise RankFailed("a rank exited before joining the group")
        if time.monotonic() > deadline:
            raise RankFailed(f"the ranks did not start within {JOIN_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def _die_with_parent() -> None:
    """In the child between fork and exec: SIGKILL when the parent dies (Linux), so a
    ``kill -9`` of the worker leaves no rank blocked in a collective."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _wait_children(children: list[subprocess.Popen[bytes]], scratch: Path, timeout: float) -> None:
    """Every child exits (they finish with rank 0); a non-zero exit is ``RankFailed``."""
    deadline = time.monotonic() + timeout
    for child in children:
        child.wait(timeout=max(0.0, deadline - time.monotonic()))
    failure = _child_failure(children, scratch, grace=0.0)
    if failure is not None:
        raise RankFailed(failure)


def _child_failure(
    children: list[subprocess.Popen[bytes]], scratch: Path, grace: float
) -> str | None:
    """The first failed child's exit code and traceback, waiting up to ``grace`` seconds for
    the children to exit (rank 0's error may be the echo of a child's: a closed connection)."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        time.sleep(0.05)
    for r, child in enumerate(children, start=1):
        code = child.poll()
        if code is not None and code != 0:
            report = scratch / f"rank{r}.err"
            detail = report.read_text() if report.exists() else "(no traceback: killed?)"
            return f"rank {r} exited with code {code}:\n{detail}"
    return None


def _child_main(scratch: Path, rank_: int) -> None:
    """A child rank: join the group, train with a sink that drops everything, report failure."""
    from conspo.trainer import train

    try:
        spec = pickle.loads((scratch / "spec.pkl").read_bytes())
        torch.set_num_threads(spec["threads"])
        if spec["backend"] == "nccl":
            torch.cuda.set_device(rank_)
        store = dist.TCPStore(
            "127.0.0.1",
            spec["port"],
            spec["world"],
            is_master=False,
            timeout=timedelta(seconds=JOIN_TIMEOUT_S),
        )
        store.set(f"joined/{rank_}", "1")
        dist.init_process_group(
            spec["backend"],
            store=store,
            rank=rank_,
            world_size=spec["world"],
            timeout=timedelta(seconds=spec["timeout_s"]),
        )
        try:
            train(
                spec["config"],
                NullSink(),
                workdir=spec["workdir"],
                model_store=spec["model_store"],
                files=spec["files"],
                memory_limit=spec["memory_limit"],
            )
        finally:
            dist.destroy_process_group()
    except BaseException:
        (scratch / f"rank{rank_}.err").write_text(traceback.format_exc()[-20_000:])
        sys.exit(1)


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]), int(sys.argv[2]))
