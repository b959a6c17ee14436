"""Tasks: where prompts come from and how a completion is verified.

task = make_task(cfg.task)
batch = task.train_prompts(random.Random(seed), 16)     # list[Example]
reward = task.verify("19", batch[0])                    # 1.0 or 0.0

Each task is one module of this package: a parameter model and a class registered with
``@register_task(name, params=..., description=...)`` (see arith.py). Every module here is
imported on the first registry lookup, so a new task needs no edit anywhere else.
"""

from __future__ import annotations

from conspo.access import DataFiles
from conspo.config import TaskConfig
from conspo.registry import get_task
from conspo.tasks.base import Example, Task, TaskParams, is_held_out
from conspo.tasks.jsonl import extract_answer

__all__ = ["Example", "Task", "extract_answer", "is_held_out", "make_task"]


def make_task(cfg: TaskConfig, files: DataFiles | None = None) -> Task:
    """The task ``cfg.name`` built from ``cfg.params`` (missing parameters take its defaults).

    A task that reads files (its params declare ``data_paths``) reads them through ``files``:
    by default any regular file under the default size cap; a worker passes its data roots.
    """
    registered = get_task(cfg.name)
    params = cfg.task_params()
    if isinstance(params, TaskParams) and params.data_paths:
        return registered.cls(params, files or DataFiles())
    return registered.cls(params)
