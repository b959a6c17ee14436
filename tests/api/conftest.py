"""Fixtures for the platform tests: real SQLite and PostgreSQL databases, real brokers, workers.

API tests run once per database (``backend`` is parametrised sqlite / postgresql). Every session
creates its own PostgreSQL database (conspo_t_<random>, dropped at the end), its own Redis
queue name on a Redis db in 5-9, and its own SQLite files under tmp. PostgreSQL or Redis
missing: tests skip, or fail when CONSPO_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backend.config import Settings
from backend.migrate import migrate
from tests.support import shared_model_store

ROOT = Path(__file__).resolve().parents[2]
REQUIRE = os.environ.get("CONSPO_REQUIRE_SERVICES") == "1"
PG_SERVER = os.environ.get("CONSPO_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS_SERVER = os.environ.get("CONSPO_TEST_REDIS", "redis://127.0.0.1:6379")
SESSION_TAG = uuid.uuid4().hex[:8]

TINY = {
    "algorithm": "grpo",
    "model": {"name": "tiny"},
    "task": {"name": "arith", "eval_size": 4},
    "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
    "eval": {"every": 0, "pass_k": 1},
    "logging": {"rollout_sample": 8},
}


def tiny_config(steps: int, checkpoint_every: int = 0, **extra: Any) -> dict[str, Any]:
    return {**TINY, "steps": steps, "checkpoint": {"every": checkpoint_every}, **extra}


def unavailable(what: str, why: str) -> None:
    if REQUIRE:
        pytest.fail(f"CONSPO_REQUIRE_SERVICES=1 but {what} is unavailable: {why}")
    pytest.skip(f"{what} unavailable: {why}")


# ---------------------------------------------------------------------------------------------
# Databases and brokers
# ---------------------------------------------------------------------------------------------


def _pg_admin() -> Any:
    import psycopg

    url = PG_SERVER.replace("postgresql+psycopg://", "postgresql://")
    return psycopg.connect(f"{url}/postgres", autocommit=True, connect_timeout=3)


def create_pg_database(prefix: str = "conspo_t") -> str:
    """A new empty PostgreSQL database; returns its SQLAlchemy URL."""
    try:
        conn = _pg_admin()
    except Exception as exc:  # noqa: BLE001
        unavailable("PostgreSQL", str(exc))
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_SERVER}/{name}"


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with _pg_admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    url = create_pg_database()
    migrate(url)
    yield url
    drop_pg_database(url)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    import redis

    db = random.randint(5, 9)
    url = f"{REDIS_SERVER}/{db}"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3)
        client.ping()
    except Exception as exc:  # noqa: BLE001
        unavailable("Redis", str(exc))
    yield url
    for key in client.scan_iter(f"*{SESSION_TAG}*"):
        client.delete(key)


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model store for the session ("tiny" builds in about a second, then is reused)."""
    return shared_model_store(tmp_path_factory)


def make_settings(data_dir: Path, database_url: str, broker_url: str, **kw: Any) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url=broker_url,
        queue=f"gpu_{SESSION_TAG}_{uuid.uuid4().hex[:6]}",
        **kw,
    )


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """API settings for one database: SQLite + sqla broker, or PostgreSQL + Redis."""
    data_dir = tmp_path_factory.mktemp(f"api-{request.param}")
    if request.param == "sqlite":
        db = f"sqlite:///{data_dir / 'conspo.db'}"
        migrate(db)
        return make_settings(data_dir, db, f"sqla+sqlite:///{data_dir / 'broker.db'}")
    pg = request.getfixturevalue("pg_url")
    return make_settings(data_dir, pg, request.getfixturevalue("redis_url"))


@dataclass
class Api:
    """A TestClient plus tokens for alice, bob (plain users) and root (admin)."""

    client: Any
    settings: Settings
    tokens: dict[str, str]

    def h(self, user: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}

    def _call(self, method: str, path: str, user: str | None, kw: dict[str, Any]) -> Any:
        headers = {**self.h(user), **kw.pop("headers", {})}
        return self.client.request(method, path, headers=headers, **kw)

    def get(self, path: str, user: str | None = None, **kw: Any) -> Any:
        return self._call("GET", path, user, kw)

    def post(self, path: str, user: str | None = "alice", **kw: Any) -> Any:
        return self._call("POST", path, user, kw)

    def delete(self, path: str, user: str | None = "alice", **kw: Any) -> Any:
        return self._call("DELETE", path, user, kw)

    def patch(self, path: str, user: str | None = "alice", **kw: Any) -> Any:
        return self._call("PATCH", path, user, kw)

    def external(self, user: str = "alice", **body: Any) -> dict[str, Any]:
        payload = {"name": "ext", "algorithm": "grpo", "task": "arith", "model": "tiny", **body}
        r = self.post("/api/runs/external", user=user, json=payload)
        assert r.status_code == 201, r.text
        return r.json()


def make_tokens(settings: Settings) -> dict[str, str]:
    from backend.db import Database
    from backend.security import create_token

    db = Database(settings)
    with db.session() as session:
        tokens = {
            "alice": create_token(session, f"alice-{SESSION_TAG}"),
            "bob": create_token(session, f"bob-{SESSION_TAG}"),
            "root": create_token(session, f"root-{SESSION_TAG}", admin=True),
        }
    db.dispose()
    return tokens


@pytest.fixture(scope="session")
def api(settings: Settings) -> Iterator[Api]:
    from fastapi.testclient import TestClient

    from backend.main import create_app

    with TestClient(create_app(settings)) as client:
        yield Api(client, settings, make_tokens(settings))


@contextmanager
def live_server(settings: Settings, ports: range) -> Iterator[str]:
    """``create_app(settings)`` served by uvicorn in a thread (a real HTTP server, for what a
    TestClient cannot do: endless streams, raw bytes on the wire); yields its base URL."""
    import uvicorn

    from backend.main import create_app
    from tests.support import free_port

    port = free_port(ports)
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 60, "the uvicorn server to start", interval=0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_for(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    env: dict[str, str]
    log: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        out = self.log.open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "conspo_lab.cli", "worker", "--loglevel", "info"],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill -9 takes all of it
        )
        self.procs.append(proc)
        return proc

    def kill9(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def worker_env(settings: Settings, model_store: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSPO_")}
    env.update(
        {
            "CONSPO_DATA_DIR": str(settings.data_dir),
            "CONSPO_DATABASE_URL": settings.database_url,
            "CONSPO_BROKER_URL": settings.broker_url,
            "CONSPO_QUEUE": settings.queue,
            "CONSPO_MODEL_STORE": str(model_store),
            "CONSPO_HEARTBEAT_INTERVAL_S": "0.5",
            "CONSPO_HEARTBEAT_TIMEOUT_S": "3",
            "CONSPO_REAPER_INTERVAL_S": "1",
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "CONSPO_VLLM_PYTHON": os.environ.get("CONSPO_VLLM_PYTHON", ""),
        }
    )
    return env


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[[Settings, Path], WorkerProcess]]:
    made: list[WorkerProcess] = []

    def factory(settings: Settings, model_store: Path) -> WorkerProcess:
        wp = WorkerProcess(worker_env(settings, model_store), tmp_path / f"worker{len(made)}.log")
        made.append(wp)
        return wp

    yield factory
    for wp in made:
        wp.stop_all()


# ---------------------------------------------------------------------------------------------
# A database and queue of the test's own, and a broker that loses jobs
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def own_settings(settings: Settings, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """Like ``settings`` (same backend and broker), with a fresh database and queue: for tests
    that count every queued run or worker (the session's database holds other tests' runs)."""
    if settings.mode == "embedded":
        db = f"sqlite:///{tmp_path / 'conspo.db'}"
        broker = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    else:
        db, broker = create_pg_database(), settings.broker_url
        request.addfinalizer(lambda: drop_pg_database(db))
    migrate(db)
    return make_settings(tmp_path, db, broker)


def lose_queued_jobs(settings: Settings) -> None:
    """What a broker without persistence does on a restart: the queue's jobs are gone.

    Redis: ``DEL`` of the queue's lists; kombu's SQLAlchemy transport: its message rows.
    """
    if settings.broker_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(settings.broker_url)
        for key in client.scan_iter(f"{settings.queue}*"):  # the list of each priority
            client.delete(key)
        return
    import sqlite3

    path = settings.broker_url.removeprefix("sqla+sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "DELETE FROM kombu_message WHERE queue_id IN "
            "(SELECT id FROM kombu_queue WHERE name = ?)",
            (settings.queue,),
        )


@pytest.fixture
def own_api(own_settings: Settings) -> Iterator[Api]:
    """An API over ``own_settings`` (a fresh database of the session's backend)."""
    from fastapi.testclient import TestClient

    from backend.main import create_app

    with TestClient(create_app(own_settings)) as client:
        yield Api(client, own_settings, make_tokens(own_settings))


def run_in_worker(api: Api, config: dict[str, Any]) -> dict[str, Any]:
    """Submit ``config`` and run its job with the worker's own code, in this process."""
    from backend.db import Database
    from backend.runs.queue import JobQueue, make_celery
    from worker.tasks import execute_run

    r = api.post("/api/runs", json={"config": config})
    assert r.status_code == 201, r.text
    run_id = r.json()["runs"][0]["id"]
    settings = api.settings
    db = Database(settings)
    try:
        execute_run(db, JobQueue(make_celery(settings), settings.queue), settings, run_id)
    finally:
        db.dispose()
    return api.get(f"/api/runs/{run_id}").json()
