"""The model registry: every finished run with a checkpoint on disk, as a model.

* ``list_models(session, settings, caller)``: each model's checkpoints (last, best), its
  lineage (the runs it started from, back to a base model), what it trained (its kind's label),
  its last evaluation, its owner and whether they share it, and what the caller may do with it
  (``backend.runs.sharing``).
* ``export_model`` writes one as a plain Hugging Face directory; ``download`` is that directory
  as a tar (``ModelTar``) with its SHA-256, kept beside it in ``<dir>.tar.sha256``.

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

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import Run, User
from backend.runs import sharing
from backend.runs.rows import run_label
from backend.storage.runs import finished_worker_runs
from conspo.models.lineage import TRAINING_FILES, Which, checkpoint_for, describe, is_adapter
from conspo.models.model_tar import ModelTar, checksum


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


def model_entry(
    session: Session, settings: Settings, run: Run, caller: User | None
) -> dict[str, Any] | None:
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
        "kind": run.kind,
        "algorithm": run.algorithm,
        "label": run_label(run.kind, run.algorithm),
        "task": run.task,
        "steps": run.step,
        "checkpoints": {
            w: {"path": str(p), "lora": is_adapter(p), "step": _step_of(p)}
            for w, p in found.items()
        },
        "lineage": lineage(session, run),
        "eval": evals,
        # what "pass@k" means for this run: its eval.pass_k
        "pass_k": int(((run.config or {}).get("eval") or {}).get("pass_k") or 1),
        "pipeline_id": run.pipeline_id,
        "finished_at": run.finished_at.timestamp() if run.finished_at else None,
        "owner": run.owner.name if run.owner is not None else None,
        "model_shared": bool(run.model_shared),
        **caller_may(session, run, caller),
    }


def caller_may(session: Session, run: Run, caller: User | None) -> dict[str, bool]:
    """What ``caller`` may do with ``run``'s model: share it (its owner or an admin), start from
    it and export it (``backend.runs.sharing``: every run of its lineage usable); without a
    token, nothing."""
    if caller is None:
        return {"may_share": False, "may_start_from": False, "may_export": False}
    owns = caller.is_admin or run.owner_id == caller.id
    lineage_usable = sharing.first_refused(session, run, caller, itself=False) is None
    return {
        "may_share": owns,
        "may_start_from": sharing.may_use(run, caller) and lineage_usable,
        "may_export": owns and lineage_usable,
    }


def _step_of(path: Path) -> int | None:
    name = path.name
    return int(name.split("_", 1)[1]) if name.startswith("step_") else None


def list_models(session: Session, settings: Settings, caller: User | None) -> list[dict[str, Any]]:
    runs = finished_worker_runs(session)
    return [e for run in runs if (e := model_entry(session, settings, run, caller)) is not None]


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


def download(out: Path) -> tuple[ModelTar, str]:
    """The exported directory ``out`` as a tar of ``<name>/``, and that tar's SHA-256 (hex): read
    from ``<out>.tar.sha256`` while the directory's listing is the one it was computed for, else
    computed (one read of the whole tar) and kept there."""
    archive = ModelTar(out, out.name)
    return archive, checksum(archive, out.with_name(f"{out.name}.tar.sha256"))
