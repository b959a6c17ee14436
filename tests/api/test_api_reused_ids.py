"""A run id given again after a delete starts clean (SQLite reuses the largest id once its row is
gone): the new run's first attempt never resumes the deleted run's checkpoints. Found by CI: a UI
test deleted its run, and the next test's LoRA run took its id and failed resuming a full model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import tiny_config
from tests.api.test_api_worker import finished, mode_api, submit

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_a_reused_run_id_trains_from_scratch_not_from_the_deleted_runs_files(
    tmp_path: Path, request: pytest.FixtureRequest, workers: Any, model_store: Path
) -> None:
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.start()
    first = submit(api, tiny_config(2, checkpoint_every=1))  # full fine-tuning, checkpoints kept
    assert finished(api, first, 300, wp)["status"] == "succeeded"
    assert list((api.settings.run_dir(first) / "checkpoints").iterdir())
    assert api.delete(f"/api/runs/{first}").status_code == 204

    lora = tiny_config(2, model={"name": "tiny", "lora": {"rank": 4, "alpha": 8}})
    second = submit(api, lora)
    assert second == first  # the id is given again
    run = finished(api, second, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["step"] == 2 and run["attempt"] == 1
    api.client.close()
