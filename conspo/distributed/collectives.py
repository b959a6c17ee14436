"""Data-parallel training on ``torch.distributed``: who this process is, how a step's groups are
shared between processes, the collectives the trainer needs. The ranks are started by
``conspo.launch`` (local processes or Ray Train).

``conspo.training.trainer.train`` runs unchanged inside any initialized process group (the
launcher's, or Ray Train's ``TorchTrainer``); without one, or with a world of 1, nothing here does
anything. In a group:

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

"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    pass

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
