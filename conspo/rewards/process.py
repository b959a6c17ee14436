"""The ``process`` reward: a process signal Φ the task provides (RLVP's R = O + βΦ)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel

from conspo.registry import register_reward
from conspo.rewards.base import RewardContext, RewardParams
from conspo.tasks.base import Example, Task


class ProcessSignalTask(Task, Protocol):
    def process_reward(self, completion: str, example: Example) -> float:
        """Φ ∈ [0, 1]: how much of the way to the answer the completion went (partial credit)."""
        ...


@register_reward(
    "process",
    params=RewardParams,
    default_weight=0.2,
    task_method="process_reward",
    description="RLVP-style partial credit (designed from the abstract): the task's process"
    " signal Φ ∈ [0, 1]; with weight β the shaped reward is O + βΦ (default β 0.2). Only for a"
    " task that provides one (arith: the share of the intermediate results it writes;"
    " reasoning_gym: the generator's partial score).",
)
def process_reward(
    completion: str, example: Example, context: RewardContext, params: BaseModel
) -> float:
    task: ProcessSignalTask = context.task  # type: ignore[assignment]  # the config checked it
    phi = float(task.process_reward(completion, example))
    if not 0.0 <= phi <= 1.0:
        raise ValueError(f"task {task.name!r}: process_reward returned {phi}, outside [0, 1]")
    return phi
