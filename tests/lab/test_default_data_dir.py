"""Chained runs under `make run`'s own defaults: `conspo-lab serve --embedded` in a fresh folder
with no ``CONSPO_*`` paths set, so the data directory is the relative ``data``.

Every other test passes absolute paths; this one is what a newcomer meets. A chained run's start
model (a pipeline's second stage, the Models page's *Train from this*) is a path under the data
directory: relative, it was joined onto the model roots, themselves relative, and named nothing
(``model.name 'data/runs/10/start_model' is not available here``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lab.test_serve import wait_for
from tests.support import ROOT, free_port, stop

PORTS = range(18400, 18500)
# tiny: a randomly initialised model the store builds in a moment; LoRA, so that starting from
# a stage's checkpoint merges its adapters into <run workdir>/start_model first.
TINY = {
    "model": {"name": "tiny", "lora": {"rank": 4}},
    "task": {"name": "arith", "eval_size": 4},
    "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
    "eval": {"every": 0, "pass_k": 1},
    "checkpoint": {"every": 0},
}


def newcomer_env() -> dict[str, str]:
    """This process's environment without any CONSPO_ setting: the platform's own defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSPO_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env["CONSPO_VLLM_PYTHON"] = "none"  # as every test: no vLLM looked for
    return env


@pytest.mark.timeout(1500)
def test_chained_runs_work_with_the_default_relative_data_dir(tmp_path: Path) -> None:
    port = free_port(PORTS)
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("ab")
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=newcomer_env(), stdout=log, stderr=subprocess.STDOUT
    )
    try:

        def health() -> dict[str, Any] | None:
            try:
                return httpx.get(f"{url}/api/health", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return None

        wait_for(health, 120, "the server")
        data = tmp_path / "data"
        assert (data / "conspo.db").is_file()  # the relative default, under the working folder
        client = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {(data / 'token').read_text().strip()}"},
            timeout=30,
        )

        def finished(run_id: int) -> dict[str, Any]:
            def done() -> dict[str, Any] | None:
                run = client.get(f"/api/runs/{run_id}").json()
                return run if run["status"] in ("succeeded", "failed", "cancelled") else None

            run: dict[str, Any] = wait_for(done, 600, f"run {run_id} to finish")
            assert run["status"] == "succeeded", run["error"]
            return run

        # a two-stage pipeline: SFT, then GRPO from the SFT stage's (LoRA) checkpoint
        sft = {**TINY, "kind": "sft", "steps": 2, "kind_params": {"batch_size": 4}}
        rl = {**TINY, "algorithm": "grpo", "steps": 1}
        made = client.post("/api/pipelines", json={"name": "sft-then-rl", "stages": [sft, rl]})
        assert made.status_code == 201, made.text
        pipeline_id = made.json()["id"]
        finished(made.json()["stages"][0]["run"]["id"])
        second = wait_for(
            lambda: client.get(f"/api/pipelines/{pipeline_id}").json()["stages"][1]["run"],
            120,
            "the second stage to be released",
        )
        finished(second["id"])

        # Train from this: a run whose model.from_run is the pipeline's last stage
        chained = client.post(
            "/api/runs",
            json={"config": {**TINY, "algorithm": "conspo", "steps": 1,
                             "model": {**TINY["model"], "from_run": second["id"]}}},
        )  # fmt: skip
        assert chained.status_code == 201, chained.text
        finished(chained.json()["runs"][0]["id"])

        # its export lands under the data directory, named absolutely
        exported = client.post(f"/api/models/{second['id']}/export", json={})
        assert exported.status_code in (200, 201), exported.text
        assert Path(exported.json()["path"]).is_absolute()
    finally:
        stop(proc, timeout=30)
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
