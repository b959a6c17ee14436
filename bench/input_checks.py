"""What the input checks and the always-renderable runs cost (issue 9).

    python bench/input_checks.py [--rows 500] [--repeat 20]

1. ``json_problem`` (conspo/input_checks.py) on free-form configs: a TRL-sized one (a
   GRPOConfig as a dict, ~200 keys), the largest accepted (~1,000,000 characters), and a refused
   16 MB one (it stops at the limit, so refusing costs no more than accepting).
2. ``GET /api/runs?limit=<rows>`` on SQLite through the whole app, p50 of ``--repeat`` calls,
   as it is (``run_out`` asks pydantic's encoder whether each row renders), with every row
   walked by ``renderable`` (what a row that fails the probe costs), and without either (the
   path before issue 9).

CPU only: an SQLite file in a temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient  # noqa: E402

import backend.schemas as schemas  # noqa: E402
from backend.config import Settings  # noqa: E402
from backend.db import Database  # noqa: E402
from backend.main import create_app  # noqa: E402
from backend.migrate import migrate  # noqa: E402
from backend.models import Run, RunStatus, User  # noqa: E402
from conspo.config import RunConfig  # noqa: E402
from conspo.input_checks import MAX_JSON_CHARS, json_problem  # noqa: E402


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def trl_like_config() -> dict[str, Any]:
    config: dict[str, Any] = {f"arg_{i}": i * 0.5 for i in range(150)}
    config.update({f"name_{i}": f"value {i}" for i in range(40)})
    config.update({"lists": [[1, 2, 3]] * 10, "nested": {"a": {"b": {"c": [1.0] * 20}}}})
    return config


def bench_json_problem(repeat: int) -> None:
    trl = trl_like_config()
    largest = {f"k{i}": "x" * 990 for i in range(MAX_JSON_CHARS // 1000 - 1)}
    refused = {"x": ["y" * 1000] * 16_000}
    assert json_problem(trl) is None and json_problem(largest) is None
    assert json_problem(refused) is not None
    for label, value in [("TRL-sized", trl), ("largest accepted", largest), ("16 MB", refused)]:
        seconds = best_of(partial(json_problem, value), repeat)
        print(f"json_problem, {label:>17} config: {seconds * 1e3:8.3f} ms")


def bench_runs_list(rows: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        migrate(url)
        settings = Settings(data_dir=Path(tmp), database_url=url)
        fill(Database(settings), rows)
        with TestClient(create_app(settings)) as client:

            def list_runs() -> None:
                assert client.get("/api/runs", params={"limit": rows}).status_code == 200

            # Interleaved, so a busy machine slows the three alike.
            times: dict[str, list[float]] = {label: [] for label in PROBES}
            for _ in range(repeat):
                for label, probe in PROBES.items():
                    with replaced(schemas, "_renders", probe or schemas._renders):
                        times[label].append(timed(list_runs))
    unchecked = statistics.median(times["unchecked"])
    print(f"GET /api/runs?limit={rows} (SQLite), p50 of {repeat}:")
    for label, samples in times.items():
        seconds = statistics.median(samples)
        print(f"  {label:>10}: {seconds * 1e3:6.1f} ms ({(seconds / unchecked - 1) * 100:+.0f}%)")


PROBES: dict[str, Callable[[Any], bool] | None] = {
    "probed": None,  # as it is
    "all walked": lambda value: False,  # every row through renderable
    "unchecked": lambda value: True,  # the path before issue 9
}


@contextmanager
def replaced(module: Any, name: str, value: Any) -> Iterator[None]:
    real = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, real)


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fill(db: Database, rows: int) -> None:
    config = RunConfig().model_dump(mode="json")
    with db.session() as session:
        owner = User(name="bench")
        session.add(owner)
        session.flush()
        session.add_all(
            Run(
                name=f"run-{i}-{uuid.uuid4().hex[:6]}",
                owner_id=owner.id,
                status=RunStatus.succeeded,
                algorithm="conspo",
                task="arith",
                model="tiny",
                config=config,
                tags=["bench", f"t{i % 7}"],
                summary={f"key/{k}": 0.5 for k in range(28)},
            )
            for i in range(rows)
        )
        session.commit()
    db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    bench_json_problem(args.repeat)
    bench_runs_list(args.rows, args.repeat)


if __name__ == "__main__":
    main()
