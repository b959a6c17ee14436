"""A live ConSPO Lab server for the client, CLI and TRL-bridge tests.

One uvicorn subprocess per test session on a free port in 18300-18399, with a fresh SQLite
database (migrated with ``conspo-lab migrate``) and an admin token from ``conspo-lab token
create``. No worker runs: submitted runs stay queued, and metrics arrive through the external-run
endpoints. Without a working backend the tests skip, unless CONSPO_REQUIRE_SERVICES=1 (CI), where
they fail.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PORTS = range(18300, 18400)
REQUIRE = os.environ.get("CONSPO_REQUIRE_SERVICES") == "1"


@dataclass
class LabServer:
    url: str
    token: str
    data_dir: Path
    env: dict[str, str]

    def client(self, **kwargs):
        from conspo_lab.client import Client

        return Client(self.url, self.token, **kwargs)


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"CONSPO_REQUIRE_SERVICES=1 but the lab server is unavailable: {reason}")
    pytest.skip(f"lab server unavailable: {reason}")


def _free_port() -> int:
    ports = list(PORTS)
    random.shuffle(ports)
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18300-18399")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conspo_lab.cli", *args],
        cwd=env["CONSPO_DATA_DIR"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _token_from(output: str) -> str | None:
    """The token printed by ``token create`` (the longest URL-safe word on its own)."""
    words = re.findall(r"[A-Za-z0-9_\-\.]{20,}", output)
    return max(words, key=len) if words else None


def _start(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    last_error = ""
    for _attempt in range(3):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "uvicorn", "backend.main:create_app", "--factory"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
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
    _unavailable(f"uvicorn did not answer /api/health:\n{last_error}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    try:
        from backend.main import create_app  # noqa: F401
    except Exception as exc:  # not written yet, or broken
        _unavailable(f"cannot import backend.main.create_app: {exc!r}")
    data = tmp_path_factory.mktemp("lab-server")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "CONSPO_DATA_DIR": str(data),
        "CONSPO_DATABASE_URL": f"sqlite:///{data / 'conspo.db'}",
        "CONSPO_BROKER_URL": f"sqla+sqlite:///{data / 'broker.db'}",
        "CONSPO_MODEL_STORE": str(data / "models"),
        "CONSPO_STREAM_POLL_S": "0.2",
        "CONSPO_STREAM_KEEPALIVE_S": "2",
    }
    for key in ("CONSPO_URL", "CONSPO_TOKEN"):
        env.pop(key, None)
    migrated = _cli(env, "migrate")
    if migrated.returncode != 0:
        _unavailable(f"conspo-lab migrate failed:\n{migrated.stdout}{migrated.stderr}")
    created = _cli(env, "token", "create", "--user", "lab-tester", "--admin")
    token = _token_from(created.stdout) if created.returncode == 0 else None
    if token is None:
        _unavailable(f"conspo-lab token create failed:\n{created.stdout}{created.stderr}")
    proc, url = _start(env, data / "server.log")
    try:
        yield LabServer(url=url, token=token, data_dir=data, env=env)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def lab(lab_server: LabServer):
    with lab_server.client() as client:
        yield client


@pytest.fixture
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CONSPO_URL/TOKEN from the environment and no data/token in the working directory."""
    for key in ("CONSPO_URL", "CONSPO_TOKEN", "CONSPO_DATA_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
