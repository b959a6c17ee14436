"""Idempotent bulk writes of metrics and rollouts, plus the run's step, summary and write_seq.

Writes are ``INSERT … ON CONFLICT DO UPDATE`` on (run_id, key, step) and (run_id, step, group,
index), so a redelivered job or a retried client batch overwrites instead of duplicating.
Columns are built with numpy: the per-point Python work is a list extend.
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import (
    JSON,
    Table,
    bindparam,
    case,
    cast,
    delete,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from backend.db import BoolArray, Float8Array, Int4Array, PgArray, upsert
from backend.models import (
    MAX_ABS_VALUE,
    Metric,
    MetricRollup,
    Rollout,
    Run,
    RunStatus,
    finite,
    utcnow,
)

METRICS: Table = Metric.__table__  # type: ignore[assignment]
ROLLOUTS: Table = Rollout.__table__  # type: ignore[assignment]
METRIC_KEY = ("run_id", "key", "step")
ROLLOUT_KEY = ("run_id", "step", "group", "index")


@dataclass
class StepPoints:
    """One step's metrics as written by the DB sink or the external logging endpoint.

    ``rollouts``: that step's sampled rollouts, any objects with ``group``, ``index``,
    ``reward``, ``score``, ``length`` and ``truncated`` (``conspo.sink.RolloutRecord`` is one).
    """

    step: int
    metrics: Mapping[str, float | None]
    wall_time: float | None = None
    rollouts: Sequence[Any] = ()


@dataclass
class RolloutPoint:
    step: int
    group: int
    index: int
    reward: float | None
    score: float | None
    length: int
    truncated: bool


@dataclass
class Written:
    points: int = 0
    rollouts: int = 0
    last_step: int | None = None
    last_values: dict[str, float | None] = field(default_factory=dict)
    owned: bool = True
    seq: int | None = None  # the run's write_seq given to these points


def write_points(
    session: Session,
    run_id: int,
    steps: Sequence[StepPoints],
    rollouts: Iterable[RolloutPoint] = (),
    *,
    owner_attempt: int | None = None,
    run_values: dict[str, Any] | None = None,
) -> Written:
    """Upsert metrics and rollouts; move the run's step, summary and ``run_values`` along.

    A handful of statements whatever the batch size (the caller commits):

    1. one UPDATE of the run: step only moves forward, the summary keeps each key's value at
       the highest step, ``write_seq`` goes up by one and every point written gets it as its
       ``seq``. It locks the run row, so writes of one run are serialised (and ``seq`` follows
       commit order). With ``owner_attempt`` only while that attempt still owns the running
       run; else nothing is written and ``owned`` is False.
    2. one DELETE of the rollup-cache rows the new points fall into;
    3. the metric and rollout rows: on PostgreSQL, rows above the highest step already stored
       for their key (every row, in a run that only moves forward) go in with a plain INSERT,
       the others with INSERT … ON CONFLICT DO UPDATE; columns travel as binary arrays.

    A (key, step) or (step, group, index) given twice keeps its last value. Columns are built
    with numpy: the per-point Python work is a list extend.
    """
    out = Written()
    m = _metric_columns(steps)
    r = _rollout_columns(steps, rollouts)
    if steps:
        out.last_step = max(s.step for s in steps)
    if len(m.step):
        ends = np.flatnonzero(np.append(m.k[1:] != m.k[:-1], True))  # last row of each key
        out.last_values = {
            m.keys[k]: _none_if_nan(v)
            for k, v in zip(m.k[ends].tolist(), m.value[ends].tolist(), strict=True)
        }
    seq = _update_run(session, run_id, out, owner_attempt, run_values or {})
    if seq is None:
        out.owned = False
        return out
    out.seq = seq
    if len(m.step):
        session.execute(
            delete(MetricRollup).where(
                MetricRollup.run_id == run_id, MetricRollup.hi_step >= int(m.step.min())
            )
        )
    if session.get_bind().dialect.name == "postgresql":
        out.points = _pg_write_metrics(session, run_id, seq, m)
        out.rollouts = _pg_write_rollouts(session, run_id, r)
        return out
    keys = m.keys
    metric_rows = [
        {"run_id": run_id, "key": keys[k], "step": st, "value": _none_if_nan(v), "wall_time": w}
        | {"seq": seq}
        for k, st, v, w in zip(
            m.k.tolist(), m.step.tolist(), m.value.tolist(), m.wall.tolist(), strict=True
        )
    ]
    out.points = upsert(session, METRICS, metric_rows, METRIC_KEY)
    rollout_rows = [
        {
            "run_id": run_id,
            "step": st,
            "group": g,
            "index": i,
            "reward": _none_if_nan(rw),
            "score": _none_if_nan(sc),
            "length": ln,
            "truncated": bool(tr),
        }
        for st, g, i, rw, sc, ln, tr in zip(*(c.tolist() for c in r.columns()), strict=True)
    ]
    out.rollouts = upsert(session, ROLLOUTS, rollout_rows, ROLLOUT_KEY)
    return out


@dataclass
class _MetricColumns:
    """Points sorted by (key, step), one per (key, step); NULL values as NaN."""

    keys: list[str]  # sorted; ``k`` indexes it
    k: Any  # (n,) int32
    step: Any  # (n,) int64
    value: Any  # (n,) float64
    wall: Any  # (n,) float64


@dataclass
class _RolloutColumns:
    """Rows sorted by (step, group, index), one per key; NULL reward/score as NaN."""

    step: Any
    group: Any
    index: Any
    reward: Any
    score: Any
    length: Any
    truncated: Any

    def columns(self) -> tuple[Any, ...]:
        return (
            self.step, self.group, self.index, self.reward, self.score, self.length,
            self.truncated,
        )  # fmt: skip


def _none_if_nan(v: float) -> float | None:
    return None if v != v else v


def _finite_array(values: list[Any]) -> Any:
    """float64 array with None, NaN, ±Inf and |x| > MAX_ABS_VALUE as NaN (stored as NULL)."""
    arr = np.array(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        arr[~(np.abs(arr) <= MAX_ABS_VALUE)] = np.nan
    return arr


def _last_unique(*sort_keys: Any) -> Any:
    """Indices that sort by ``sort_keys`` (most significant first), keeping the last of equals."""
    n = len(sort_keys[0])
    order = np.lexsort((np.arange(n), *reversed(sort_keys)))
    if n <= 1:
        return order
    keep = np.ones(n, dtype=bool)
    same = np.ones(n - 1, dtype=bool)
    for key in sort_keys:
        sk = key[order]
        same &= sk[1:] == sk[:-1]
    keep[:-1] = ~same  # a row followed by an equal one is superseded by it
    return order[keep]


def _metric_columns(steps: Sequence[StepPoints]) -> _MetricColumns:
    now = time.time()
    key_col: list[str] = []
    value_col: list[Any] = []
    step_col: list[int] = []
    wall_col: list[float] = []
    for s in steps:
        n = len(s.metrics)
        if not n:
            continue
        wall = s.wall_time if s.wall_time is not None and finite(s.wall_time) is not None else now
        key_col.extend(s.metrics.keys())
        value_col.extend(s.metrics.values())
        step_col.extend([s.step] * n)
        wall_col.extend([wall] * n)
    slot: dict[str, int] = {}
    codes = np.fromiter(
        (slot.setdefault(k, len(slot)) for k in key_col), dtype=np.int32, count=len(key_col)
    )
    keys = sorted(slot)
    rank = np.empty(len(slot), dtype=np.int32)
    rank[[slot[k] for k in keys]] = np.arange(len(keys), dtype=np.int32)
    k = rank[codes]
    step = np.asarray(step_col, dtype=np.int64)
    pick = _last_unique(k, step)
    return _MetricColumns(
        keys,
        k[pick],
        step[pick],
        _finite_array(value_col)[pick],
        np.asarray(wall_col, dtype=np.float64)[pick],
    )


_ROLLOUT_FIELDS = operator.attrgetter("group", "index", "reward", "score", "length", "truncated")


def _rollout_columns(steps: Sequence[StepPoints], extra: Iterable[RolloutPoint]) -> _RolloutColumns:
    rows: list[tuple[Any, ...]] = []
    step_col: list[int] = []
    for s in steps:
        if s.rollouts:
            rows.extend(map(_ROLLOUT_FIELDS, s.rollouts))
            step_col.extend([s.step] * len(s.rollouts))
    for r in extra:
        rows.append(_ROLLOUT_FIELDS(r))
        step_col.append(r.step)
    table = np.array(rows, dtype=np.float64).reshape(-1, 6)  # None -> NaN
    step = np.asarray(step_col, dtype=np.int64)
    group, index = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    pick = _last_unique(step, group, index)
    with np.errstate(invalid="ignore"):
        for col in (2, 3):  # reward, score: as metric values
            table[~(np.abs(table[:, col]) <= MAX_ABS_VALUE), col] = np.nan
    return _RolloutColumns(
        step[pick],
        group[pick],
        index[pick],
        table[pick, 2],
        table[pick, 3],
        table[pick, 4].astype(np.int64),
        table[pick, 5] != 0,
    )


_PG_METRIC_INSERT = (
    "INSERT INTO metrics (run_id, key, step, value, wall_time, seq)"
    " SELECT %(run)s, (%(keys)s::varchar[])[u.k], u.s, NULLIF(u.v, 'NaN'), u.w, %(seq)s"
    " FROM unnest(%(k)b, %(s)b, %(v)b, %(w)b) AS u(k, s, v, w)"
)
_PG_METRIC_UPSERT = (
    _PG_METRIC_INSERT + " ON CONFLICT (run_id, key, step) DO UPDATE SET value = EXCLUDED.value,"
    " wall_time = EXCLUDED.wall_time, seq = EXCLUDED.seq"
)
# Per key, the highest step stored: one index probe each.
_PG_METRIC_TOP = (
    "SELECT (SELECT max(step) FROM metrics m WHERE m.run_id = %(run)s AND m.key = u.k)"
    " FROM unnest(%(keys)s::varchar[]) WITH ORDINALITY AS u(k, i) ORDER BY u.i"
)
_PG_ROLLOUT_INSERT = (
    'INSERT INTO rollouts (run_id, step, "group", "index", reward, score, length, truncated)'
    " SELECT %(run)s, u.s, u.g, u.i, NULLIF(u.rw, 'NaN'), NULLIF(u.sc, 'NaN'), u.l, u.t"
    " FROM unnest(%(s)b, %(g)b, %(i)b, %(rw)b, %(sc)b, %(l)b, %(t)b) AS u(s, g, i, rw, sc, l, t)"
)
_PG_ROLLOUT_UPSERT = (
    _PG_ROLLOUT_INSERT + ' ON CONFLICT (run_id, step, "group", "index") DO UPDATE SET'
    " reward = EXCLUDED.reward, score = EXCLUDED.score, length = EXCLUDED.length,"
    " truncated = EXCLUDED.truncated"
)
_NO_STEP = -(2**62)


def _pg_write_metrics(session: Session, run_id: int, seq: int, m: _MetricColumns) -> int:
    if not len(m.step):
        return 0
    # PostgreSQL arrays are 1-based: k + 1 indexes the keys array.
    cols = {"k": m.k + 1, "s": m.step, "v": m.value, "w": m.wall}
    kinds = {"k": Int4Array, "s": Int4Array, "v": Float8Array, "w": Float8Array}
    with _raw_cursor(session) as cur:
        # Planned each time (prepare=False): a generic plan made while the table was small can
        # stick to a sequential scan as the table grows.
        cur.execute(_PG_METRIC_TOP, {"run": run_id, "keys": m.keys}, prepare=False)
        top = np.array([_NO_STEP if row[0] is None else row[0] for row in cur], dtype=np.int64)
        fresh = m.step > top[m.k]  # no stored row can collide with these
        _pg_insert_parts(
            cur, _PG_METRIC_INSERT, _PG_METRIC_UPSERT, cols, kinds, fresh,
            {"run": run_id, "keys": m.keys, "seq": seq},
        )  # fmt: skip
    return len(m.step)


def _pg_write_rollouts(session: Session, run_id: int, r: _RolloutColumns) -> int:
    if not len(r.step):
        return 0
    cols = dict(zip(("s", "g", "i", "rw", "sc", "l", "t"), r.columns(), strict=True))
    kinds = {
        "s": Int4Array, "g": Int4Array, "i": Int4Array, "rw": Float8Array, "sc": Float8Array,
        "l": Int4Array, "t": BoolArray,
    }  # fmt: skip
    with _raw_cursor(session) as cur:
        cur.execute(
            "SELECT max(step) FROM rollouts WHERE run_id = %(run)s", {"run": run_id}, prepare=False
        )
        top = cur.fetchone()[0]
        fresh = r.step > (_NO_STEP if top is None else top)
        _pg_insert_parts(
            cur, _PG_ROLLOUT_INSERT, _PG_ROLLOUT_UPSERT, cols, kinds, fresh, {"run": run_id}
        )
    return len(r.step)


def _pg_insert_parts(
    cur: Any,
    insert_sql: str,
    upsert_sql: str,
    cols: dict[str, Any],
    kinds: dict[str, type[PgArray]],
    fresh: Any,
    params: dict[str, Any],
) -> None:
    """Plain INSERT of the ``fresh`` rows, INSERT … ON CONFLICT of the rest.

    A plain INSERT skips the speculative insertion of ON CONFLICT (about half the cost). It is
    safe because the caller holds the run row's lock (every writer takes it first), so no other
    transaction can add a row above the probed top step meanwhile; should a row collide anyway,
    the savepoint rolls the INSERT back and the rows are upserted instead.
    """

    def part(mask: Any) -> dict[str, Any]:
        return {**params, **{name: kinds[name](col[mask]) for name, col in cols.items()}}

    old = ~fresh
    if old.any():
        cur.execute(upsert_sql, part(old))
    if fresh.any():
        try:
            with cur.connection.transaction():  # a savepoint inside the session's transaction
                cur.execute(insert_sql, part(fresh))
        except psycopg.errors.UniqueViolation:
            cur.execute(upsert_sql, part(fresh))


@contextmanager
def _raw_cursor(session: Session) -> Iterator[Any]:
    """A psycopg cursor on the session's connection and transaction."""
    dbapi = session.connection().connection.dbapi_connection
    with dbapi.cursor() as cur:  # type: ignore[union-attr]
        yield cur


def _update_run(
    session: Session,
    run_id: int,
    out: Written,
    owner_attempt: int | None,
    values: dict[str, Any],
) -> int | None:
    """The run's new ``write_seq``, or None when the run is gone (or not owned)."""
    stmt = update(Run).where(Run.id == run_id)
    if owner_attempt is not None:
        stmt = stmt.where(Run.attempt == owner_attempt, Run.status == RunStatus.running)
    values = {"updated_at": utcnow(), "write_seq": Run.write_seq + 1, **values}
    last = out.last_step
    if last is not None and session.get_bind().dialect.name == "postgresql":
        merged = cast(
            cast(Run.summary, JSONB).op("||")(
                cast(bindparam("new_summary", json.dumps(out.last_values)), JSONB)
            ),
            JSON,
        )
        values["step"] = case((Run.step <= last, last), else_=Run.step)
        values["summary"] = case((Run.step <= last, merged), else_=Run.summary)
    elif last is not None:  # SQLite: read-modify-write inside the same (locked) transaction
        current = session.execute(select(Run.step, Run.summary).where(Run.id == run_id)).first()
        if current is not None and last >= current.step:
            values["step"] = last
            values["summary"] = {**(current.summary or {}), **out.last_values}
    return session.execute(stmt.values(**values).returning(Run.write_seq)).scalar()
