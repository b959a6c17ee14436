"""Live streams under load: many SSE clients plus a steady rate of reads on a real server.

    python bench/sse_load.py [--streams 500] [--rps 50] [--seconds 60] [--quiet-seconds 20]
                             [--runs 10] [--quick] [--env CONSPO_NAME=value ...]
                             # --env: server settings to try; --quick: 20 s + 10 s windows

Cluster mode, as deployed: a throwaway PostgreSQL database (conspo_bench_<random>, dropped
afterwards; server from CONSPO_BENCH_PG, default postgresql+psycopg://postgres@127.0.0.1:5432),
Redis as the broker (CONSPO_BENCH_REDIS, default redis://127.0.0.1:6379/3) and one uvicorn
process started the way the tests start it. ``--runs`` external runs each log a step of the
trainer's 28 keys every second while ``--streams`` SSE clients follow them (one in ten follows
``/api/stream/runs`` instead) and reads arrive open-loop at ``--rps`` (a third each: a run's
series of 6 keys, a 5-run compare, the runs list), each on a fresh schedule so a slow answer
does not lower the offered load. The per-caller stream bound is raised: every client here
comes from 127.0.0.1.

Prints the 5xx count (target 0), read latency p50/p95/p99 (target p95 < 250 ms), the SSE
events received, the server's CPU time beside the wall time, and the load generator's own CPU
time (it shares the machine: on a small box it competes with the server).

Two windows, so the streams' own cost shows apart from the reads': first ``--quiet-seconds``
with the streams open and the runs logging but no reads, then ``--seconds`` with the reads
too. For each: the server's CPU per second (and per stream), and the SQL statements it sent per
second, split into those of the live streams and the rest (the server runs under
``bench/counted_server.py``, which counts them; with ``--workers`` > 1 they are not counted).
The server runs with its default settings (stream poll period included) unless ``--env``
says otherwise.

Where the time goes (one process, Linux): for each window, the server's threads' time on a CPU
beside their time runnable but waiting for one (``/proc/PID/task/*/schedstat``), the same for
the database's backends serving it, and the event loop's lag; for the requests of the loaded
window (reads; the runs' logging apart), their time in the server split into its waits
(``bench/counted_server.py``'s ``ReadTrace``: session slot, thread queue, thread CPU, database
round trips, GIL/CPU waits in threads, event loop), on average and over the slowest 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from counted_server import read_counts, read_traces  # noqa: E402

from tests.support import (  # noqa: E402
    ROOT,
    StackUnavailable,
    embedded_env,
    free_port,
    migrate_and_create_token,
    stop,
)

PG_SERVER = os.environ.get("CONSPO_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS = os.environ.get("CONSPO_BENCH_REDIS", "redis://127.0.0.1:6379/3")
PORTS = range(18700, 18800)
KEYS = [f"bench/key_{i:02d}" for i in range(28)]  # what conspo.training.trainer logs per step
READ_KEYS = ",".join(KEYS[:6])
EVENT_NAME = re.compile(rb"(?m)^event: ?(\w+)")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


@dataclass
class Tally:
    read_ms: list[float] = field(default_factory=list)
    read_ms_by_kind: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)  # "read 200", "stream 503", ...
    errors: Counter[str] = field(default_factory=Counter)  # transport errors by kind
    events: Counter[str] = field(default_factory=Counter)  # SSE events by name
    streams_open: int = 0

    def server_errors(self) -> int:
        return sum(n for k, n in self.statuses.items() if k.split()[-1].startswith("5"))


@dataclass
class Window:
    """What one measured window cost and delivered."""

    wall_s: float
    server_cpu_s: float
    client_cpu_s: float
    events: int
    stream_statements: int | None  # SQL statements of the live streams (None: not counted)
    other_statements: int | None
    peak_connections: int
    peak_idle_in_transaction: int
    sched: dict[str, float]  # on-CPU and runnable-waiting seconds (see Scheduled)
    started_at: float  # wall clock


class Meter:
    """Starts a window: the server's CPU and statements, the client's CPU, the events so far."""

    def __init__(
        self, server: ServerCpu, counts: Path | None, tally: Tally, scheduled: Scheduled
    ) -> None:
        self._server, self._counts, self._tally = server, counts, tally
        self._scheduled = scheduled
        self._me = psutil.Process()
        self._start = self._now()

    def _now(self) -> tuple[float, float, float, int, dict[str, int] | None, dict[str, float]]:
        counts = read_counts(self._counts) if self._counts else None
        events = sum(self._tally.events.values())
        mine = sum(self._me.cpu_times()[:2])
        sched = self._scheduled.seconds()
        return time.time(), self._server.seconds(), mine, events, counts, sched

    def window(self, peaks: tuple[int, int]) -> Window:
        (wall0, cpu0, mine0, events0, counts0, sched0), (wall, cpu, mine, events, counts, sched) = (
            self._start,
            self._now(),
        )
        stream = other = None
        if counts is not None and counts0 is not None:
            stream = counts["stream"] - counts0["stream"]
            other = counts["other"] - counts0["other"]
        spent = {k: sched[k] - sched0.get(k, 0.0) for k in sched}
        return Window(
            wall - wall0, cpu - cpu0, mine - mine0, events - events0, stream, other, *peaks,
            spent, wall0,
        )  # fmt: skip


class Scheduled:
    """Seconds on a CPU and runnable but waiting for one (Linux schedstat), so far: of the
    server's threads (``server_*``), its event loop's thread (``loop_*``) and the database
    backends serving it (``db_*``, those connected now: the pool keeps them)."""

    def __init__(self, pid: int, pg: PgDatabase) -> None:
        self._pid, self._pg = pid, pg
        self._db_seen: dict[int, tuple[float, float]] = {}

    @staticmethod
    def _read(path: str) -> tuple[float, float]:
        try:
            run_ns, wait_ns, _ = Path(path).read_text().split()
        except (OSError, ValueError):
            return 0.0, 0.0
        return int(run_ns) / 1e9, int(wait_ns) / 1e9

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(("server_run", "server_wait", "loop_run", "loop_wait"), 0.0)
        for task in Path(f"/proc/{self._pid}/task").glob("*"):
            run, wait = self._read(f"{task}/schedstat")
            out["server_run"] += run
            out["server_wait"] += wait
            if task.name == str(self._pid):
                out["loop_run"], out["loop_wait"] = run, wait
        for backend in self._pg.backend_pids():  # a backend gone keeps its last reading
            self._db_seen[backend] = self._read(f"/proc/{backend}/schedstat")
        out["db_run"] = sum(run for run, _ in self._db_seen.values())
        out["db_wait"] = sum(wait for _, wait in self._db_seen.values())
        return out


class PgDatabase:
    """A throwaway database on the bench's PostgreSQL server."""

    def __init__(self) -> None:
        self.name = f"conspo_bench_{uuid.uuid4().hex[:10]}"
        self.url = f"{PG_SERVER}/{self.name}"
        self._admin = PG_SERVER.replace("postgresql+psycopg://", "postgresql://") + "/postgres"

    def __enter__(self) -> PgDatabase:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *_: object) -> None:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connections(self) -> tuple[int, int]:
        """(connections to this database, of which idle in a transaction)."""
        with psycopg.connect(self._admin, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%%')"
                " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            ).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def backend_pids(self) -> list[int]:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            ).fetchall()
        return [row[0] for row in rows]


async def follow(client: httpx.AsyncClient, path: str, tally: Tally, stop: asyncio.Event) -> None:
    """One SSE client: counts the events it receives until ``stop``."""
    try:
        async with client.stream("GET", path) as response:
            tally.statuses[f"stream {response.status_code}"] += 1
            if response.status_code != 200:
                return
            tally.streams_open += 1
            async for chunk in response.aiter_raw():  # no line splitting: the client is cheap
                for name in EVENT_NAME.findall(chunk):
                    tally.events[name.decode()] += 1
                if stop.is_set():
                    return
    except httpx.HTTPError as exc:
        tally.errors[f"stream {type(exc).__name__}"] += 1


async def read_once(client: httpx.AsyncClient, runs: list[int], tally: Tally) -> None:
    kind = random.choice(("series", "compare", "list"))
    if kind == "series":
        path, params = f"/api/runs/{random.choice(runs)}/metrics", {"keys": READ_KEYS}
    elif kind == "compare":
        ids = ",".join(map(str, random.sample(runs, min(5, len(runs)))))
        path, params = "/api/compare", {"runs": ids, "keys": READ_KEYS}
    else:
        path, params = "/api/runs", {"limit": "50"}
    started = time.perf_counter()
    try:
        response = await client.get(path, params=params)
    except httpx.HTTPError as exc:
        tally.errors[f"read {type(exc).__name__}"] += 1
        return
    took_ms = (time.perf_counter() - started) * 1000
    tally.read_ms.append(took_ms)
    tally.read_ms_by_kind.setdefault(kind, []).append(took_ms)
    tally.statuses[f"read {response.status_code}"] += 1


async def offer_reads(
    client: httpx.AsyncClient, runs: list[int], rps: float, seconds: float, tally: Tally
) -> None:
    """Open loop: a read every 1/rps seconds whether or not the earlier ones answered."""
    tasks = []
    start = time.perf_counter()
    for i in range(int(rps * seconds)):
        await asyncio.sleep(max(0.0, start + i / rps - time.perf_counter()))
        tasks.append(asyncio.create_task(read_once(client, runs, tally)))
    await asyncio.sleep(max(0.0, start + seconds - time.perf_counter()))
    await asyncio.gather(*tasks)


async def log_steps(
    client: httpx.AsyncClient, runs: list[int], stop: asyncio.Event, tally: Tally
) -> None:
    """Every run logs one step of all KEYS a second (a trainer's pace on a small model)."""
    step = 100
    while not stop.is_set():
        step += 1
        body = {"steps": [{"step": step, "metrics": {k: random.random() for k in KEYS}}]}
        results = await asyncio.gather(
            *(client.post(f"/api/runs/{r}/log", json=body) for r in runs), return_exceptions=True
        )
        for result in results:
            if isinstance(result, httpx.Response):
                tally.statuses[f"log {result.status_code}"] += 1
            else:
                tally.errors[f"log {type(result).__name__}"] += 1
        await asyncio.sleep(1.0)


async def make_runs(client: httpx.AsyncClient, n: int) -> list[int]:
    runs = []
    for i in range(n):
        body = {"name": f"bench-{i}", "algorithm": "grpo", "task": "arith", "model": "tiny"}
        run = (await client.post("/api/runs/external", json=body)).raise_for_status().json()
        history = [{"step": s, "metrics": {k: random.random() for k in KEYS}} for s in range(100)]
        await client.post(f"/api/runs/{run['id']}/log", json={"steps": history})
        runs.append(run["id"])
    return runs


async def load(
    url: str, token: str, args: argparse.Namespace, pg: PgDatabase, pid: int, counts: Path | None
) -> None:
    tally = Tally()
    auth = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(30.0, read=None)
    limits = httpx.Limits(max_connections=args.streams + 50, max_keepalive_connections=None)
    async with (
        httpx.AsyncClient(base_url=url, headers=auth, timeout=30.0) as api,
        httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as streams_client,
        httpx.AsyncClient(
            base_url=url, timeout=30.0, limits=httpx.Limits(max_connections=200)
        ) as reader,
    ):
        runs = await make_runs(api, args.runs)
        stop_event = asyncio.Event()
        followers = []
        for i in range(args.streams):  # ramp up: 100 new connections a second
            path = "/api/stream/runs" if i % 10 == 9 else f"/api/runs/{runs[i % len(runs)]}/stream"
            followers.append(asyncio.create_task(follow(streams_client, path, tally, stop_event)))
            if i % 10 == 9:
                await asyncio.sleep(0.1)
        answered = time.monotonic() + 60
        while sum(tally.statuses.values()) < args.streams and time.monotonic() < answered:
            await asyncio.sleep(0.2)
        logger = asyncio.create_task(log_steps(api, runs, stop_event, tally))
        await asyncio.sleep(2.0)  # the histories are sent; the streams follow the logging
        server = ServerCpu(pid)
        scheduled = Scheduled(pid, pg)
        quiet = Meter(server, counts, tally, scheduled)
        peaks = await asyncio.to_thread(sample_connections, pg, args.quiet_seconds)
        quiet_window = quiet.window(peaks)
        loaded = Meter(server, counts, tally, scheduled)
        sampler = asyncio.create_task(asyncio.to_thread(sample_connections, pg, args.seconds))
        await offer_reads(reader, runs, args.rps, args.seconds, tally)
        loaded_window = loaded.window(await sampler)
        stop_event.set()
        logger.cancel()
        for task in followers:
            task.cancel()
        await asyncio.gather(logger, *followers, return_exceptions=True)
        recovery = await time_to_recover(reader)
    report(args, tally, quiet_window, loaded_window)
    if counts is not None:
        await asyncio.sleep(0.5)  # the server's last traces written
        start = loaded_window.started_at
        report_traces(*read_traces(counts, start, start + loaded_window.wall_s))
    print(f"  after the load stopped, the runs list answered 200 {recovery}")


async def time_to_recover(client: httpx.AsyncClient, give_up_s: float = 300.0) -> str:
    """How long after the load the API answers a plain read again."""
    started = time.perf_counter()
    while (waited := time.perf_counter() - started) < give_up_s:
        try:
            response = await client.get("/api/runs", params={"limit": "50"}, timeout=10.0)
            if response.status_code == 200:
                return f"after {1000 * (time.perf_counter() - started):.0f} ms"
        except httpx.HTTPError:
            pass
        await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - started - waited)))
    return f"never within {give_up_s:.0f} s"


class ServerCpu:
    """CPU seconds of the server: the uvicorn process and its worker processes, if any."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self._procs = [self._root, *self._root.children(recursive=True)]

    def seconds(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in self._procs if p.is_running())


def start_server(
    env: dict[str, str], log: Path, workers: int, counts: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """uvicorn serving the app (``--workers`` processes) on a free port, once it answers;
    under ``bench/counted_server.py`` (its statements counted into ``counts``) if given."""
    url = f"http://127.0.0.1:{(port := free_port(PORTS))}"
    cmd = [sys.executable, "-m", "uvicorn", "backend.main:create_app", "--factory"]
    if counts is not None:
        cmd[1:3] = [str(Path(__file__).with_name("counted_server.py")), str(counts)]
    cmd += ["--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        spawned = len(psutil.Process(proc.pid).children()) >= workers or workers == 1
        try:
            if spawned and httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise StackUnavailable(f"uvicorn did not answer /api/health:\n{log.read_text()[-2000:]}")


def sample_connections(pg: PgDatabase, seconds: float) -> tuple[int, int]:
    """The most connections (and idle-in-transaction ones) seen over the window."""
    peak = peak_idle = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n, idle = pg.connections()
        peak, peak_idle = max(peak, n), max(peak_idle, idle)
        time.sleep(2.0)
    return peak, peak_idle


def report(args: argparse.Namespace, tally: Tally, quiet: Window, w: Window) -> None:
    reads, wall = tally.read_ms, w.wall_s
    print(f"\n{args.streams} SSE clients, {args.rps:g} reads/s offered, {args.runs} runs logging")
    print(f"  streams open: {tally.streams_open}/{args.streams}; load {load_average()}")
    print(f"  5xx responses: {tally.server_errors()}  (target 0)")
    print(f"  responses by kind and status: {dict(sorted(tally.statuses.items()))}")
    print(f"  transport errors: {dict(tally.errors) or 'none'}")
    print(
        f"  reads: {len(reads)} answered ({len(reads) / wall:.1f}/s); latency ms "
        f"p50 {pct(reads, 0.5):.0f}  p95 {pct(reads, 0.95):.0f}  p99 {pct(reads, 0.99):.0f}  "
        f"max {max(reads, default=float('nan')):.0f}  (target p95 < 250)"
    )
    for kind, ms in sorted(tally.read_ms_by_kind.items()):
        p50, p95, p99 = (pct(ms, q) for q in (0.5, 0.95, 0.99))
        print(f"    {kind}: p50 {p50:.0f}  p95 {p95:.0f}  p99 {p99:.0f}")
    print(f"  SSE events, all, by name: {dict(tally.events)}")
    for name, window in (("streams only (no reads)", quiet), ("streams + reads", w)):
        print(f"  window {name}: {window.wall_s:.1f} s wall")
        report_cost(args, window)


def report_cost(args: argparse.Namespace, w: Window) -> None:
    wall, server, client = w.wall_s, w.server_cpu_s, w.client_cpu_s
    per_stream = f"{1e3 * server / wall / args.streams:.2f} ms/s per stream" if args.streams else ""
    print(f"    SSE events: {w.events} ({w.events / wall:.0f}/s)")
    print(
        f"    server CPU: {server:.1f} s in {wall:.1f} s wall ({server / wall:.0%} of a core"
        f"{'; ' + per_stream if per_stream else ''})"
    )
    print(f"    load generator CPU: {client:.1f} s ({client / wall:.0%} of a core)")
    if w.stream_statements is not None and w.other_statements is not None:
        print(
            f"    SQL statements/s: live streams {w.stream_statements / wall:.1f}, "
            f"the rest {w.other_statements / wall:.1f}"
        )
    print(
        f"    server's PostgreSQL connections, peak: {w.peak_connections} "
        f"(idle in transaction: {w.peak_idle_in_transaction})"
    )
    t = w.sched
    if t.get("server_run") or t.get("server_wait"):
        print(
            f"    on a CPU / runnable but waiting for one, share of the wall time: server threads"
            f" {t['server_run'] / wall:.0%} / {t['server_wait'] / wall:.0%}, its event loop"
            f" {t['loop_run'] / wall:.0%} / {t['loop_wait'] / wall:.0%}, its database backends"
            f" {t['db_run'] / wall:.0%} / {t['db_wait'] / wall:.0%}"
        )


TRACE_PARTS = {  # ReadTrace field: what it is
    "gate_s": "session slot",
    "queue_s": "thread queue",
    "thread_cpu_s": "thread CPU",
    "db_s": "database round trips",
    "thread_other_s": "GIL/CPU waits in threads",
    "resume_s": "loop resuming",
    "loop_s": "event loop",
}


def report_traces(reads: list[dict[str, float]], lags: list[float]) -> None:
    """The loaded window's reads split into their waits, and the event loop's lag."""
    if lags:
        ms = [1000 * lag for lag in lags]
        print(
            f"  event loop lag (a 10 ms sleep's overshoot), ms: p50 {pct(ms, 0.5):.0f}  "
            f"p95 {pct(ms, 0.95):.0f}  p99 {pct(ms, 0.99):.0f}  max {max(ms):.0f}"
        )
    writes = [r for r in reads if r["method"] != "GET"]
    reads = [r for r in reads if r["method"] == "GET"]
    if not reads:
        return
    cut = pct([r["total_s"] for r in reads], 0.95)
    for name, group in (
        ("reads, all", reads),
        ("reads, slowest 5%", [r for r in reads if r["total_s"] >= cut]),
        ("writes (the runs' logging)", writes),
    ):
        if not group:
            continue
        mean_ms = 1000 * sum(r["total_s"] for r in group) / len(group)
        parts = "  ".join(
            f"{label} {1000 * sum(r[f] for r in group) / len(group):.1f}"
            for f, label in TRACE_PARTS.items()
        )
        hops = sum(r["hops"] for r in group) / len(group)
        statements = sum(r["statements"] for r in group) / len(group)
        waits = sum(r["db_waits"] for r in group) / len(group)
        ms = [1000 * r["total_s"] for r in group]
        print(
            f"  in the server, {name} ({len(group)}): p50 {pct(ms, 0.5):.0f}  p95 "
            f"{pct(ms, 0.95):.0f}  p99 {pct(ms, 0.99):.0f}; mean {mean_ms:.1f} ms = {parts}"
            f"  ({hops:.1f} thread calls, {statements:.1f} statements, {waits:.1f} driver"
            " waits each)"
        )


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--quiet-seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--quick", action="store_true", help="20 s + 10 s windows")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.quiet_seconds = 20.0, 10.0
    with tempfile.TemporaryDirectory() as tmp, PgDatabase() as pg:
        data = Path(tmp)
        env = embedded_env(
            data,
            CONSPO_DATABASE_URL=pg.url,
            CONSPO_BROKER_URL=REDIS,
            CONSPO_QUEUE=f"bench_{uuid.uuid4().hex[:6]}",
            CONSPO_STREAM_MAX_PER_CLIENT=str(args.streams + 10),
        )
        for name in ("CONSPO_STREAM_POLL_S", "CONSPO_STREAM_KEEPALIVE_S"):  # the defaults
            env.pop(name, None)
        env.update(dict(kv.split("=", 1) for kv in args.env))
        token = migrate_and_create_token(env, "bench")
        counts = data / "statements.json" if args.workers == 1 else None
        proc, url = start_server(env, data / "server.log", args.workers, counts)
        try:
            asyncio.run(load(url, token, args, pg, proc.pid, counts))
        finally:
            stop(proc)
            log_tail = (data / "server.log").read_text(errors="replace").splitlines()[-5:]
            if any("Error" in line or "Traceback" in line for line in log_tail):
                print("  server log tail:\n    " + "\n    ".join(log_tail))


if __name__ == "__main__":
    main()
