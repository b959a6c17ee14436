"""The API process never imports torch or transformers: it validates configs, serves the form,
the catalogue and the pages from torch-free modules (conspo.lazy says how objectives manage it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    from fastapi.testclient import TestClient
    from backend.config import Settings
    from backend.main import create_app
    from backend.migrate import migrate
    from backend.db import Database
    from backend.security import create_token

    data = sys.argv[1]
    url = f"sqlite:///{data}/c.db"
    migrate(url)
    settings = Settings(data_dir=data, database_url=url, broker_url=f"sqla+sqlite:///{data}/b.db")
    db = Database(settings)
    with db.session() as session:
        auth = {"Authorization": "Bearer " + create_token(session, "u")}
    with TestClient(create_app(settings)) as client:
        for path in ("/", "/runs/new", "/compare", "/api/presets", "/api/metrics/catalogue"):
            assert client.get(path).status_code == 200, path
        bad = {"config": {"params": {"tau": -1}, "task": {"params": {"digits": 0}}}}
        assert client.post("/api/runs", json=bad, headers=auth).status_code == 422
        for algorithm in ("conspo", "grpo", "dapo", "dr_grpo"):
            made = client.post("/api/runs", json={"config": {"algorithm": algorithm}}, headers=auth)
            assert made.status_code == 201, made.text
            run_id = made.json()["runs"][0]["id"]
        # what a config may make a worker read or allocate is checked without torch too
        maximal = {"prompts_per_step": 4096, "group_size": 256, "max_new_tokens": 32768}
        for refused in ({"task": {"name": "jsonl", "params": {"path": "/etc/passwd"}}},
                        {"model": {"name": "../../.."}}, {"sampling": maximal}):
            made = client.post("/api/runs", json={"config": refused}, headers=auth)
            assert made.status_code == 422, made.text
        clone = {"overrides": {"algorithm": "grpo", "task": {"name": "countdown"}}}
        assert client.post(f"/api/runs/{run_id}/clone", json=clone, headers=auth).status_code == 201
        assert client.get(f"/runs/{run_id}").status_code == 200
    loaded = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    print("LOADED", loaded)
    """
)


def test_the_api_process_never_imports_torch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout, proc.stdout
