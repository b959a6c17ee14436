"""Multi-node runs through a real Celery worker and a real local Ray cluster (a head started by
the test with ``ray start --head`` on CPU: 2 CPUs, so the run's 2 Ray Train workers fit).

Cluster mode only (PostgreSQL + Redis, the deployment Ray belongs to). The same worker also
shows scheduling end to end: it holds 2 CPU processes, so a run needing 4 never reaches it and
waits with the reason shown, while the 2-node run goes through Ray.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import ROOT, TINY, tiny_config, wait_for
from tests.api.test_api_worker import assert_steps_once, finished, mode_api, run_state, submit

pytestmark = [pytest.mark.slow, pytest.mark.services]

ray = pytest.importorskip("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_head() -> Iterator[str]:
    """A Ray head on this machine, in a process group of its own (stopped by its id, never by
    ``ray stop``, which would stop every Ray cluster of this user)."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's sockets live under it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # No token authentication on this throwaway head (a real cluster keeps it: README, Cluster).
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    log = Path(temp) / "head.log"
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"]
    cmd += [f"--port={port}", "--num-cpus=2", "--num-gpus=0", f"--temp-dir={temp}"]
    cmd += ["--include-dashboard=false", "--disable-usage-stats", f"--object-store-memory={10**8}"]
    with log.open("wb") as out:
        head = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    address = f"127.0.0.1:{port}"
    try:
        wait_for(
            lambda: head.poll() is None and "Ray runtime started" in log.read_text(),
            60,
            "the Ray head",
        )
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            try:
                head.wait(timeout=5)
            except subprocess.TimeoutExpired:
                continue
        # Processes the head started outside its group (workers it spawned) end with it; the
        # session directory is ours alone.
        subprocess.run(["rm", "-rf", temp], check=False)


def test_a_two_node_run_trains_on_ray_and_cancels(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path, ray_head: str
) -> None:
    api = mode_api("cluster", tmp_path, request)
    wp = workers(api.settings, model_store)
    wp.env |= {"CONSPO_RAY_ADDRESS": ray_head, "CONSPO_WORKER_CPU_PROCESSES": "2"}
    wp.start()
    too_big = submit(
        api,
        tiny_config(1, resources={"gpus": 4}, sampling={**TINY["sampling"], "prompts_per_step": 4}),
    )
    # One Ray run (each Ray Train start costs tens of seconds here): it trains, logs every step
    # once, then is cancelled mid-run and ends as cancelled, checkpointed at the step it reached.
    run_id = submit(api, tiny_config(400, resources={"nodes": 2}))
    try:
        wait_for(lambda: run_state(api, run_id)["step"] >= 2, 240, "two steps on Ray")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {run_state(api, run_id)}\n{wp.tail()}") from None
    assert run_state(api, run_id)["ray_job_id"].endswith(f"/conspo-run-{run_id}-a1")
    assert api.post(f"/api/runs/{run_id}/cancel").json()["cancel_requested"] is True
    run = finished(api, run_id, 180, wp)
    assert run["status"] == "cancelled", f"{run['error']}\n{wp.tail()}"
    assert 2 <= run["step"] < 400 and run["attempt"] == 1
    assert_steps_once(api, run_id, run["step"])
    assert (api.settings.run_dir(run_id) / "checkpoints" / f"step_{run['step']:06d}").is_dir()
    # The run needing 4 processes never reached this worker, and says why.
    waiting = run_state(api, too_big)
    assert waiting["status"] == "queued" and waiting["attempt"] == 0
    # CPU-only workers: the run's processes are CPU processes, and it is said in those terms
    assert waiting["waiting_reason"] == (
        "needs 4 CPU processes; largest live worker has 2 CPU processes"
    )
    api.client.close()
