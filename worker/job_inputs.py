"""What a run needs prepared before its train function runs, from the data dir and the
database (the library reads neither): a chained run's starting checkpoint, and what its job kind
builds from other runs' stored rollouts (a DPO run's pairs).

    config, store = prepare(db, settings, config, workdir)

* ``model.from_run``: ``model.name`` becomes that run's checkpoint directory (``model.step``:
  last, best or a kept step; ``conspo.models.lineage``). A LoRA checkpoint (adapters only) is merged
  into its base once, into ``workdir/start_model`` (``conspo.models.export.export_merged``), and the
  run starts from the merged weights; its own LoRA, if any, adds fresh adapters on top. The model
  store admits that directory for this run only.
* the job kind's ``inputs`` hook (``conspo.jobs.prepare_inputs``) with the stored rollouts of
  the runs it names (DPO's ``kind_params.from_run``: its pairs, written once to the workdir).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from backend.config import Settings
from backend.db import Database
from backend.runs import inputs as run_inputs
from backend.storage.rollouts import stored_texts
from conspo.access import ModelSources
from conspo.jobs import prepare_inputs
from conspo.models.lineage import checkpoint_for, describe, is_adapter

if TYPE_CHECKING:
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore

START_MODEL = "start_model"


def prepare(
    db: Database, settings: Settings, config: RunConfig, workdir: Path
) -> tuple[RunConfig, ModelStore]:
    from conspo.models.builtins import builtin_store

    sources = run_inputs.model_sources(settings)
    if config.model.from_run is not None:
        start = start_checkpoint(settings, config, workdir)
        config = config.model_copy(
            update={"model": config.model.model_copy(update={"name": str(start)})}
        )
        assert sources.roots is not None
        sources = ModelSources((*sources.roots, start.parent), sources.hub_allow)
    prepare_inputs(config, workdir, partial(_stored_texts, db))
    return config, builtin_store(settings.model_store, sources)


def _stored_texts(db: Database, run_id: int) -> list[tuple[str, str, float | None]]:
    with db.session() as session:
        return stored_texts(session, run_id)


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
