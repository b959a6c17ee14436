"""A live ConSPO Lab server for the client, CLI and TRL-bridge tests.

One uvicorn subprocess per test session on a free port in 18300-18399, with a fresh SQLite
database (migrated with ``conspo-lab migrate``) and an admin token from ``conspo-lab token
create``. No worker runs: submitted runs stay queued, and metrics arrive through the external-run
endpoints. Without a working backend the tests skip, unless CONSPO_REQUIRE_SERVICES=1 (CI), where
they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REQUIRE_SERVICES as REQUIRE
from tests.support import StackUnavailable, embedded_env, migrate_and_create_token, start_api, stop

PORTS = range(18300, 18400)


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


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    try:
        from backend.main import create_app  # noqa: F401
    except Exception as exc:  # not written yet, or broken
        _unavailable(f"cannot import backend.main.create_app: {exc!r}")
    data = tmp_path_factory.mktemp("lab-server")
    # test_cli_alerts' webhook receiver listens on this machine's loopback
    env = embedded_env(data, CONSPO_ALERT_ALLOW_PRIVATE="true", CONSPO_ALERT_POLL_S="0.5")
    try:
        token = migrate_and_create_token(env, "lab-tester")
        proc, url = start_api(env, data / "server.log", PORTS)
    except StackUnavailable as exc:
        _unavailable(str(exc))
    try:
        yield LabServer(url=url, token=token, data_dir=data, env=env)
    finally:
        stop(proc)


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
