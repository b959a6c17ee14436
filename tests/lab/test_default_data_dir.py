"""Chained runs under `make run`'s own defaults: `conspo-lab serve --embedded` in a fresh folder
with no ``CONSPO_*`` paths set, so the data directory is the relative ``data``.

Every other test passes absolute paths; this one is what a newcomer meets. A chained run's start
model (a pipeline's second stage, the Models page's *Train from this*) is a path under the data
directory: relative, it was joined onto the model roots, themselves relative, and named nothing
(``model.name 'data/runs/10/start_model' is not available here``).

The same server has the example plugin installed (examples/plugins/): a user's own task and
reward train in the embedded worker with no setting and no file of ours edited.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lab.test_serve import wait_for
from tests.support import ROOT, free_port, stop

PORTS = range(18400, 18500)
EXAMPLE_PLUGIN = ROOT / "examples" / "plugins" / "conspo_example_plugin"
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


def install_example_plugin(site: Path) -> Path:
    """What ``pip install -e examples/plugins/conspo_example_plugin`` leaves for
    importlib.metadata: a dist-info declaring its ``conspo.plugins`` entry point (the package
    itself goes on the path beside it). No CONSPO_ setting names it."""
    dist = site / "conspo_example_plugin-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: conspo-example-plugin\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text("[conspo.plugins]\nexample = conspo_example_plugin\n")
    return site


@dataclass
class Newcomer:
    folder: Path
    client: httpx.Client

    def finished(self, run_id: int) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            run = self.client.get(f"/api/runs/{run_id}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run: dict[str, Any] = wait_for(done, 600, f"run {run_id} to finish")
        assert run["status"] == "succeeded", run["error"]
        return run


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Newcomer]:
    """``conspo-lab serve --embedded`` in a fresh folder, the platform's own defaults, with the
    example plugin installed (an entry point on the path, as pip leaves it)."""
    folder = tmp_path_factory.mktemp("newcomer")
    site = install_example_plugin(folder / "site-packages")
    env = newcomer_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(EXAMPLE_PLUGIN), env["PYTHONPATH"]])
    port = free_port(PORTS)
    url = f"http://127.0.0.1:{port}"
    log = (folder / "serve.log").open("ab")
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def health() -> dict[str, Any] | None:
            try:
                return httpx.get(f"{url}/api/health", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return None

        wait_for(health, 120, "the server")
        data = folder / "data"
        token = (data / "token").read_text().strip()
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as client:
            yield Newcomer(folder, client)
    finally:
        stop(proc, timeout=30)
        log.close()
    assert "Traceback" not in (folder / "serve.log").read_text()


@pytest.mark.timeout(1500)
def test_chained_runs_work_with_the_default_relative_data_dir(newcomer: Newcomer) -> None:
    client, finished = newcomer.client, newcomer.finished
    assert (newcomer.folder / "data" / "conspo.db").is_file()  # the relative default

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


@pytest.mark.timeout(900)
def test_an_installed_plugin_s_task_and_reward_train_in_the_embedded_worker(
    newcomer: Newcomer,
) -> None:
    """The example plugin, installed and named by no setting: the API and its embedded worker
    both load it (each says so in /api/health), and a run of its task and reward trains."""
    health = newcomer.client.get("/api/health").json()
    assert [p["name"] for p in health["plugins"]["loaded"]] == ["example"]
    (worker,) = health["workers"]
    assert [p["name"] for p in worker["capabilities"]["plugins"]["loaded"]] == ["example"]
    config = {
        **TINY,
        "algorithm": "conspo",
        "steps": 1,
        "task": {"name": "count_letter", "eval_size": 4, "params": {"random_words": True}},
        "rewards": [{"name": "verifier"}, {"name": "brevity", "params": {"limit": 12}}],
    }
    made = newcomer.client.post("/api/runs", json={"config": config})
    assert made.status_code == 201, made.text
    run = newcomer.finished(made.json()["runs"][0]["id"])
    keys = newcomer.client.get(f"/api/runs/{run['id']}/metrics/keys").json()["keys"]
    assert "reward/brevity" in keys
