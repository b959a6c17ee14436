"""Which checkpoint of a finished run a chained run starts from, and what a model registry
lists: torch-free (the API validates ``model.from_run`` with it; the worker resolves it).

    path = checkpoint_for(run_workdir, "last")     # step_* of the last step, or None
    path = checkpoint_for(run_workdir, "best")     # checkpoints/best (eval.best_metric)
    path = checkpoint_for(run_workdir, 40)         # step_000040 if it is still kept

The layout is ``conspo.training.checkpoint``'s (``step_NNNNNN`` directories, complete once
``trainer_state.pt`` exists) and ``conspo.evaluation``'s ``checkpoints/best``. A LoRA
checkpoint holds adapters only (``adapter_config.json``): ``is_adapter`` tells the worker to merge
it into its base before a chained run loads it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

STEP_DIR = re.compile(r"^step_(\d+)$")
BEST_DIR = "best"  # conspo.evaluation.BEST_DIR
COMPLETE_MARKER = "trainer_state.pt"  # written last by conspo.training.checkpoint.save_checkpoint
ADAPTER_CONFIG = "adapter_config.json"
# What a checkpoint holds for resuming only: left out of an exported model.
TRAINING_FILES = ("optimizer.pt", COMPLETE_MARKER)

Which = Literal["best", "last"] | int


def step_checkpoints(workdir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete step checkpoint of ``workdir``, oldest first."""
    root = Path(workdir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and (path / COMPLETE_MARKER).exists():
            found.append((int(match.group(1)), path))
    return sorted(found)


def checkpoint_for(workdir: str | Path, which: Which) -> Path | None:
    """The model directory of ``which`` checkpoint of the run at ``workdir``, if it exists."""
    if which == "best":
        best = Path(workdir) / "checkpoints" / BEST_DIR
        return best if (best / "config.json").exists() or is_adapter(best) else None
    found = step_checkpoints(workdir)
    if which == "last":
        return found[-1][1] if found else None
    return next((path for step, path in found if step == which), None)


def is_adapter(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def describe(which: Which) -> str:
    return f"step {which}" if isinstance(which, int) else f"the {which} checkpoint"
