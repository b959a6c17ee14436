"""Metric store benchmark on PostgreSQL: ingest through the worker's DB sink, compare latency.

    CONSPO_BENCH_PG=postgresql+psycopg://postgres@127.0.0.1:5432 python bench/metrics_store.py \
        [--quick] [--skip-compare] [--ingest-only] [--repeats N]

1. Ingest: ``worker.db_sink.DbSink`` exactly as a worker drives it, with the trainer's 28 metric
   keys and 64 sampled rollouts per step: once writing every step (max_points=1, the old
   behaviour), then batched (the default: one transaction per 50,000 rows or per 0.2 s, on the
   sink's writer thread: ownership check, metric and rollout bulk insert, step/summary/
   heartbeat); then the bulk path of the external logging endpoint (10,000 points per call).
   Points/s count every step until the final ``flush`` has committed it; beside it, how long
   each ``log_step`` held the training thread (backpressure is the only wait left on it), and
   the CPU seconds spent meanwhile by this process (training thread + writer thread) and by the
   PostgreSQL server processes of the bench database (from /proc: PostgreSQL on this machine).
2. Compare: ``GET /api/compare`` for 10 runs x 6 keys x 20,000 steps at max_points=1000, through
   the whole FastAPI app (query, bucketing, JSON), p50/p95 over repeated calls, plus the first
   (cold, rollup cache empty) call.

Creates a throwaway database (conspo_bench_<random>) and drops it afterwards.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.config import Settings  # noqa: E402
from backend.db import Database  # noqa: E402
from backend.migrate import migrate  # noqa: E402
from backend.models import Metric, Run, RunStatus, User, utcnow  # noqa: E402
from backend.storage.writes import StepPoints, write_points  # noqa: E402
from conspo.sink import RolloutRecord, StepRecord  # noqa: E402
from worker.db_sink import DbSink  # noqa: E402

SERVER = os.environ.get("CONSPO_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
TRAINER_KEYS = 28  # what conspo.training.trainer logs per step
TARGET_POINTS_S = 100_000  # issue 15: default sink path, flush off the training thread
TARGET_WARM_P95_MS, TARGET_COLD_MS = 100, 300
COMPARE_KEYS = ["sep/gap", "sep/pos_score", "sep/neg_score", "loss", "entropy", "eval/accuracy"]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def make_runs(db: Database, n: int, status: str) -> list[int]:
    with db.session() as s:
        user = User(name=f"bench-{uuid.uuid4().hex[:6]}", is_admin=True)
        s.add(user)
        s.flush()
        runs = [
            Run(
                name=f"bench-{i}-{uuid.uuid4().hex[:6]}",
                owner_id=user.id,
                status=status,
                algorithm="grpo",
                task="arith",
                model="tiny",
                config={},
                tags=[],
                summary={},
                attempt=1,
                heartbeat_at=utcnow(),
            )
            for i in range(n)
        ]
        s.add_all(runs)
        s.commit()
        return [r.id for r in runs]


def server_cpu_s(db: Database) -> float:
    """CPU seconds used so far by the server processes of this database (0 when /proc cannot
    see them: a server on another machine)."""
    with db.session() as s:
        pids = s.scalars(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ).all()
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def bench_sink(db: Database, steps: int, n_keys: int = TRAINER_KEYS, batched: bool = True) -> float:
    """``DbSink`` as a worker drives it: log_step per step, flush at the end (as the trainer
    does before its final checkpoint). ``batched=False``: a write per step (max_points=1).
    Returns the metric points per second."""
    (run_id,) = make_runs(db, 1, RunStatus.running)
    sink = DbSink(db, run_id, attempt=1) if batched else DbSink(db, run_id, 1, max_points=1)
    keys = [f"bench/key_{i:03d}" for i in range(n_keys)]
    records = [
        StepRecord(
            step=s,
            total_steps=steps,
            wall_time=time.time(),
            metrics={k: random.random() for k in keys},
            rollouts=[
                RolloutRecord(g, i, float(i % 2), -random.random(), 12, False)
                for g in range(8)
                for i in range(8)
            ],
        )
        for s in range(1, steps + 1)
    ]
    server0, cpu0 = server_cpu_s(db), time.process_time()
    t0 = time.perf_counter()
    blocked = []  # seconds each log_step held the training thread
    for record in records:
        c0 = time.perf_counter()
        sink.log_step(record)
        blocked.append(time.perf_counter() - c0)
    sink.flush()
    dt = time.perf_counter() - t0
    client_cpu, server_cpu = time.process_time() - cpu0, server_cpu_s(db) - server0
    with db.session() as s:
        stored = s.scalar(select(func.count()).select_from(Metric).where(Metric.run_id == run_id))
    assert stored == steps * n_keys, (stored, steps * n_keys)
    points = steps * n_keys
    rows = points + steps * 64
    how = (
        f"batched (<= {sink.max_points:,} rows or {sink.max_delay_s:g} s per batch,"
        " a writer thread)"
        if batched
        else "a write per step (a writer thread)"
    )
    target = f" (target >= {TARGET_POINTS_S:,})" if batched and n_keys == TRAINER_KEYS else ""
    print(
        f"DB sink, {how} ({n_keys} metrics + 64 rollouts per step):"
        f" {steps / dt:,.0f} steps/s, {points / dt:,.0f} metric points/s{target},"
        f" {rows / dt:,.0f} rows/s (metrics + rollouts), {dt / steps * 1000:.2f} ms/step;"
        f" training thread held per log_step: p50 {1e3 * pct(blocked, 0.5):.3f} ms,"
        f" p99 {1e3 * pct(blocked, 0.99):.2f} ms, max {1e3 * max(blocked):.1f} ms;"
        f" wall {dt:.2f} s, CPU {client_cpu:.2f} s here + {server_cpu:.2f} s PostgreSQL"
    )
    return points / dt


def bench_bulk_and_fill(db: Database, runs: int, steps: int) -> list[int]:
    """Fill the compare dataset through write_points (the /log endpoint's path)."""
    ids = make_runs(db, runs, RunStatus.succeeded)
    per_call = 10_000 // len(COMPARE_KEYS)
    t0, points = time.perf_counter(), 0
    for run_id in ids:
        walk = 0.0
        for start in range(1, steps + 1, per_call):
            batch = []
            for step in range(start, min(start + per_call, steps + 1)):
                walk += random.gauss(0, 0.01)
                batch.append(
                    StepPoints(
                        step,
                        {k: walk + i + random.gauss(0, 0.1) for i, k in enumerate(COMPARE_KEYS)},
                        1.7e9 + step,
                    )
                )
            with db.session() as s:
                points += write_points(s, run_id, batch).points
                s.commit()
    dt = time.perf_counter() - t0
    print(
        f"bulk write_points ({per_call * len(COMPARE_KEYS)} points per call, the /log path):"
        f" {points / dt:,.0f} points/s ({points:,} points in {dt:.1f} s)"
    )
    return ids


def bench_compare(settings: Settings, ids: list[int], repeats: int) -> None:
    from fastapi.testclient import TestClient

    from backend.main import create_app

    params = {"runs": ",".join(map(str, ids)), "keys": ",".join(COMPARE_KEYS), "max_points": 1000}
    with TestClient(create_app(settings)) as client:
        t0 = time.perf_counter()
        r = client.get("/api/compare", params=params)
        cold = (time.perf_counter() - t0) * 1000
        assert r.status_code == 200, r.text
        body = r.json()
        series = body["runs"][str(ids[0])]["series"][COMPARE_KEYS[0]]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = client.get("/api/compare", params=params)
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200
    print(
        f"GET /api/compare {len(ids)} runs x {len(COMPARE_KEYS)} keys x"
        f" {series['total_points']:,} steps, max_points=1000 ->"
        f" {len(series['steps'])} points/series, {len(r.content) / 1e6:.1f} MB:"
        f" cold {cold:.0f} ms (target < {TARGET_COLD_MS}); warm p50"
        f" {statistics.median(times):.0f} ms, p95 {pct(times, 0.95):.0f} ms (target <"
        f" {TARGET_WARM_P95_MS}), max {max(times):.0f} ms over {repeats} calls"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sink-steps", type=int, default=10_000)
    parser.add_argument("--skip-compare", action="store_true", help="Only the ingest figures.")
    parser.add_argument(
        "--ingest-only",
        action="store_true",
        help="Only the default batched sink (the ingest target), --repeats times (default 3),"
        " each repeat and the median printed.",
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="With --ingest-only: sink runs (default 3); otherwise compare calls (default 40).",
    )
    parser.add_argument("--keep", action="store_true", help="Keep the database.")
    parser.add_argument("--quick", action="store_true", help="1,000 sink steps, 10 x 5,000 steps")
    args = parser.parse_args()
    if args.quick:
        args.sink_steps, args.steps = 1000, 5000
        args.repeats = args.repeats or 10

    import psycopg

    admin_url = SERVER.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    name = f"conspo_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{SERVER}/{name}"
    try:
        migrate(url)
        settings = Settings(database_url=url, broker_url="memory://", data_dir=Path("/tmp"))
        db = Database(settings)
        print(f"PostgreSQL {url.rsplit('@', 1)[-1]}")
        if args.ingest_only:
            rates = [bench_sink(db, args.sink_steps) for _ in range(args.repeats or 3)]
            print(
                "ingest, metric points/s: "
                + ", ".join(f"{r:,.0f}" for r in rates)
                + f"; median {statistics.median(rates):,.0f} over {len(rates)} repeats"
            )
        else:
            bench_sink(db, max(args.sink_steps // 10, 10), batched=False)
            bench_sink(db, args.sink_steps)
            bench_sink(db, max(args.sink_steps // 10, 10), n_keys=1000)  # a wide step
        if not args.skip_compare and not args.ingest_only:
            ids = bench_bulk_and_fill(db, args.runs, args.steps)
            bench_compare(settings, ids, args.repeats or 40)
        db.dispose()
    finally:
        if not args.keep:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
