"""The worker's DB sink and the bulk write path, on SQLite and PostgreSQL.

The sink buffers steps and writes them in one transaction per batch (on flush(), when the buffer
is full, or a second after the last write); the trainer flushes before each checkpoint.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from backend.config import Settings
from backend.db import Database
from backend.models import Metric, RolloutStep, Run, RunStatus, User, utcnow
from backend.storage.rollouts import query_rollouts
from backend.storage.series import Series
from backend.storage.writes import RolloutPoint, StepPoints, write_points
from conspo.sink import RolloutRecord, StepRecord
from worker.db_sink import DbSink, RunGone

KEYS = ("loss", "sep/gap", "eval/accuracy")


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


def new_run(db: Database, attempt: int = 1) -> int:
    with db.session() as s:
        user = s.scalar(select(User).limit(1))
        run = Run(
            name=f"sink-{uuid.uuid4().hex[:8]}", owner_id=user.id if user else None,
            status=RunStatus.running,
            algorithm="grpo", task="arith", model="tiny", config={}, tags=[], summary={},
            attempt=attempt, heartbeat_at=utcnow(),
        )  # fmt: skip
        s.add(run)
        s.commit()
        return run.id


def record(step: int, scale: float = 1.0) -> StepRecord:
    return StepRecord(
        step=step,
        total_steps=100,
        wall_time=1.7e9 + step,
        metrics={k: scale * (step + i / 10) for i, k in enumerate(KEYS)},
        rollouts=[
            RolloutRecord(g, i, float(i % 2), -0.1 * i, 5 + i, i == 3)
            for g in range(2)
            for i in range(4)
        ],
    )


def point(
    step: int,
    group: int,
    index: int,
    reward: float | None,
    score: float | None,
    length: int,
    truncated: bool,
    prompt: str = "",
    completion: str = "",
) -> RolloutPoint:
    """A rollout to write, its fields in the API's order (``RolloutOut``)."""
    return RolloutPoint(
        step=step, group=group, index=index, reward=reward, score=score, length=length,
        truncated=truncated, prompt=prompt, completion=completion,
    )  # fmt: skip


def stored(db: Database, run_id: int) -> tuple[dict[tuple[str, int], float | None], list[int]]:
    with db.session() as s:
        points = {
            (k, st): v
            for k, st, v in s.execute(
                select(Metric.key, Metric.step, Metric.value).where(Metric.run_id == run_id)
            )
        }
        rollout_steps = [r["step"] for r in query_rollouts(s, run_id, None, None, 10**6)]
    return points, rollout_steps


def run_row(db: Database, run_id: int) -> Run:
    with db.session() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return run


def test_sink_buffers_until_flush_then_writes_one_batch(db: Database) -> None:
    run_id = new_run(db)
    sink = DbSink(db, run_id, attempt=1, max_points=10**6, max_delay_s=1e9)
    for step in range(1, 6):
        sink.log_step(record(step))
    assert stored(db, run_id) == ({}, []) and sink.buffered_steps == [1, 2, 3, 4, 5]
    sink.flush()
    points, rollouts = stored(db, run_id)
    assert sorted({st for _, st in points}) == [1, 2, 3, 4, 5] and len(points) == 15
    assert sorted(rollouts) == sorted(s for s in range(1, 6) for _ in range(8))
    run = run_row(db, run_id)
    assert run.step == 5 and run.total_steps == 100 and run.write_seq == 1  # one transaction
    assert run.summary == {k: pytest.approx(5 + i / 10) for i, k in enumerate(KEYS)}
    sink.flush()  # nothing buffered: no write
    assert run_row(db, run_id).write_seq == 1


def test_sink_writes_when_full_or_after_its_delay(db: Database) -> None:
    run_id = new_run(db)
    per_step = len(KEYS) + 1  # the metric points, and the rollouts' row
    full = DbSink(db, run_id, attempt=1, max_points=3 * per_step, max_delay_s=1e9)
    for step in range(1, 4):
        full.log_step(record(step))
    assert full.buffered_steps == []  # handed to the writer thread
    full.wait_written()
    assert run_row(db, run_id).step == 3

    now = [0.0]
    timed = DbSink(db, run_id, attempt=1, max_points=10**6, max_delay_s=1.0, clock=lambda: now[0])
    timed.log_step(record(4))
    now[0] = 0.5
    timed.log_step(record(5))
    assert timed.buffered_steps == [4, 5]
    now[0] = 1.2
    timed.log_step(record(6))  # a second since the last write: the dashboards get it
    assert timed.buffered_steps == []
    timed.wait_written()
    assert run_row(db, run_id).step == 6


def test_reemitted_steps_overwrite_and_lost_ownership_stops(db: Database) -> None:
    run_id = new_run(db)
    first = DbSink(db, run_id, attempt=1)
    for step in range(1, 5):
        first.log_step(record(step))
    first.flush()
    # A resumed attempt re-emits steps 3..4 (values differ, as on a GPU) and goes on to 6,
    # in one batch mixing rewrites and new steps.
    with db.session() as s:
        s.execute(Run.__table__.update().where(Run.id == run_id).values(attempt=2))
        s.commit()
    with pytest.raises(RunGone):
        first.log_step(record(5))
        first.flush()
    second = DbSink(db, run_id, attempt=2)
    for step in range(3, 7):
        second.log_step(record(step, scale=2.0))
    second.flush()
    points, rollouts = stored(db, run_id)
    assert sorted({st for _, st in points}) == list(range(1, 7)) and len(points) == 18
    assert points[("loss", 2)] == 2.0 and points[("loss", 3)] == 6.0  # rewritten, not doubled
    assert sorted(rollouts) == sorted(s for s in range(1, 7) for _ in range(8))


def test_write_points_dedupes_nulls_and_sorts(db: Database) -> None:
    run_id = new_run(db)
    steps = [
        StepPoints(2, {"b": 1.0, "a": math.nan}, None),
        StepPoints(1, {"a": math.inf, "b": 2e300}),
        StepPoints(2, {"a": 5.0}, 1.7e9),  # the same (key, step) again: the last one wins
    ]
    rollouts = [
        point(1, 0, 0, None, math.nan, 3, False),
        point(1, 0, 0, 1.0, -0.5, 4, True),  # the same row again: the last one wins
    ]
    with db.session() as s:
        written = write_points(s, run_id, steps, rollouts)
        s.commit()
    assert written.points == 4 and written.rollouts == 1 and written.last_step == 2
    assert written.last_values == {"a": 5.0, "b": 1.0}
    points, _ = stored(db, run_id)
    assert points == {("a", 1): None, ("b", 1): None, ("a", 2): 5.0, ("b", 2): 1.0}
    with db.session() as s:
        (row,) = query_rollouts(s, run_id, None, None, 10)
        assert (row["reward"], row["score"], row["length"], row["truncated"]) == (1, -0.5, 4, True)
        assert s.scalar(select(func.count()).where(RolloutStep.run_id == run_id)) == 1


@pytest.fixture
def pg_db(pg_url: str, tmp_path) -> Iterator[Database]:  # type: ignore[no-untyped-def]
    database = Database(Settings(database_url=pg_url, broker_url="memory://", data_dir=tmp_path))
    yield database
    database.dispose()


def test_postgres_copy_falls_back_to_upsert_on_a_collision(pg_db: Database) -> None:
    """The COPY fast path only takes rows above the stored top step; should one collide anyway,
    the savepoint rolls it back and the rows are upserted."""
    from functools import partial

    import numpy as np

    from backend.storage.postgresql import (
        _copy_metrics,
        _insert_parts,
        _raw_cursor,
        _upsert_metrics,
    )
    from backend.storage.writes import _metric_columns

    run_id = new_run(pg_db)
    with pg_db.session() as s:
        write_points(s, run_id, [StepPoints(1, {"a": 1.0}), StepPoints(2, {"a": 2.0})])
        s.commit()
    m = _metric_columns([StepPoints(2, {"a": 20.0}), StepPoints(3, {"a": 30.0})])
    with pg_db.session() as s:
        with _raw_cursor(s) as cur:
            copy, upsert = (partial(f, cur, run_id, 7, m) for f in (_copy_metrics, _upsert_metrics))
            _insert_parts(cur, copy, upsert, np.array([True, True]))
        s.commit()
    points, _ = stored(pg_db, run_id)
    assert points == {("a", 1): 1.0, ("a", 2): 20.0, ("a", 3): 30.0}


def test_copy_sends_nulls_texts_and_every_width_exactly(db: Database) -> None:
    """The binary COPY rows (keys of any length and script, NULL floats among numbers, booleans)
    read back as written, beside rows that overwrite stored ones (the upsert part)."""
    run_id = new_run(db)
    keys = ["a", "sep/gap", "é/ü_ключ", "k" * 200]
    steps = [
        StepPoints(s, {k: (None if (s + i) % 3 == 0 else s * 0.1 - i) for i, k in enumerate(keys)})
        for s in range(1, 40)
    ]
    rollouts = [
        point(s, g, i, None if i == 1 else 0.5 * i, math.nan if g else -i, 7 + i, i == 2)
        for s in range(1, 40)
        for g in range(2)
        for i in range(3)
    ]
    with db.session() as s:
        write_points(s, run_id, steps[:20], rollouts[: 20 * 6])
        s.commit()
    with db.session() as s:  # steps 15..39: 15..19 stored already, upserted; the rest copied
        write_points(s, run_id, steps[14:], rollouts[14 * 6 :])
        s.commit()
    points, _ = stored(db, run_id)
    assert points == {(k, p.step): p.metrics[k] for p in steps for k in keys}
    with db.session() as s:
        rows = [tuple(r.values()) for r in query_rollouts(s, run_id, None, None, 10**6)]
    want = {
        (r.step, r.group, r.index, r.reward, None if r.group else r.score, r.length, r.truncated)
        for r in rollouts
    }
    assert set(rows) == want and len(rows) == len(rollouts)


def close(a: float | None, b: float | None) -> bool:
    return a == b if a is None or b is None else a == pytest.approx(b, rel=1e-12, abs=1e-12)


def test_rollups_of_an_outgrown_width_are_deleted(db: Database) -> None:
    """A series growing through widths 2, 4 and 8 keeps only the rows of the width its charts
    read; the wider rows (summed from full narrower ones where the series is dense, recomputed
    where it is sparse) equal those a reader computes from the raw points, and reads agree."""
    from backend.models import MetricRollup
    from backend.storage.series import query_series

    run_id = new_run(db)

    def rollups() -> dict[tuple[str, int, int], tuple]:  # type: ignore[type-arg]
        with db.session() as s:
            rows = s.scalars(select(MetricRollup).where(MetricRollup.run_id == run_id))
            return {
                (r.key, r.width, r.bucket): (
                    r.n, r.n_valid, r.v_min, r.v_max, r.last_step, r.last_wall, r.v_sum,
                )
                for r in rows
            }  # fmt: skip

    def read() -> dict[str, Series]:
        with db.session() as s:
            return query_series(s, [run_id], ["dense", "sparse"], 1000)[run_id]

    widths_seen = []
    for lo in range(1, 4400, 400):  # 400 steps a write: 1,001 -> width 2, 2,001 -> 4, 4,001 -> 8
        with db.session() as s:
            write_points(
                s,
                run_id,
                [
                    StepPoints(i, {"dense": math.sin(i / 30) * 1e3, "sparse": i / 7}, i)
                    if i % 3 == 0
                    else StepPoints(i, {"dense": None if i % 11 == 0 else math.cos(i)}, i)
                    for i in range(lo, lo + 400)
                ],
            )
            s.commit()
        widths_seen.append({w for _, w, _ in rollups()})
    assert widths_seen[:3] == [set(), set(), {2}] and {4} in widths_seen
    assert widths_seen[-1] == {8}  # 4,400 steps: width 8 only, 2 and 4 deleted as outgrown
    stored_rows = rollups()
    first = read()
    with db.session() as s:  # the same rows and read from the raw points
        s.execute(MetricRollup.__table__.delete().where(MetricRollup.run_id == run_id))
        s.commit()
    raw = read()
    fresh_rows = rollups()
    assert set(fresh_rows) == set(stored_rows)
    for key, row in fresh_rows.items():
        assert stored_rows[key][:-1] == row[:-1]  # counts, min, max, last step and wall
        assert close(stored_rows[key][-1], row[-1])  # the sum
    for key in ("dense", "sparse"):
        got, want = first[key], raw[key]
        assert got.sampled and got.steps == want.steps and got.min == want.min
        assert got.max == want.max and got.wall_time == want.wall_time
        assert all(close(g, w) for g, w in zip(got.values, want.values, strict=True))


def test_postgres_rollups_of_written_points_are_bit_for_bit_sqls(pg_db: Database) -> None:
    """Buckets aggregated in numpy from the points being written store exactly the row that
    SQL's aggregate over the stored points gives (the ones summed from two of width 2 when the
    series grew into width 4 may differ in the sum's last bit)."""
    from backend.models import MetricRollup
    from backend.storage.dialect import StepRange
    from backend.storage.strategies import dialect_of

    run_id = new_run(pg_db)
    values = [math.sin(i) * 10 ** (i % 7) if i % 5 else None for i in range(3000)]
    for lo in range(1, 2600, 217):  # the sink's batches: every bucket after the first write ours
        with pg_db.session() as s:
            write_points(
                s, run_id, [StepPoints(i, {"x": values[i]}, i) for i in range(lo, lo + 217)]
            )
            s.commit()

    def rows() -> dict[int, tuple]:  # type: ignore[type-arg]
        with pg_db.session() as s:
            return {
                r.bucket: (r.n, r.n_valid, r.v_sum, r.v_min, r.v_max, r.last_step, r.last_wall)
                for r in s.scalars(select(MetricRollup).where(MetricRollup.run_id == run_id))
            }

    written = rows()
    assert len(written) == 2604 // 4  # steps 1..2604 at width 4: every bucket but the last
    with pg_db.session() as s:
        s.execute(MetricRollup.__table__.delete().where(MetricRollup.run_id == run_id))
        dialect_of(s).store_rollups(s, 4, [StepRange(run_id, "x", 0, 2603)])
        s.commit()
    recomputed = rows()
    assert recomputed.keys() == written.keys()
    grown = 1953 // 4  # steps 1..1953 stood at width 2 when the write of 1954.. grew the series
    assert {b: r for b, r in written.items() if b >= grown} == {
        b: r for b, r in recomputed.items() if b >= grown
    }
    for b in range(grown):
        assert written[b][:2] + written[b][3:] == recomputed[b][:2] + recomputed[b][3:]
        assert close(written[b][2], recomputed[b][2])


def run_of_400_steps(db: Database) -> int:
    """A new run with key "a" = step at steps 1..400."""
    run_id = new_run(db)
    with db.session() as s:
        write_points(s, run_id, [StepPoints(i, {"a": float(i)}) for i in range(1, 401)])
        s.commit()
    return run_id


def cached_rollups(db: Database, run_id: int) -> int:
    """The rollup-cache rows stored for ``run_id``."""
    from backend.models import MetricRollup

    with db.session() as s:
        q = select(func.count()).select_from(MetricRollup)
        return s.scalar(q.where(MetricRollup.run_id == run_id)) or 0


def test_rollup_cache_skips_buckets_a_write_made_stale(db: Database) -> None:
    """A reader caches buckets only for runs whose write_seq is what it was before it read the
    points, so buckets computed before a rewrite are never cached after it."""
    from backend.storage.series import query_series

    run_id = run_of_400_steps(db)

    def cached() -> int:
        return cached_rollups(db, run_id)

    with db.session() as reader:
        seen_before = run_row(db, run_id).write_seq
        query_series(reader, [run_id], ["a"], 20)  # reads and caches in one go: consistent
    assert cached() > 0
    with db.session() as s:  # a rewrite drops the cache from step 10 on
        write_points(s, run_id, [StepPoints(10, {"a": -1.0})])
        s.commit()
    assert cached() == 0  # bucket 0 (steps 0..31) starts before step 10 and ends after it
    from backend.storage.series import _cache_rollups

    stale = [
        {"run_id": run_id, "key": "a", "width": 32, "bucket": 1, "hi_step": 63, "n": 32,
         "n_valid": 32, "v_sum": 0.0, "v_min": 0.0, "v_max": 0.0, "last_step": 63,
         "last_wall": 0.0}
    ]  # fmt: skip
    with db.session() as s:
        _cache_rollups(s, stale, {run_id: seen_before})  # computed before the rewrite
    assert cached() == 0
    series = query_series_once(db, run_id)
    assert min(series.min) == -1.0 and cached() > 0


def test_a_read_session_opens_no_transaction_and_its_cache_writes_still_commit(
    db: Database,
) -> None:
    """On PostgreSQL a read session runs in autocommit (no BEGIN, no ROLLBACK round trips);
    the buckets a read caches are written in a transaction of their own, skipped as before
    for a run that a write touched since its points were read."""
    from psycopg.pq import TransactionStatus

    from backend.storage.series import _cache_rollups, query_series

    run_id = run_of_400_steps(db)

    def cached() -> int:
        return cached_rollups(db, run_id)

    with db.read_session() as reader:
        seen_before = run_row(db, run_id).write_seq
        series = query_series(reader, [run_id], ["a"], 20)[run_id]["a"]
        if db.engine.dialect.name == "postgresql":
            driver = reader.connection().connection.dbapi_connection
            assert driver is not None
            assert driver.pgconn.transaction_status == TransactionStatus.IDLE
    assert series.sampled and cached() > 0  # committed, though the reader never did
    with db.session() as s:  # a rewrite drops the cache from step 10 on
        write_points(s, run_id, [StepPoints(10, {"a": -1.0})])
        s.commit()
    stale = [
        {"run_id": run_id, "key": "a", "width": 32, "bucket": 1, "hi_step": 63, "n": 32,
         "n_valid": 32, "v_sum": 0.0, "v_min": 0.0, "v_max": 0.0, "last_step": 63,
         "last_wall": 0.0}
    ]  # fmt: skip
    with db.read_session() as reader:
        _cache_rollups(reader, stale, {run_id: seen_before})  # computed before the rewrite
    assert cached() == 0


def test_writes_maintain_the_rollups_a_first_read_uses(db: Database) -> None:
    """Metric writes store the chart width's complete buckets, recomputed from their points: a
    first read caches nothing new and equals a read computed from the raw points; redelivered
    and rewritten steps count once."""
    from backend.models import MetricRollup
    from backend.storage.series import query_series

    run_id = new_run(db)

    def wave(lo: int, hi: int, bump: float = 0.0) -> list[StepPoints]:
        return [
            StepPoints(i, {"a": math.sin(i / 40) + bump, "b": None if i % 7 else float(i)}, i)
            for i in range(lo, hi)
        ]

    def write(steps: list[StepPoints]) -> None:
        with db.session() as s:
            write_points(s, run_id, steps)
            s.commit()

    def rollups() -> dict[tuple[str, int, int], tuple]:  # type: ignore[type-arg]
        with db.session() as s:
            rows = s.scalars(select(MetricRollup).where(MetricRollup.run_id == run_id))
            return {
                (r.key, r.width, r.bucket): (
                    r.n, r.n_valid, r.v_min, r.v_max, r.last_step, r.last_wall,
                    None if r.v_sum is None else round(r.v_sum, 9),
                )
                for r in rows
            }  # fmt: skip

    def read() -> dict[str, Series]:
        with db.session() as s:
            return query_series(s, [run_id], ["a", "b"], 1000)[run_id]

    write(wave(1, 800))  # raw reads still: nothing stored
    assert rollups() == {}
    write(wave(800, 1300))  # grows past 1,000 steps: widths 2 and 4 from the first step
    write(wave(1300, 2101))
    write(wave(1500, 1700))  # redelivered
    write([StepPoints(1234, {"a": -5.0})])  # rewritten: its bucket's min and mean move
    stored = rollups()
    assert {w for _, w, _ in stored} == {4}  # 2,100 steps read at width 4 (2: outgrown, gone)
    assert max(b for k, w, b in stored if k == "a" and w == 4) == 2100 // 4 - 1  # all complete
    first = read()
    assert rollups() == stored  # the read found every complete bucket stored
    assert min(first["a"].min) == -5.0 and first["a"].total_points == 2100
    with db.session() as s:  # the same read from the raw points
        s.execute(MetricRollup.__table__.delete().where(MetricRollup.run_id == run_id))
        s.commit()
    raw = read()
    for key in ("a", "b"):
        got, want = first[key], raw[key]
        assert got.sampled and got.steps == want.steps and got.min == want.min
        assert got.max == want.max and got.wall_time == want.wall_time
        assert [v is None for v in got.values] == [v is None for v in want.values]
        pairs = [(g, w) for g, w in zip(got.values, want.values, strict=True) if w is not None]
        assert all(g == pytest.approx(w, rel=1e-12, abs=1e-12) for g, w in pairs)
    assert {k: v for k, v in rollups().items() if k[1] == 4} == {
        k: v for k, v in stored.items() if k[1] == 4
    }  # the reader caches exactly what the writes stored


def query_series_once(db: Database, run_id: int) -> Series:
    from backend.storage.series import query_series

    with db.session() as s:
        return query_series(s, [run_id], ["a"], 20)[run_id]["a"]


def test_storage_dialect_is_chosen_once_per_engine(db: Database) -> None:
    from backend.storage.strategies import _make, dialect_of

    with db.session() as a, db.session() as b:
        assert dialect_of(a) is dialect_of(b)
        assert dialect_of(a).name == db.engine.dialect.name
    with pytest.raises(ValueError, match="'mysql'; known: postgresql, sqlite"):
        _make("mysql")


def test_rollouts_added_to_a_stored_step_keep_the_others(db: Database) -> None:
    """A step's rollouts are one row: a later write of some of them (a redelivered step, a
    client sending a step's groups in two calls) replaces those and keeps the rest, once each."""
    run_id = new_run(db)

    def rollout(step: int, g: int, i: int, reward: float) -> RolloutPoint:
        return point(step, g, i, reward, -0.5, 4, False)

    first = [rollout(s, 0, i, 0.0) for s in (1, 2) for i in range(3)]
    later = [rollout(1, 1, 0, 1.0), rollout(1, 0, 1, 2.0), rollout(3, 0, 0, 3.0)]
    for batch in (first, later, later):  # the second call again: nothing doubles
        with db.session() as s:
            write_points(s, run_id, [], batch)
            s.commit()
    with db.session() as s:
        got = [(r["step"], r["group"], r["index"], r["reward"]) for r in query_rollouts(
            s, run_id, None, None, 100)]  # fmt: skip
        rows = s.scalar(select(func.count()).where(RolloutStep.run_id == run_id))
    assert got == [
        (1, 0, 0, 0.0), (1, 0, 1, 2.0), (1, 0, 2, 0.0), (1, 1, 0, 1.0),
        (2, 0, 0, 0.0), (2, 0, 1, 0.0), (2, 0, 2, 0.0), (3, 0, 0, 3.0),
    ]  # fmt: skip
    assert rows == 3


def test_rollout_reads_page_through_steps_and_join_texts(db: Database) -> None:
    """Reads unpack the per-step rows in (step, group, index) order across pages of step rows,
    stop at the limit mid-step, and attach each rollout's text (stored_texts: only those
    with text, with their rewards)."""
    from backend.storage.rollouts import STEP_ROWS_PER_READ, stored_texts

    run_id = new_run(db)
    steps = STEP_ROWS_PER_READ * 2 + 5
    rollouts = [
        point(s, g, i, float(s), None, 1, False, *(("p", f"c{s}") if i else ("", "")))
        for s in range(1, steps + 1)
        for g in range(2)
        for i in range(2)
    ]
    with db.session() as s:
        write_points(s, run_id, [], rollouts[::-1])  # any order in, sorted out
        s.commit()
    with db.session() as s:
        every = query_rollouts(s, run_id, None, None, 10**6)
        some = query_rollouts(s, run_id, 3, None, 7, text=True)
        texts = stored_texts(s, run_id)
    assert [(r["step"], r["group"], r["index"]) for r in every] == [
        (r.step, r.group, r.index) for r in rollouts
    ]
    assert all(r["score"] is None for r in every)
    assert [(r["step"], r["group"], r["index"], r["completion"]) for r in some] == [
        (3, 0, 0, ""), (3, 0, 1, "c3"), (3, 1, 0, ""), (3, 1, 1, "c3"),
        (4, 0, 0, ""), (4, 0, 1, "c4"), (4, 1, 0, ""),
    ]  # fmt: skip
    assert texts == [("p", f"c{s}", float(s)) for s in range(1, steps + 1) for _ in range(2)]
