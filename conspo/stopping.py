"""Abandoning a run inside a phase, not only between steps.

The training loop stops at step boundaries (``should_stop``), but one step, one evaluation or
building one task can take minutes on a CPU, and a cancelled run must end within seconds. A
caller that may abandon a run installs a check for its own thread:

    with stopping.abandon_when(lambda: cancel_requested()):
        train(...)              # raises Abandoned soon after the check turns true

and every long loop asks ``stopping.check()`` between small pieces of work: each decode step
of sampling and evaluation, each micro-batch and mini-batch of the update, each problem a task
draws, each slice of a wait on a tool call, each step of a built-in model's warm start, and each
layer of a forward pass that computes no gradient (``check_between_layers``: a prefill, an
evaluation's, the old and reference policies' log-probs). A
check is a thread-local lookup and the caller's flag: cheap enough for every token. Abandoned is
final: what was logged stays, and no checkpoint is written of the half-done step (the last one
saved keeps its own step's weights), so it is for a cancel or a lost attempt, never for a
shutdown that hands the run back to be resumed (that stops at the next step boundary).

The check is the installing thread's: a process of a DDP group gets none (a rank that left a
collective alone would hang the others), and its loops run as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_local = threading.local()


class Abandoned(Exception):
    """The installed check turned true inside a phase: the phase's work is dropped."""


@contextmanager
def abandon_when(check: Callable[[], bool]) -> Iterator[None]:
    """Install ``check`` for this thread (cheap: it is asked often) until the block ends."""
    previous = getattr(_local, "check", None)
    _local.check = check
    try:
        yield
    finally:
        _local.check = previous


def installed() -> Callable[[], bool] | None:
    """This thread's installed check, for a thread this one starts to install as its own
    (``conspo.training.pipeline``: a cancel lands in the generating thread too)."""
    check: Callable[[], bool] | None = getattr(_local, "check", None)
    return check


def abandoning() -> bool:
    """Whether this thread's check is installed and true (for a loop that must clean up,
    e.g. kill an engine's process, before ``check`` raises)."""
    installed = getattr(_local, "check", None)
    return installed is not None and bool(installed())


def check() -> None:
    """Raise ``Abandoned`` if this thread's check is installed and true."""
    if abandoning():
        raise Abandoned("the run was abandoned (cancelled) inside a phase")


def check_between_layers(model: Any) -> None:
    """Ask ``check`` before each layer (every module of every ``nn.ModuleList``) of ``model``'s
    forward passes that compute no gradient: one such pass, SmolLM2's prefill of a step's
    prompts, took ~7 s on a loaded 2-core CPU with no other place to stop, and a cancel then
    took 10-22 s (bench/loaded_box.py). A pass that computes gradients is left alone: the update
    asks between its micro-batches, and raising inside a gradient-checkpointed backward (which
    runs the forward again) would leave autograd mid-flight."""
    import torch

    def before_layer(_module: Any, _args: Any) -> None:
        if not torch.is_grad_enabled():
            check()

    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for layer in module:
                layer.register_forward_pre_hook(before_layer)
