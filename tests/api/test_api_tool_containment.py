"""Model output is hostile input: a run whose rollouts call the python tool with hostile code,
trained by a real Celery worker on PostgreSQL + Redis, ends as any other run.

SmolLM2-135M-Instruct is shown, twice in its chat, how to run a line of code it is given, then
asked to run an attack: a socket to the database, Redis and the API; the worker's environment,
its PID 1's and its data directory; a write outside the sandbox's tmpfs; a fork bomb, a memory
bomb, an infinite loop, a sleep past the timeout, 100 MB printed, a segfault, a kill of the
parent. Near-greedy, it copies most of them (not always verbatim). Whatever it writes, the run
must succeed on its first attempt (the watchdog kills a worker whose heartbeat is 3 s late), score
every rollout of the step, keep every secret out of what the rollouts show, and leave the host
unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from backend.db import Database
from backend.models import Metric, Run
from conspo import metrics as M
from conspo.models.builtins import builtin_store
from conspo.models.loading import load_pretrained
from conspo.sandbox import sandbox_available
from conspo.tools import split_turns
from tests.api.conftest import wait_for
from tests.api.test_api_worker import finished, mode_api, submit
from tests.support import REQUIRE_SERVICES, tool_demo_chat

pytestmark = [
    pytest.mark.slow,
    pytest.mark.services,
    pytest.mark.skipif(
        not REQUIRE_SERVICES and not sandbox_available(),
        reason=f"no sandbox here: {sandbox_available().reason}",
    ),
]

OUTSIDE = Path("/tmp/conspo-containment-canary")


def attacks(data_dir: Path, api_port: int) -> list[str]:
    return [
        'import socket; socket.create_connection(("127.0.0.1", 5432), timeout=2); print("db")',
        'import socket; socket.create_connection(("127.0.0.1", 6379), timeout=2); print("redis")',
        f'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:{api_port}/").read())',
        'print(open("/proc/1/environ").read())',
        "import os; print(dict(os.environ))",
        f'import os; print(os.listdir("{data_dir}"))',
        f'open("{OUTSIDE}", "w").write("written")',
        "import os\nwhile True: os.fork()",
        "x = bytearray(10**10)",
        "while True: pass",
        "import time; time.sleep(60)",
        'print("A" * 10**8)',
        "import ctypes; ctypes.string_at(0)",
        "import os, signal; os.kill(os.getppid(), signal.SIGKILL)",
    ]


RUN_DEMOS = [
    ("Run this Python code:\nprint(2 + 2)", "print(2 + 2)", "4", "The code printed 4."),
    (
        "Run this Python code:\nimport math; print(math.sqrt(16))",
        "import math; print(math.sqrt(16))",
        "4.0",
        "The code printed 4.0.",
    ),
]


def test_hostile_tool_calls_leave_the_run_the_worker_and_the_host_as_they_were(
    tmp_path: Path, request: pytest.FixtureRequest, workers, model_store: Path
) -> None:
    OUTSIDE.unlink(missing_ok=True)
    api = mode_api("cluster", tmp_path, request)  # PostgreSQL + Redis
    settings = api.settings
    _, tokenizer = load_pretrained(
        builtin_store(model_store).resolve("smollm2-135m-instruct"),
        torch.device("cpu"),
        torch.float32,
    )
    codes = attacks(settings.data_dir, 8000)
    datasets = settings.data_roots[0]
    datasets.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "prompt": tool_demo_chat(tokenizer, RUN_DEMOS, f"Run this Python code:\n{code}"),
            "answer": "0",
        }
        for code in codes * 2
    ]
    (datasets / "attacks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "algorithm": "grpo",
        "steps": 1,
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 4}},
        "task": {"name": "jsonl", "params": {"path": "attacks.jsonl"}, "eval_size": 1},
        "prompt": {"chat_template": "off"},
        "sampling": {
            "prompts_per_step": len(codes),
            "group_size": 2,
            "max_new_tokens": 48,
            "temperature": 0.05,
        },
        "tools": {"names": ["python"], "timeout_s": 2, "max_output_chars": 256},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "logging": {"rollout_sample": 2 * len(codes)},
    }
    wp = workers(settings, model_store)
    wp.start()

    def sandboxed_worker() -> bool:  # the API refuses the run until one is alive
        workers_seen = api.get("/api/health").json()["workers"]
        return any(w["capabilities"].get("sandbox") == "bwrap" for w in workers_seen)

    wait_for(sandboxed_worker, 120, "a worker with a sandbox")
    run_id = submit(api, config)
    run = finished(api, run_id, 900, wp)
    assert run["status"] == "succeeded", (run["error"], wp.tail())
    db = Database(settings)
    with db.session() as s:
        assert s.get(Run, run_id).attempt == 1  # never killed for a late heartbeat
        metrics = dict(
            s.execute(
                select(Metric.key, Metric.value).where(Metric.run_id == run_id, Metric.step == 1)
            ).all()
        )
    db.dispose()
    # Every rollout of the step was scored, and the attacks did run.
    items = api.get(f"/api/runs/{run_id}/rollouts?text=true&step=1").json()["items"]
    assert len(items) == 2 * len(codes) and all(r["reward"] is not None for r in items)
    assert metrics[M.TOOLS_CALLS] >= 0.5, metrics
    assert metrics[M.TOOLS_ERROR_RATE] + metrics[M.TOOLS_TIMEOUT_RATE] > 0, metrics
    # Nothing of the worker's reached the model, and nothing left the sandbox: what the
    # interpreter showed holds no connection made, no secret, no host path listed.
    shown = [
        seg.text for r in items for seg in split_turns(r["completion"]) if seg.kind == "observation"
    ]
    assert shown, "no rollout called the tool"
    secrets = [settings.database_url, settings.broker_url, "CONSPO_", "PYTHONPATH", "postgres"]
    for output in shown:
        lines = [line.strip() for line in output.splitlines()]
        assert "db" not in lines and "redis" not in lines, output  # no connection succeeded
        assert not any(secret in output for secret in secrets), output
        assert "worker0.log" not in output and "attacks.jsonl" not in output, output
        assert len(output) < 600, output  # 100 MB printed: the model saw at most 256 chars
    assert not OUTSIDE.exists()
    # The worker lives on and takes the next run.
    assert wp.procs and all(p.poll() is None for p in wp.procs), wp.tail()
    assert submit(api, {**config, "tools": []}) > run_id
    api.client.close()
