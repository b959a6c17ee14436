"""A worker's reaper removes the shared memory (vLLM's weights) of a trainer killed with
``kill -9``, and keeps a live one's, on every pass: database reachable or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import Settings
from backend.db import Database
from backend.runs.queue import JobQueue
from conspo.generation import shm_dirs
from tests.conspo.test_vllm_shm import WEIGHTS, Owner, owners  # noqa: F401 (a fixture)
from worker.reaper import ReaperThread

pytestmark = pytest.mark.services


@pytest.mark.parametrize("database", ["up", "down"])
def test_a_reaper_pass_removes_a_killed_trainer_s_shared_memory(
    database: str,
    own_settings: Settings,
    tmp_path: Path,
    owners: list[Owner],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(shm_dirs, "ROOT", shm)
    dead, live = Owner(shm), Owner(shm)
    owners += [dead, live]
    dead.kill_9()
    settings = own_settings
    if database == "down":
        settings = own_settings.model_copy(
            update={"database_url": f"sqlite:///{tmp_path / 'missing' / 'conspo.db'}"}
        )
    db = Database(settings)
    try:
        ReaperThread(db, JobQueue.from_settings(settings), settings).reap_once()
    finally:
        db.dispose()
    assert not dead.path.exists()
    assert (live.path / WEIGHTS).exists()
