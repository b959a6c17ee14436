"""Step → browser freshness: how long after the trainer logs a step an SSE client has it.

    python bench/freshness.py [--seconds 20] [--steps-per-s 5] [--sqlite] [--quick]
                              [--env CONSPO_NAME=value ...]   # server settings to try

The real path end to end: a uvicorn server started the way the tests start it (a throwaway
PostgreSQL database, dropped afterwards, server from CONSPO_BENCH_PG; or SQLite with
``--sqlite``), its settings at their defaults unless ``--env`` says otherwise; a run; a trainer
thread that logs the trainer's 28 metric keys plus 64 sampled rollouts per step through
``worker.db_sink.DbSink`` with its default settings, as a worker does; and one SSE client
following ``/api/runs/{id}/stream``. A step's freshness is the time from its ``log_step`` call
to the arrival of the first ``metrics`` event whose ``step_max`` covers it.

Prints p50 / p95 / max freshness over the steps of the window (target p95 < 500 ms), and the
server's CPU time over the window beside its wall time (with the machine's load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sse_load import REDIS, PgDatabase, pct, start_server  # noqa: E402

from backend.config import Settings  # noqa: E402
from backend.db import Database  # noqa: E402
from backend.models import Run, RunStatus  # noqa: E402
from conspo.sink import RolloutRecord, StepRecord  # noqa: E402
from tests.support import embedded_env, migrate_and_create_token, stop  # noqa: E402
from worker.db_sink import DbSink  # noqa: E402

KEYS = [f"bench/key_{i:02d}" for i in range(28)]  # what conspo.training.trainer logs per step
TARGET_P95_S = 0.5


def train(db: Database, run_id: int, attempt: int, rate: float, seconds: float,
          logged: dict[int, float], done: threading.Event) -> None:  # fmt: skip
    """The trainer's side: a step every 1/rate seconds through the default DbSink."""
    sink = DbSink(db, run_id, attempt)
    total = int(rate * seconds)
    start = time.monotonic()
    for step in range(1, total + 1):
        time.sleep(max(0.0, start + step / rate - time.monotonic()))
        record = StepRecord(
            step, total, time.time(), {k: random.random() for k in KEYS},
            [RolloutRecord(g, i, float(i % 2), -random.random(), 12, False)
             for g in range(8) for i in range(8)],
        )  # fmt: skip
        logged[step] = time.monotonic()
        sink.log_step(record)
    sink.flush()
    done.set()


async def follow(url: str, token: str, run_id: int, arrived: dict[int, float],
                 done: threading.Event, total: int) -> None:  # fmt: skip
    """The SSE client: the arrival time of every step, from each metrics event's step_max."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(30.0, read=None)
    path = f"/api/runs/{run_id}/stream"
    async with (
        httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout) as client,
        client.stream("GET", path) as response,
    ):
        response.raise_for_status()
        event, seen = "", 0
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "metrics":
                step_max = json.loads(line.split(":", 1)[1]).get("step_max") or 0
                now = time.monotonic()
                for step in range(seen + 1, step_max + 1):
                    arrived[step] = now
                seen = max(seen, step_max)
            if seen >= total:
                return


def measure(
    url: str, token: str, db_url: str, args: argparse.Namespace, pid: int
) -> tuple[list[float], float, float]:
    """Each step's freshness in seconds; the server's CPU seconds and the wall seconds from the
    first step logged to the last one received."""
    db = Database(Settings(database_url=db_url))
    body = {"name": "freshness", "algorithm": "grpo", "task": "arith", "model": "tiny"}
    auth = {"Authorization": f"Bearer {token}"}
    run = httpx.post(f"{url}/api/runs/external", json=body, headers=auth, timeout=30)
    run_id = run.raise_for_status().json()["id"]
    with db.session() as s:
        row = s.get(Run, run_id)
        assert row is not None and row.status == RunStatus.running
        attempt = row.attempt
    logged: dict[int, float] = {}
    arrived: dict[int, float] = {}
    done = threading.Event()
    total = int(args.steps_per_s * args.seconds)
    trainer = threading.Thread(
        target=train, args=(db, run_id, attempt, args.steps_per_s, args.seconds, logged, done)
    )

    server = psutil.Process(pid)
    window: list[float] = []

    async def both() -> None:
        follower = asyncio.create_task(follow(url, token, run_id, arrived, done, total))
        await asyncio.sleep(1.0)  # the stream is open and has sent its history (none yet)
        window.extend((sum(server.cpu_times()[:2]), time.monotonic()))
        trainer.start()
        await asyncio.wait_for(follower, args.seconds + 60)
        window[0] = sum(server.cpu_times()[:2]) - window[0]
        window[1] = time.monotonic() - window[1]

    asyncio.run(both())
    trainer.join()
    fresh = [arrived[s] - logged[s] for s in sorted(logged) if s in arrived]
    return fresh, window[0], window[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--steps-per-s", type=float, default=5.0)
    parser.add_argument("--sqlite", action="store_true", help="the embedded database instead")
    parser.add_argument("--quick", action="store_true", help="an 8-second window")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 8.0
    with tempfile.TemporaryDirectory() as tmp, PgDatabase() as pg:
        data = Path(tmp)
        db_url = f"sqlite:///{data / 'conspo.db'}" if args.sqlite else pg.url
        env = embedded_env(
            data, CONSPO_DATABASE_URL=db_url, **dict(kv.split("=", 1) for kv in args.env)
        )
        if not args.sqlite:
            env["CONSPO_BROKER_URL"] = REDIS
        for name in ("CONSPO_STREAM_POLL_S", "CONSPO_STREAM_KEEPALIVE_S"):  # the defaults
            if not any(kv.startswith(name + "=") for kv in args.env):
                env.pop(name, None)
        token = migrate_and_create_token(env, "bench")
        proc, url = start_server(env, data / "server.log", 1)
        try:
            fresh, cpu_s, wall_s = measure(url, token, db_url, args, proc.pid)
        finally:
            stop(proc)
    where = "SQLite" if args.sqlite else "PostgreSQL"
    p95 = pct(fresh, 0.95)
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"step -> SSE client freshness ({where}, {len(fresh)} steps at {args.steps_per_s:g}/s,"
          f" default sink and server settings{' + ' + ' '.join(args.env) if args.env else ''}):"
          f" p50 {1e3 * statistics.median(fresh):.0f} ms, p95 {1e3 * p95:.0f} ms,"
          f" max {1e3 * max(fresh):.0f} ms (target p95 < {1e3 * TARGET_P95_S:.0f} ms);"
          f" server CPU {cpu_s:.1f} s in {wall_s:.1f} s wall ({cpu_s / wall_s:.0%} of a core),"
          f" load {load} on {os.cpu_count()} CPUs")  # fmt: skip


if __name__ == "__main__":
    main()
