"""Helpers shared by the test suites that start a real ConSPO Lab server in a subprocess.

Each suite keeps its own port range (so suites started side by side never collide) and decides
itself whether an unavailable stack skips or fails (``CONSPO_REQUIRE_SERVICES=1`` fails).
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
REQUIRE_SERVICES = os.environ.get("CONSPO_REQUIRE_SERVICES") == "1"
# Debian's Chromium through Playwright (its own browser downloads cannot run here), with the
# flags a headless container needs: the browser tests and the bench scripts launch it alike.
CHROMIUM = os.environ.get("CONSPO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def shared_model_store(factory: Any) -> Path:
    """The session's model store directory, one for every suite and every pytest-xdist worker
    of this run (the built-in models, tiny-arith's SFT among them, build once; ModelStore builds
    under a file lock and renames into place, so workers never see half a model)."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this run
    path = base / "shared-model-store"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_async(coro: Any) -> Any:
    """``asyncio.run(coro)`` on a thread of its own: a browser test that ran earlier in this
    process (pytest-xdist puts files of every suite on one worker) leaves Playwright's event loop
    running on the main thread, where ``asyncio.run`` refuses to start another."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class StackUnavailable(RuntimeError):
    """The server (or a step to provision it) did not come up; the message says why."""


def free_port(ports: range) -> int:
    """A port of ``ports`` nothing listens on, tried in random order."""
    candidates = list(ports)
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def closed_port_url() -> str:
    """A URL on a port nothing listens on: bound by us, then released, so no server holds it.

    A fixed port is not enough: the lab server of another test may hold it.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def embedded_env(data: Path, **extra: str) -> dict[str, str]:
    """Environment of an embedded-mode server (SQLite + SQLAlchemy broker) under ``data``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "CONSPO_DATA_DIR": str(data),
        "CONSPO_DATABASE_URL": f"sqlite:///{data / 'conspo.db'}",
        "CONSPO_BROKER_URL": f"sqla+sqlite:///{data / 'broker.db'}",
        "CONSPO_MODEL_STORE": str(data / "models"),
        "CONSPO_STREAM_POLL_S": "0.2",
        "CONSPO_STREAM_KEEPALIVE_S": "2",
        **extra,
    }
    for key in ("CONSPO_URL", "CONSPO_TOKEN"):  # ambient credentials would leak into tests
        env.pop(key, None)
    return env


def lab_cli(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``conspo-lab ARGS`` the way a user would, in the data directory."""
    return subprocess.run(
        [sys.executable, "-m", "conspo_lab.cli", *args],
        cwd=env["CONSPO_DATA_DIR"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def token_from(output: str) -> str | None:
    """The token printed by ``token create`` (the longest URL-safe word on its own)."""
    words = re.findall(r"[A-Za-z0-9_\-\.]{20,}", output)
    return max(words, key=len) if words else None


def migrate_and_create_token(env: dict[str, str], user: str) -> str:
    """``conspo-lab migrate`` then ``conspo-lab token create --user USER --admin``."""
    migrated = lab_cli(env, "migrate")
    if migrated.returncode != 0:
        raise StackUnavailable(f"conspo-lab migrate failed:\n{migrated.stdout}{migrated.stderr}")
    created = lab_cli(env, "token", "create", "--user", user, "--admin")
    token = token_from(created.stdout) if created.returncode == 0 else None
    if token is None:
        raise StackUnavailable(f"conspo-lab token create failed:\n{created.stdout}{created.stderr}")
    return token


def start_api(env: dict[str, str], log: Path, ports: range) -> tuple[subprocess.Popen[bytes], str]:
    """uvicorn serving ``backend.main:create_app`` on a free port; returns (process, base URL)."""
    last_error = ""
    for _attempt in range(3):  # a port taken between the probe and the bind: try another
        port = free_port(ports)
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "uvicorn", "backend.main:create_app", "--factory"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        last_error = log.read_text()[-2000:]
        proc.kill()
        proc.wait()
    raise StackUnavailable(f"uvicorn did not answer /api/health:\n{last_error}")


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tool_demo_chat(tokenizer: Any, demos: list[tuple[str, str, str, str]], question: str) -> str:
    """A chat prompt that shows the python tool's format before ``question``: each demo is a
    (user's question, code the assistant runs, what the interpreter printed, the assistant's
    answer) turn, written as a rollout with tools reads (``conspo.tools.base``). An instruct
    model shown this copies the format: how the tests and benches get SmolLM2 to call a tool
    without a cold start."""
    turns: list[dict[str, str]] = []
    for asked, code, printed, answer in demos:
        turns += [
            {"role": "user", "content": asked},
            {
                "role": "assistant",
                "content": f"<code>\n{code}\n</code>\n<interpreter>\n{printed}\n</interpreter>\n"
                + answer,
            },
        ]
    turns.append({"role": "user", "content": question})
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def product_demos() -> list[tuple[str, str, str, str]]:
    """Two solved products: the demos of a "What is a * b?" question."""
    return [
        (f"What is {a} * {b}?", f"print({a} * {b})", str(a * b), f"The answer is {a * b}.")
        for a, b in ((12, 34), (51, 77))
    ]


class WebhookReceiver:
    """A real HTTP server on 127.0.0.1 standing for Slack or Discord: it records each POST (path,
    JSON body, monotonic time) and answers the first ``fail`` of them with ``fail_status``, the
    rest with 200."""

    def __init__(self, fail: int = 0, fail_status: int = 500) -> None:
        import http.server
        import json
        import threading

        self.calls: list[tuple[str, Any, float]] = []
        self.fail, self.fail_status = fail, fail_status
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                receiver.calls.append((self.path, body, time.monotonic()))
                code = receiver.fail_status if len(receiver.calls) <= receiver.fail else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hooks/T000/B000/s3cr3t-key") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def wait(self, n: int, timeout: float = 120.0) -> list[tuple[str, Any, float]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.calls) < n:
            time.sleep(0.1)
        assert len(self.calls) >= n, f"{len(self.calls)} webhook calls after {timeout}s, not {n}"
        return self.calls

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
