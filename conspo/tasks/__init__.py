"""Tasks: where prompts come from and how a completion is verified.

task = make_task(cfg.task)
batch = task.train_prompts(random.Random(seed), 16)     # list[Example]
reward = task.verify("19", batch[0])                    # 1.0 or 0.0
"""

from __future__ import annotations

from collections.abc import Callable

from conspo.config import TaskConfig
from conspo.tasks.arith import ArithTask
from conspo.tasks.base import Example, Task, is_held_out
from conspo.tasks.countdown import CountdownTask
from conspo.tasks.jsonl import JsonlTask, extract_answer

__all__ = ["Example", "Task", "extract_answer", "is_held_out", "make_task"]


def make_task(cfg: TaskConfig) -> Task:
    builders: dict[str, Callable[[TaskConfig], Task]] = {
        "arith": ArithTask,
        "countdown": CountdownTask,
        "jsonl": JsonlTask,
    }
    return builders[cfg.name](cfg)
