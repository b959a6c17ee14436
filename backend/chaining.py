"""Runs that start from other runs, and the model registry built from finished runs.

* ``refuse_bad_start(config, ...)``: a 422 at ``model.from_run`` (or ``kind_params.from_run``)
  unless that run exists, has finished and (for a model) has the checkpoint ``model.step``
  names on disk, checked at submit time; the worker resolves it again (``worker.job_inputs``).
* ``list_models(session, settings)``: every finished run with a checkpoint on disk, as a model:
  its checkpoints (last, best), its lineage (the runs it started from, back to a base model) and
  its last evaluation. ``export_model`` writes one as a plain Hugging Face directory.

Torch-free: a LoRA checkpoint is merged by ``python -m conspo export`` in a subprocess, so the
API process never loads torch.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastapi.exceptions import RequestValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINISHED, Run, RunStatus
from conspo.config import RunConfig
from conspo.models.lineage import Which, checkpoint_for, describe, is_adapter, step_checkpoints

Loc = tuple[str | int, ...]
TRAINING_FILES = ("optimizer.pt", "trainer_state.pt")  # conspo.training.checkpoint.TRAINING_FILES


def start_problems(
    config: RunConfig, session: Session, settings: Settings
) -> list[tuple[Loc, str, Any]]:
    """(where, message, value) of each run a config starts from that cannot be used."""
    problems: list[tuple[Loc, str, Any]] = []
    source = config.model.from_run
    if source is not None:
        message = _unusable(session, settings, source, config.model.step)
        if message:
            problems.append((("model", "from_run"), message, source))
    pairs_from = config.kind_params.get("from_run") if config.kind == "dpo" else None
    if pairs_from is not None:
        message = _unusable(session, settings, pairs_from, None)
        if message:
            problems.append((("kind_params", "from_run"), message, pairs_from))
    return problems


def _unusable(session: Session, settings: Settings, run_id: int, which: Which | None) -> str:
    run = session.get(Run, run_id)
    if run is None:
        return f"run {run_id} does not exist"
    if run.status not in FINISHED:
        return f"run {run_id} has not finished (it is {run.status})"
    if which is not None and checkpoint_for(settings.run_dir(run_id), which) is None:
        kept = [s for s, _ in step_checkpoints(settings.run_dir(run_id))]
        return f"run {run_id} has no {describe(which)} (kept steps: {kept or 'none'})"
    return ""


def refuse_bad_start(config: RunConfig, session: Session, settings: Settings, loc: Loc) -> None:
    errors = [
        {"type": "value_error", "loc": (*loc, *where), "msg": message, "input": value}
        for where, message, value in start_problems(config, session, settings)
    ]
    if errors:
        raise RequestValidationError(errors)


# --------------------------------------------------------------------------------------------
# The model registry
# --------------------------------------------------------------------------------------------


def lineage(session: Session, run: Run) -> list[dict[str, Any]]:
    """The chain of starting points of ``run``, nearest first, ending at a base model."""
    chain: list[dict[str, Any]] = []
    seen = {run.id}
    current = run
    while True:
        model = current.config.get("model", {})
        source = model.get("from_run")
        if source is None or source in seen:
            chain.append({"base": model.get("name", current.model)})
            return chain
        seen.add(source)
        previous = session.get(Run, source)
        chain.append({"run": source, "step": model.get("step", "last"), "exists": bool(previous)})
        if previous is None:
            return chain
        current = previous


def model_entry(session: Session, settings: Settings, run: Run) -> dict[str, Any] | None:
    workdir = settings.run_dir(run.id)
    checkpoints = {w: checkpoint_for(workdir, w) for w in ("last", "best")}
    found = {w: p for w, p in checkpoints.items() if p is not None}
    if not found:
        return None
    evals = {k: v for k, v in (run.summary or {}).items() if k.startswith("eval/")}
    return {
        "run_id": run.id,
        "name": run.name,
        "status": run.status,
        "kind": run.config.get("kind", "rl"),
        "algorithm": run.algorithm,
        "task": run.task,
        "steps": run.step,
        "checkpoints": {
            w: {"path": str(p), "lora": is_adapter(p), "step": _step_of(p)}
            for w, p in found.items()
        },
        "lineage": lineage(session, run),
        "eval": evals,
        "pipeline_id": run.pipeline_id,
        "finished_at": run.finished_at.timestamp() if run.finished_at else None,
    }


def _step_of(path: Path) -> int | None:
    name = path.name
    return int(name.split("_", 1)[1]) if name.startswith("step_") else None


def list_models(session: Session, settings: Settings) -> list[dict[str, Any]]:
    runs = session.scalars(
        select(Run)
        .where(Run.status == RunStatus.succeeded, Run.external.is_(False))
        .order_by(Run.id.desc())
    )
    return [e for run in runs if (e := model_entry(session, settings, run)) is not None]


def export_model(settings: Settings, run_id: int, which: Which) -> Path:
    """Write the checkpoint as a plain Hugging Face directory under ``data_dir/exports`` (a LoRA
    checkpoint merged into its base); returns it. Done once per (run, checkpoint)."""
    found = checkpoint_for(settings.run_dir(run_id), which)
    if found is None:
        raise FileNotFoundError(f"run {run_id} has no {describe(which)}")
    out = settings.data_dir / "exports" / f"run-{run_id}-{_step_of(found) or which}"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        if is_adapter(found):
            cmd = [sys.executable, "-m", "conspo", "export", str(found), "--out", str(tmp / "m")]
            subprocess.run(cmd, check=True, capture_output=True, timeout=3600)
        else:
            shutil.copytree(found, tmp / "m", ignore=shutil.ignore_patterns(*TRAINING_FILES))
        (tmp / "m").replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
