"""A task's config is bounded before anything is built, and building it never costs the API
(issue 36): reasoning-gym generator configs fuzzed at every generator's every parameter,
held-out sizes refused at the field naming how many problems there are, and a flood of task
checks at their worst while reads and health are timed on a real server process.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, get_type_hints

import httpx
import pytest

from backend.migrate import migrate
from conspo.tasks.reasoning_gym import TASK_OWNED, _generators, generator_caps
from tests.api.conftest import ROOT, Api, make_settings, make_tokens, tiny_config, wait_for
from tests.support import free_port

pytestmark = pytest.mark.services

OVER_CAP = 10**7  # chain_sum at this many terms: a minute and a gigabyte for one question
# Values no numeric parameter takes: text, true, a list, an object (and 1.5 where an integer goes).
WRONG_TYPES: list[Any] = ["7", True, [1, 2], {"a": 1}]


def reasoning_gym(
    config: dict[str, Any], eval_size: int = 4, dataset: str = "chain_sum"
) -> dict[str, Any]:
    task = {"name": "reasoning_gym", "params": {"dataset": dataset, "config": config}}
    return tiny_config(2, task={**task, "eval_size": eval_size})


def bad_values(name: str) -> list[tuple[str, Any]]:
    """(parameter, value) pairs generator ``name`` must refuse: each numeric parameter past its
    cap on both sides and of a wrong type; every other parameter as an object it never takes."""
    _, config_cls = _generators()[name]
    hints = get_type_hints(config_cls)
    caps = generator_caps(name)
    pairs: list[tuple[str, Any]] = []
    for f in dataclasses.fields(config_cls):
        if f.name in TASK_OWNED:
            continue
        if f.name in caps:
            low, high = caps[f.name]
            pairs += [(f.name, OVER_CAP + high), (f.name, -OVER_CAP + low)]
            pairs += [(f.name, value) for value in WRONG_TYPES]
            if hints[f.name] is int:
                pairs.append((f.name, 1.5))
        else:
            pairs.append((f.name, {"nested": [1] * 3}))
    return pairs


def test_every_generator_refuses_out_of_range_and_wrong_typed_configs_at_the_field(
    api: Api,
) -> None:
    statuses: dict[int, int] = {}
    refused = 0
    names = sorted(_generators())
    for name in names:
        for key, value in bad_values(name):
            r = api.post("/api/runs", json={"config": reasoning_gym({key: value}, dataset=name)})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code == 422, (name, key, value, r.status_code, r.text[:300])
            locs = [e["loc"] for e in r.json()["detail"]]
            at = ["body", "config", "task", "params", "config", key]
            assert any(loc[: len(at)] == at for loc in locs), (name, key, value, locs)
            refused += 1
    # the anonymous estimate of the request: a report, no task built
    r = api.client.post(
        "/api/runs/estimate", json={"config": reasoning_gym({"max_terms": OVER_CAP})}
    )
    assert r.status_code == 200 and r.json()["task"] is None
    assert "max_terms" in r.json()["text"] and "capped" in r.json()["text"]
    print(f"{len(names)} generators, {refused} bad configs: statuses {statuses}")
    assert refused > 500 and set(statuses) == {422}


def test_a_config_at_the_caps_is_built_under_budget_or_refused_never_allocating_past_it(
    api: Api,
) -> None:
    """Each generator with declared caps, every capped parameter at its highest: the submit
    either refuses it (422, the generator's own check or the probe's budget) or accepts a task
    the probe built within 10 s and 1 GiB; a 5xx never."""
    from conspo.tasks.reasoning_gym import CAPS

    outcomes = {}
    for name in sorted(CAPS):
        config = {key: high for key, (_, high) in generator_caps(name).items() if key in CAPS[name]}
        if name == "gsm_symbolic":
            config = {"difficulty": 1.0}
        r = api.post("/api/runs/estimate", json={"config": reasoning_gym(config, dataset=name)})
        assert r.status_code == 200, r.text
        report, check = r.json(), r.json()["task"]
        if check is None:  # refused before anything was built (the generator's own assertion)
            assert report["text"].startswith("not a valid config yet"), (name, report)
            outcomes[name] = "refused unbuilt"
            continue
        assert check["checked"], (name, check)
        outcomes[name] = "refused" if check["refused"] else "accepted"
        if check["refused"]:
            assert check["text"].startswith(("task.params", "task.eval_size")), check
    print("at the caps:", outcomes)


def test_more_held_out_problems_than_the_task_has_is_a_422_naming_how_many(api: Api) -> None:
    # arith's 1-digit sums hold 16 distinct held-out problems; reasoning-gym's 2-term 1-digit
    # chain sums 15
    for config, count in (
        (tiny_config(2, task={"name": "arith", "eval_size": 100}), 16),
        (
            reasoning_gym({"min_terms": 2, "max_terms": 2, "max_digits": 1}, eval_size=100),
            15,
        ),
    ):
        r = api.post("/api/runs", json={"config": config})
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "config", "task", "eval_size"]
        assert f"has {count} distinct held-out problems" in error["msg"], error
        assert f"at most {count}" in error["msg"]
        # the form's estimate says so as you type (a token's caller), and not anonymously
        check = api.post("/api/runs/estimate", json={"config": config}).json()["task"]
        assert check["refused"] and check["held_out"] == count, check
        assert api.client.post("/api/runs/estimate", json={"config": config}).json()["task"] is None
        config["task"]["eval_size"] = count
        assert api.post("/api/runs", json={"config": config}).status_code == 201
    # an eval_size left at its default (64) is no ask: the run scores the 16 there are
    default = tiny_config(2, task={"name": "arith"})
    assert api.post("/api/runs", json={"config": default}).status_code == 201


def test_a_task_that_cannot_be_built_in_budget_is_refused_at_its_params(api: Api) -> None:
    # caps allow 20 terms of 18 digits; the prompt is long but drawable: accepted
    fine = reasoning_gym({"min_terms": 20, "max_terms": 20, "min_digits": 18, "max_digits": 18})
    assert api.post("/api/runs", json={"config": fine}).status_code == 201
    # the generator's own assertion, found without drawing
    r = api.post("/api/runs", json={"config": reasoning_gym({"min_terms": 5, "max_terms": 2})})
    assert r.status_code == 422 and "max_terms must be >= min_terms" in r.text


# ---------------------------------------------------------------------------------------------
# The bulkhead: task checks flooded at their worst while reads and health are timed
# ---------------------------------------------------------------------------------------------

FLOOD_CLIENTS = 24
FLOOD_S = 25.0
READS_PER_S = 50


@pytest.fixture
def server(tmp_path: Path) -> Any:
    """The API as its own process (uvicorn, SQLite): the test's clients never share its GIL."""
    db, broker = f"sqlite:///{tmp_path / 'conspo.db'}", f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    migrate(db)
    settings = make_settings(tmp_path, db, broker)
    tokens = make_tokens(settings)
    port = free_port(range(18300, 18350))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSPO_")}
    env.update(
        CONSPO_DATA_DIR=str(tmp_path),
        CONSPO_DATABASE_URL=db,
        CONSPO_BROKER_URL=broker,
        CONSPO_QUEUE=settings.queue,
        PYTHONPATH=str(ROOT),
    )
    args = ["-m", "uvicorn", "backend.main:create_app", "--factory", "--port", str(port)]
    proc = subprocess.Popen([sys.executable, *args, "--log-level", "warning"], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/api/health", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    wait_for(up, 120, "the API process")
    yield url, tokens["alice"]
    proc.terminate()
    proc.wait(timeout=15)


def test_a_flood_of_task_checks_leaves_reads_and_health_answering(server: Any) -> None:
    url, token = server
    stop = threading.Event()
    flood: dict[int, int] = {}
    reads: list[tuple[int, float]] = []
    lock = threading.Lock()

    def flooder(i: int) -> None:
        # countdown at 7 numbers: built in about a second, its held-out count runs out the
        # 10 s budget; a distinct eval_size each time, so nothing is answered from memory
        n = 0
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            while not stop.is_set():
                n += 1
                config = reasoning_gym(
                    {"min_numbers": 7, "max_numbers": 7}, eval_size=100 + 1000 * i + n,
                    dataset="countdown",
                )  # fmt: skip
                status = client.post(f"{url}/api/runs/estimate", json={"config": config})
                with lock:
                    flood[status.status_code] = flood.get(status.status_code, 0) + 1

    def reader() -> None:
        with httpx.Client(timeout=60) as client:
            k = 0
            while not stop.is_set():
                k += 1
                path = "/api/health" if k % 2 else "/api/runs?limit=20"
                started = time.monotonic()
                status = client.get(f"{url}{path}").status_code
                took = time.monotonic() - started
                with lock:
                    reads.append((status, took))
                time.sleep(max(0.0, 1 / READS_PER_S - took))

    threads = [threading.Thread(target=flooder, args=(i,)) for i in range(FLOOD_CLIENTS)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    time.sleep(FLOOD_S)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    times = sorted(took for _, took in reads)
    p95 = times[int(0.95 * (len(times) - 1))]
    print(
        f"flood: {sum(flood.values())} task checks {flood}; reads: {len(reads)},"
        f" median {statistics.median(times) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms,"
        f" max {times[-1] * 1000:.0f} ms"
    )
    assert all(status == 200 for status, _ in reads), [s for s, _ in reads if s != 200][:10]
    assert set(flood) == {200}, flood  # a busy check is said in the report, not a 5xx
    assert len(reads) >= FLOOD_S * 5  # reads kept flowing (at least 5/s on a loaded box)
