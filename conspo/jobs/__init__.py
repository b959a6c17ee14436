"""Job kinds: what a run trains (``config.kind``), each one module here with its parameter model
and one registration (``conspo.registry.register_job_kind``, with the example kind_params the
registry-wide test trains it from), found by the registry on first lookup like the objectives;
``base`` holds what several kinds' parameters share (a local dataset).

* ``rl``: the RLVR trainer (``conspo.training.trainer.train``) with the configured objective.
* ``sft``: supervised fine-tuning on reference answers (``conspo.jobs.sft``).
* ``distill``: on-policy distillation from a teacher, per-token reverse KL
  (``conspo.jobs.distill``).
* ``dpo``: direct preference optimisation on (chosen, rejected) pairs (``conspo.jobs.dpo``).
* ``kto``: Kahneman–Tversky optimisation on single completions labelled desirable or not
  (``conspo.jobs.kto``).

Every kind's train function has ``conspo.training.trainer.train``'s signature, so the worker, the
CLI and the tests call ``train_job(config, ...)`` whatever the kind, and ``prepare_inputs`` before
it (a kind's ``inputs`` hook: DPO's pairs, KTO's labelled examples, from another run's
rollouts). The modules stay torch-free at import (the API validates ``kind_params`` against their
models); the non-RL kinds share ``conspo.training.loop`` (setup, resume, checkpoints, the
held-out eval, cancellation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conspo.config import RunConfig
    from conspo.training.loop import TrainResult

# rollouts_of(run_id): a finished run's stored (prompt, completion, reward), in step order
RolloutsOf = Callable[[int], Iterable[tuple[str, str, float | None]]]


def train_job(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    """Train ``config`` with its kind's train function (same arguments as
    conspo.training.trainer.train)."""
    from conspo.registry import get_job_kind

    result: TrainResult = get_job_kind(config.kind).fn(config, *args, **kwargs)
    return result


def prepare_inputs(config: RunConfig, workdir: Path, rollouts_of: RolloutsOf) -> None:
    """Write the files ``config``'s kind builds from other runs (its ``inputs`` hook), if any:
    whoever launches the job supplies the stored rollouts (the worker reads the database)."""
    from conspo.registry import get_job_kind

    hook = get_job_kind(config.kind).inputs
    if hook is not None:
        hook(config, workdir, rollouts_of)
