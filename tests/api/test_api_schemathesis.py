"""The OpenAPI document is the API's contract: schemathesis, with every check, against a live
uvicorn on SQLite and on PostgreSQL, finds no request the API answers otherwise than the document
says (an undocumented status or content type, a body off its schema, a schema-valid request
refused or a schema-violating one accepted, a token required but not asked for, a 5xx).

tests/api/schemathesis.toml holds the configuration and the few exclusions, each with why;
tests/api/contract_hooks.py the outcomes no document can state. Bounded for CI: each operation
gets CONSPO_FUZZ_EXAMPLES generated cases per phase (coverage, fuzzing, stateful) besides the
coverage phase's boundary cases, drawn from CONSPO_FUZZ_SEED (a fixed seed: the same cases each
run; set another to look further). It runs the schemathesis CLI, so a failure prints each
failing request as a curl command. tests/api/test_api_contract.py replays, as plain requests,
the cases it found before the document was fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.migrate import migrate
from tests.api.conftest import ROOT, live_server, make_settings, make_tokens

pytestmark = pytest.mark.slow  # minutes of fuzzing per database

PORTS = range(18150, 18200)
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = os.environ.get("CONSPO_FUZZ_EXAMPLES", "10")  # CI time: set 100+ for a deeper run
SEED = os.environ.get("CONSPO_FUZZ_SEED", "1")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    if request.param == "sqlite":
        db, broker = f"sqlite:///{tmp / 'conspo.db'}", f"sqla+sqlite:///{tmp / 'broker.db'}"
        migrate(db)
    else:  # the session's migrated database and Redis
        db, broker = request.getfixturevalue("pg_url"), request.getfixturevalue("redis_url")
    s = make_settings(tmp, db, broker, stream_poll_s=0.2)
    token = make_tokens(s)["root"]
    with live_server(s, PORTS) as url:
        yield url, token


def test_the_api_does_what_its_openapi_document_says(live: tuple[str, str], tmp_path: Path) -> None:
    url, token = live
    report = tmp_path / "schemathesis.json"
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(CONFIG)),
        *("run", f"{url}/openapi.json", "--max-examples", EXAMPLES, "--seed", SEED),
        *("--report", "json", "--report-json-path", str(report)),
    ]
    env = {**os.environ, "CONSPO_FUZZ_TOKEN": token}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    assert report.is_file(), done.stdout[-5000:] + done.stderr[-5000:]
    result = json.loads(report.read_text())
    cases, operations = result["test_cases"], result["operations"]
    print(f"schemathesis: {cases['generated']} cases, {operations['tested']} operations,"
          f" {result['running_time']:.0f} s")  # fmt: skip
    assert done.returncode == 0 and not result["failures"], done.stdout[-30_000:]
    assert operations["tested"] >= 30 and not operations["errored"], operations
    assert cases["generated"] >= 1000 and not cases["errored"], cases
