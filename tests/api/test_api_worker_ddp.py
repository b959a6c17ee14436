"""A data-parallel run (``resources.gpus: 2``) through a real worker: on a CPU worker the two
ranks are gloo processes, rank 0 the worker itself (``conspo.launch.local.launch_local``).

The worker is killed with SIGKILL alone (not its process group): rank 1 must die with it
(``PR_SET_PDEATHSIG``) instead of waiting in a collective, and a new worker must resume the run
from rank 0's checkpoint with every step stored exactly once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import tiny_config, wait_for
from tests.api.test_api_worker import assert_steps_once, finished, mode_api, run_state, submit

pytestmark = [pytest.mark.slow, pytest.mark.services]


def rank_children(pid: int) -> set[int]:
    """The processes ``pid`` started as ``conspo.distributed.collectives`` ranks."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if int(ppid) == pid and b"conspo.launch.local" in cmdline:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_two_process_run_resumes_after_kill9_and_leaves_no_orphan(
    tmp_path: Path, request: pytest.FixtureRequest, workers: Any, model_store: Path
) -> None:
    api = mode_api("embedded", tmp_path, request)
    wp = workers(api.settings, model_store)
    first = wp.start()
    n = 60  # long enough that the kill lands mid-run even on a loaded box
    run_id = submit(api, tiny_config(n, checkpoint_every=3, resources={"gpus": 2}))
    wait_for(lambda: run_state(api, run_id)["step"] >= 4, 300, "a step after a checkpoint")
    children = wait_for(lambda: rank_children(first.pid), 120, "rank 1 running")
    os.kill(first.pid, signal.SIGKILL)  # the worker alone, not its process group
    first.wait(timeout=10)
    wait_for(lambda: not any(alive(c) for c in children), 120, "rank 1 gone with its parent")
    at_kill = run_state(api, run_id)
    assert at_kill["status"] == "running" and at_kill["step"] < n
    wp.start()
    run = finished(api, run_id, 300, wp)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 2 and run["step"] == n
    assert_steps_once(api, run_id, n)
    api.client.close()
