"""worker.retry.Outage and the DB sink against a really locked SQLite database.

Another connection holds ``BEGIN EXCLUSIVE`` past the busy timeout, so every write fails with
SQLite's own "database is locked" until it lets go. (The PostgreSQL counterpart, connections
terminated mid-run, is in test_api_worker_faults.py.)
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from backend.config import Settings
from backend.db import Database
from backend.migrate import migrate
from backend.models import Metric, Run, RunStatus, utcnow
from conspo.sink import StepRecord
from worker.db_sink import DbSink
from worker.retry import DatabaseUnavailable, Outage, is_transient
from worker.shutdown import SharedFlag


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'conspo.db'}"
    migrate(url)
    database = Database(Settings(data_dir=tmp_path, database_url=url, sqlite_busy_timeout_s=0.1))
    yield database
    database.dispose()


class WriteLock:
    """Another writer holding the database until ``release()``."""

    def __init__(self, db: Database) -> None:
        path = db.engine.url.database
        assert path is not None
        self.conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()

    def release_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.release).start()


def new_run(db: Database) -> int:
    with db.session() as s:
        run = Run(
            name=f"retry-{uuid.uuid4().hex[:8]}", status=RunStatus.running, algorithm="grpo",
            task="arith", model="tiny",
            config={}, tags=[], summary={}, attempt=1, heartbeat_at=utcnow(),
        )  # fmt: skip
        s.add(run)
        s.commit()
        return run.id


def count_runs(db: Database) -> int:
    """Write a run (a write the lock blocks), then count the runs."""
    with db.session() as s:
        s.add(
            Run(
                name=f"w-{uuid.uuid4().hex[:8]}",
                algorithm="a",
                task="t",
                model="m",
                config={},
                tags=[],
                summary={},
            )
        )
        s.commit()
        return s.scalar(select(func.count()).select_from(Run)) or 0


def test_a_locked_database_is_retried_until_it_answers(db: Database) -> None:
    lock = WriteLock(db)
    lock.release_after(1.0)  # ten busy timeouts
    assert Outage(60).call("write", lambda: count_runs(db)) == 1


def test_an_outage_past_the_limit_gives_up(db: Database) -> None:
    lock = WriteLock(db)
    try:
        t0 = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match=r"unreachable for \d+ s \(limit 0.5 s\)"):
            Outage(0.5).call("write", lambda: count_runs(db))
        assert time.monotonic() - t0 < 30  # gave up; did not wait for the database
    finally:
        lock.release()


def test_a_shutdown_ends_the_wait_for_the_database(db: Database) -> None:
    lock, shutdown = WriteLock(db), SharedFlag()
    try:
        threading.Timer(0.5, shutdown.set).start()
        with pytest.raises(DatabaseUnavailable, match="stopped while waiting"):
            Outage(3600, interrupt=shutdown).call("write", lambda: count_runs(db))
    finally:
        lock.release()


def test_another_writer_getting_through_does_not_prolong_a_failing_write() -> None:
    """The heartbeat may succeed while bulk writes keep failing (a full disk, say): the write's
    own first failure still starts its clock."""
    outage, done = Outage(0.5), threading.Event()

    def heartbeats() -> None:
        while not done.wait(0.05):
            outage.recovered()

    def full_disk() -> None:
        raise OperationalError("INSERT ...", {}, Exception("could not extend file: No space left"))

    threading.Thread(target=heartbeats, daemon=True).start()
    try:
        with pytest.raises(DatabaseUnavailable, match="No space left"):
            outage.call("write", full_disk)
    finally:
        done.set()


def test_errors_of_the_run_itself_are_raised_at_once() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise ValueError("a bug in the run")

    with pytest.raises(ValueError, match="a bug"):
        Outage(60).call("write", broken)
    assert calls == [1] and not is_transient(ValueError())


def test_the_sink_stores_every_step_once_through_a_locked_database(db: Database) -> None:
    run_id = new_run(db)
    sink = DbSink(db, run_id, 1, max_points=1, outage=Outage(60))  # writes every step
    sink.log_step(StepRecord(1, 3, 1.0, {"sep/gap": 0.1}))
    lock = WriteLock(db)
    lock.release_after(1.0)
    sink.log_step(StepRecord(2, 3, 2.0, {"sep/gap": 0.2}))  # its writer waits out the lock
    sink.log_step(StepRecord(3, 3, 3.0, {"sep/gap": 0.3}))
    sink.flush()
    with db.session() as s:
        points = s.execute(select(Metric.step, Metric.value).where(Metric.run_id == run_id))
        assert sorted(points) == [(1, 0.1), (2, 0.2), (3, 0.3)]
        assert s.get(Run, run_id).step == 3  # type: ignore[union-attr]


def test_the_sink_holds_the_trainer_back_once_max_batches_wait(db: Database) -> None:
    """Backpressure: while the database is locked, the writer holds one batch and the trainer
    may hand over one more (max_batches=2); the next step waits until the lock goes, and then
    every step is stored once."""
    run_id = new_run(db)
    sink = DbSink(db, run_id, 1, max_points=1, max_batches=2, outage=Outage(60))  # batch per step
    lock = WriteLock(db)
    sink.log_step(StepRecord(1, 4, 1.0, {"sep/gap": 0.1}))  # the writer takes it and waits
    sink.log_step(StepRecord(2, 4, 2.0, {"sep/gap": 0.2}))  # queued: the trainer goes on
    third = threading.Thread(target=sink.log_step, args=(StepRecord(3, 4, 3.0, {"sep/gap": 0.3}),))
    third.start()
    third.join(timeout=1.0)
    assert third.is_alive()  # two batches wait: the trainer is held back
    lock.release()
    third.join(timeout=60)
    assert not third.is_alive()
    sink.log_step(StepRecord(4, 4, 4.0, {"sep/gap": 0.4}))
    sink.flush()
    with db.session() as s:
        points = s.execute(select(Metric.step, Metric.value).where(Metric.run_id == run_id))
        assert sorted(points) == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
        assert s.get(Run, run_id).step == 4  # type: ignore[union-attr]
