"""What a run needs prepared before its train function runs, from the data dir and the
database (the library reads neither): a chained run's starting checkpoint, and a DPO run's pairs
built from another run's stored rollouts.

    config, store = prepare(db, settings, config, workdir)

* ``model.from_run``: ``model.name`` becomes that run's checkpoint directory (``model.step``:
  last, best or a kept step; ``conspo.models.lineage``). A LoRA checkpoint (adapters only) is merged
  into its base once, into ``workdir/start_model`` (``conspo.models.export.export_merged``), and the
  run starts from the merged weights; its own LoRA, if any, adds fresh adapters on top. The model
  store admits that directory for this run only.
* ``kind: dpo`` with ``kind_params.from_run``: the pairs (``conspo.jobs.dpo.build_pairs``) are
  written to ``workdir/dpo_pairs.jsonl``, once: a resumed attempt reuses them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from backend import run_inputs
from backend.config import Settings
from backend.db import Database
from backend.models import Rollout, RolloutText
from conspo.access import ModelSources
from conspo.models.lineage import checkpoint_for, describe, is_adapter

if TYPE_CHECKING:
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore

START_MODEL = "start_model"


def prepare(
    db: Database, settings: Settings, config: RunConfig, workdir: Path
) -> tuple[RunConfig, ModelStore]:
    from conspo.models.store import ModelStore

    sources = run_inputs.model_sources(settings)
    if config.model.from_run is not None:
        start = start_checkpoint(settings, config, workdir)
        config = config.model_copy(
            update={"model": config.model.model_copy(update={"name": str(start)})}
        )
        assert sources.roots is not None
        sources = ModelSources((*sources.roots, start.parent), sources.hub_allow)
    if config.kind == "dpo" and config.kind_params.get("from_run") is not None:
        write_dpo_pairs(db, config, workdir)
    return config, ModelStore(settings.model_store, sources)


def start_checkpoint(settings: Settings, config: RunConfig, workdir: Path) -> Path:
    """The model directory the run starts from (a merged copy for a LoRA checkpoint)."""
    source_run = config.model.from_run
    assert source_run is not None
    found = checkpoint_for(settings.run_dir(source_run), config.model.step)
    if found is None:
        raise ValueError(
            f"model.from_run: run {source_run} has no {describe(config.model.step)} on disk"
        )
    if not is_adapter(found):
        return found
    merged = workdir / START_MODEL
    if not (merged / "config.json").is_file():
        from conspo.models.export import export_merged

        tmp = Path(tempfile.mkdtemp(prefix=f".{START_MODEL}-", dir=workdir))
        try:
            export_merged(found, None, tmp / "out")
            os.replace(tmp / "out", merged)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return merged


def write_dpo_pairs(db: Database, config: RunConfig, workdir: Path) -> None:
    from conspo.jobs.dpo import PAIRS_FILE, build_pairs, write_pairs

    path = workdir / PAIRS_FILE
    if path.is_file():  # a resumed attempt: the same pairs as before
        return
    source_run = int(config.kind_params["from_run"])
    with db.session() as session:
        rows = session.execute(
            select(RolloutText.prompt, RolloutText.completion, Rollout.reward)
            .join(
                Rollout,
                (Rollout.run_id == RolloutText.run_id)
                & (Rollout.step == RolloutText.step)
                & (Rollout.group == RolloutText.group)
                & (Rollout.index == RolloutText.index),
            )
            .where(RolloutText.run_id == source_run)
            .order_by(RolloutText.step, RolloutText.group, RolloutText.index)
        ).all()
    pairs, _ = build_pairs(
        ((p, c, (r or 0) > 0.5) for p, c, r in rows), config.kind_params["max_pairs_per_prompt"]
    )
    write_pairs(pairs, path)
