"""Asynchronous generation (``sampling.max_staleness`` k ≥ 1): rollouts of the next steps are
generated on a thread of their own while the trainer updates on this step's.

    pipeline = RolloutPipeline(state, first_step=1, max_staleness=1)
    rollouts, waited = pipeline.take(1, should_stop)   # step 1's batch; steps 2…1+k start
    ...update...
    pipeline.publish(1, state.model)                   # the weights after update 1
    pipeline.close()

Step s is always sampled by the weights after update ``s − 1 − k`` (the starting weights for
the first k + 1 steps): exactly k updates stale, whatever the two threads' timing, so an async
run is as reproducible as a synchronous one. Step s's generation is started when step s − k is
taken, after update s − k − 1 was published, so the weights it needs are always there.

The generating thread samples from a copy of the policy (``generation_copy``: the frozen base
shared, the trainable tensors its own) loaded with the published weights of the version it
needs (``snapshot``: the trainable tensors, cloned), so the trainer's in-place updates never
tear a batch mid-generation. The engine is shared: the vllm engine's weights are pushed from
that copy before a batch of another version, and an evaluation (the trainer's current weights)
takes the engine between two batches (``engine_for``). The rollouts' behaviour log-probs μ are
the engine's own (``RolloutBatch.sampled_logprobs``); the trainer's π_old is its current policy,
and the sampler-mismatch correction (``conspo.training.mismatch``) weighs each token by π_old/μ.

One process only (``RunConfig`` refuses a process group): a rank's generation thread would meet
the main thread's gradient all-reduce in the same group. A resumed run starts its pipeline
from the checkpoint's weights, so the k steps after a resume are sampled by fresher weights than
the uninterrupted run's (the in-flight batches are not in the checkpoint).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from conspo import stopping
from conspo.training.rollouts import Rollouts, collect_rollouts

if TYPE_CHECKING:
    from conspo.training.loop import TrainState

Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Generated:
    """One step's batch as the generating thread made it."""

    rollouts: Rollouts | None  # None: should_stop fired while it was drawn
    version: int  # the update whose weights sampled it (0: the starting weights)
    idle_s: float  # how long the generating thread waited for this step to be asked for


def snapshot(model: PreTrainedModel) -> Weights:
    """The model's trainable tensors (LoRA: the adapters), cloned: one version of the policy."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def generation_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of ``model`` to sample from: its frozen parameters and buffers are the same
    tensors as the model's (LoRA's base costs no memory twice), its trainable ones its own; no
    tensor of it asks for a gradient."""
    shared: dict[int, Any] = {id(p): p for p in model.parameters() if not p.requires_grad}
    shared |= {id(b): b for b in model.buffers()}
    twin = copy.deepcopy(model, memo=shared)
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin.eval()


class RolloutPipeline:
    """Steps' rollouts generated up to ``max_staleness`` steps ahead of the trainer (the module
    docstring). Not thread-safe: one trainer thread calls take, publish, engine_for, close."""

    def __init__(self, state: TrainState, first_step: int, max_staleness: int) -> None:
        self.state = state
        self.k = max_staleness
        self.start = first_step - 1  # the version the policy is at now
        self.last_step = state.cfg.steps
        self._lock = threading.Lock()  # the versions
        self._versions: dict[int, Weights] = {self.start: snapshot(state.model)}
        self._model = generation_copy(state.model)
        self._view = dataclasses.replace(state, model=self._model)
        self._loaded = self.start  # the version the copy holds
        self._engine_lock = threading.Lock()  # one batch or one evaluation at a time
        self._engine_holds: int | None = None  # the version the engine's weights are (vllm)
        self._closing = threading.Event()
        self._caller_check = stopping.installed()  # a cancel lands on this thread too
        self._pending: dict[int, Future[Generated]] = {}
        self._last_done: float | None = None  # when the generating thread finished its last batch
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="conspo-rollouts")

    def version_for(self, step: int) -> int:
        """The update whose weights sample step ``step``: exactly k before the trainer's."""
        return max(self.start, step - 1 - self.k)

    def take(self, step: int, should_stop: Callable[[], bool]) -> tuple[Generated, float]:
        """Step ``step``'s batch and how long the trainer waited for it; steps up to ``step`` +
        k are asked for first, so they generate while this one is trained on. Raises what the
        generation raised (``stopping.Abandoned`` on a cancel)."""
        for ahead in range(step, min(step + self.k, self.last_step) + 1):
            if ahead not in self._pending:
                self._pending[ahead] = self._thread.submit(self._generate, ahead, should_stop)
        asked = self._pending.pop(step)
        t0 = time.perf_counter()
        generated = asked.result()
        return generated, time.perf_counter() - t0

    def publish(self, version: int, model: PreTrainedModel) -> None:
        """The weights after update ``version``; versions no step still to come needs go."""
        weights = snapshot(model)
        oldest_needed = self.version_for(version + 1)
        with self._lock:
            self._versions[version] = weights
            for old in [v for v in self._versions if v < oldest_needed]:
                del self._versions[old]

    @contextmanager
    def engine_for(self, model: PreTrainedModel) -> Iterator[None]:
        """The engine holding ``model``'s weights (an evaluation of the trainer's policy),
        between two of the generating thread's batches."""
        with self._engine_lock:
            self.state.engine.sync(model)
            self._engine_holds = None  # the next batch pushes its own version
            yield

    def close(self) -> None:
        """Stop generating (a batch in flight is abandoned) and wait for the thread."""
        self._closing.set()
        for future in self._pending.values():
            future.cancel()
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    def _stopping(self) -> bool:
        caller = self._caller_check
        return self._closing.is_set() or (caller is not None and bool(caller()))

    def _generate(self, step: int, should_stop: Callable[[], bool]) -> Generated:
        begun = time.perf_counter()
        idle = 0.0 if self._last_done is None else begun - self._last_done
        version = self.version_for(step)
        with self._lock:
            weights = self._versions[version]
        if self._loaded != version:
            with torch.no_grad():
                for name, p in self._model.named_parameters():
                    if name in weights:
                        p.copy_(weights[name])
            self._loaded = version
        stop = lambda: self._closing.is_set() or should_stop()  # noqa: E731
        with stopping.abandon_when(self._stopping), self._engine_lock:
            if self._engine_holds != version:
                self.state.engine.sync(self._model)
                self._engine_holds = version
            with self.state.precision.autocast():
                rollouts = collect_rollouts(self._view, step, stop)
        self._last_done = time.perf_counter()
        return Generated(rollouts, version, idle)
