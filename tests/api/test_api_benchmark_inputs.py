"""Dataset directories and benchmark files a config names are checked at submit like task data
files (backend/runs/inputs.py): inside the data roots and under the cap, else a 422 at the field."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from tests.api.conftest import Api, tiny_config

FIXTURES = Path(__file__).parents[2] / "examples" / "data" / "math"


def math_config(path: str, benchmarks: list[dict[str, Any]]) -> dict[str, Any]:
    task = {"name": "math", "params": {"path": path}, "eval_size": 4}
    return tiny_config(2, task=task, eval={"benchmarks": benchmarks})


def test_benchmarks_and_dataset_directories_are_checked_at_submit(api: Api, tmp_path: Path):
    mine = f"t-{uuid.uuid4().hex[:8]}"
    root = api.settings.data_dir / "datasets" / mine
    shutil.copytree(FIXTURES / "math_disk", root / "math_disk")
    shutil.copy(FIXTURES / "benchmark.jsonl", root / "benchmark.jsonl")
    ok = {"name": "bench", "path": f"{mine}/benchmark.jsonl", "k": 2}
    r = api.post("/api/runs", json={"config": math_config(f"{mine}/math_disk", [ok])})
    assert r.status_code == 201, r.text

    outside = {"name": "secret", "path": str(FIXTURES / "benchmark.jsonl"), "k": 2}
    missing = {"name": "missing", "path": f"{mine}/nowhere.jsonl", "k": 2}
    r = api.post("/api/runs", json={"config": math_config(str(FIXTURES / "math.parquet"),
                                                          [ok, outside, missing])})  # fmt: skip
    assert r.status_code == 422, r.text
    locs = {tuple(d["loc"]) for d in r.json()["detail"]}
    config = ("body", "config")
    assert locs == {
        (*config, "task", "params", "path"),
        (*config, "eval", "benchmarks", 1, "path"),
        (*config, "eval", "benchmarks", 2, "path"),
    }
