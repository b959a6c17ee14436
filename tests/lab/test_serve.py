"""`conspo-lab serve --embedded --demo`, the command behind `make run`, end to end.

A real server process with its embedded Celery worker on SQLite (no services): it migrates, writes
the local token, queues the GRPO-vs-ConSPO demo study on an empty database and starts training it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import embedded_env, free_port, shared_model_store, stop

PORTS = range(18300, 18400)


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def workers_in(folder: Path) -> list[int]:
    """Pids of `conspo-lab worker` processes started in ``folder``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"worker" in cmdline and os.readlink(entry / "cwd") == str(folder):
                pids.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return pids


def test_embedded_serve_queues_the_demo_and_trains_it(tmp_path, tmp_path_factory):  # type: ignore[no-untyped-def]
    # The session's model store: tiny-arith's SFT warm start (minutes on a loaded machine) is
    # built once for every suite; the demo's training, not the build, is what this test is for.
    env = embedded_env(tmp_path, CONSPO_MODEL_STORE=str(shared_model_store(tmp_path_factory)))
    port = free_port(PORTS)
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("ab")
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded", "--demo"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:

        def runs() -> list[dict] | None:
            try:
                return httpx.get(f"{url}/api/runs", params={"sort": "id"}, timeout=5).json()[
                    "items"
                ]
            except httpx.HTTPError:
                return None

        # the demo is a study: 3 arms × 5 seeds, two runs at a time, the rest pending in it
        demo = wait_for(lambda: (r := runs()) and len(r) == 2 and r, 120, "the demo runs")
        study = httpx.get(f"{url}/api/studies/1?curves=false", timeout=5).json()
        assert [a["name"] for a in study["arms"]] == ["grpo", "conspo", "conspo-linear"]
        assert len(study["runs"]) == 15 and study["concurrency"] == 2
        assert sorted(r["algorithm"] for r in demo) == ["conspo", "grpo"]
        assert all("demo" in r["tags"] and r["total_steps"] == 300 for r in demo)
        assert {r["group_id"] for r in demo} == {"study-1"}  # the runs page links the study
        token = (tmp_path / "token").read_text().strip()
        assert token and token in httpx.get(f"{url}/", timeout=5).text  # injected for the UI
        assert httpx.get(f"{url}/api/health", timeout=5).json()["mode"] == "embedded"

        # The embedded worker picks the first run up and its curves start growing. It may first
        # build tiny-arith (an SFT warm start, ~20 s on an idle machine) if no test has yet: the
        # limit is for a loaded one (CI beside other jobs took over 240 s).
        first = demo[0]["id"]
        wait_for(
            lambda: httpx.get(f"{url}/api/runs/{first}", timeout=5).json()["step"] >= 2,
            600,
            "the first demo run to log steps",
        )
        keys = httpx.get(f"{url}/api/runs/{first}/metrics/keys", timeout=5).json()["keys"]
        assert "sep/gap" in keys and "batch/pass_rate" in keys
        assert workers_in(tmp_path)  # the embedded worker runs beside the API
    finally:
        stop(proc, timeout=30)
        log.close()
    assert "ConSPO Lab (embedded mode) on http://" in (tmp_path / "serve.log").read_text()
    # Stopping the server stops its worker too (a warm shutdown, then a kill after 10 s).
    leftovers = workers_in(tmp_path)
    for pid in leftovers:
        os.kill(pid, 9)
    assert not leftovers


def test_embedded_serve_restarts_a_dead_worker_and_guards_its_token(tmp_path):  # type: ignore[no-untyped-def]
    """The worker beside the API comes back after a kill (logged); the page token is injected
    only when the page is asked for by a loopback name, not by a DNS-rebinding one."""
    env = embedded_env(tmp_path)
    port = free_port(PORTS)
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    log = log_path.open("ab")
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def page(host: str) -> str | None:
            try:
                return httpx.get(f"{url}/", headers={"Host": host}, timeout=5).text
            except httpx.HTTPError:
                return None

        wait_for(lambda: page("127.0.0.1"), 120, "the server")
        token = (tmp_path / "token").read_text().strip()
        for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "[::1]"):
            assert token in (page(host) or ""), host
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "[::2]"):
            served = page(host) or ""
            assert "CONSPO_TOKEN = null" in served and token not in served, host

        (first,) = wait_for(lambda: workers_in(tmp_path), 120, "the embedded worker")
        os.kill(first, 9)
        restarted = wait_for(
            lambda: [p for p in workers_in(tmp_path) if p != first], 120, "a new worker"
        )
        assert len(restarted) == 1
        assert "embedded worker" in log_path.read_text() and "restarting" in log_path.read_text()
    finally:
        stop(proc, timeout=30)
        log.close()
    leftovers = workers_in(tmp_path)
    for pid in leftovers:
        os.kill(pid, 9)
    assert not leftovers  # the restarted worker stops with the server too


def test_serve_runs_several_api_processes(tmp_path):  # type: ignore[no-untyped-def]
    """`serve --workers 2`: one process is GIL-bound to about a core, so heavy reads need more."""
    import psutil

    env = embedded_env(tmp_path)
    port = free_port(PORTS)
    log = (tmp_path / "serve.log").open("ab")
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--workers", "2", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def api_processes() -> list[psutil.Process]:
            children = psutil.Process(proc.pid).children(recursive=True)
            return [c for c in children if "spawn_main" in " ".join(c.cmdline())]

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=5).is_success
            except httpx.HTTPError:
                return False

        wait_for(lambda: healthy() and len(api_processes()) == 2, 120, "two API processes")
    finally:
        stop(proc, timeout=30)
        log.close()
