"""Property-based fuzzing of the OpenAPI schema against a live uvicorn: never a 5xx.

Bounded (a few examples per operation) so it stays in the CI budget; authenticated as an admin
so the mutating endpoints get past 401 and into validation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from backend.migrate import migrate
from tests.api.conftest import live_server, make_settings, make_tokens

PORTS = range(18150, 18200)
EXAMPLES = int(os.environ.get("CONSPO_FUZZ_EXAMPLES", "6"))  # per operation


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


def test_no_server_errors(live: tuple[str, str]) -> None:
    url, token = live
    api_schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    failures: list[str] = []
    statuses: dict[int, int] = {}
    operations = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("stream") or "/stream/" in operation.path:
            continue  # SSE streams until the run ends; test_api_metrics covers them
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=[Phase.explicit, Phase.generate],
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=20
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query} {case.body!r:.300}"
                    f" -> {response.status_code} {response.text[:300]}"
                )

        check()
    print("status codes:", dict(sorted(statuses.items())))
    assert operations >= 12
    assert not failures, "\n".join(failures)
