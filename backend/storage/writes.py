"""Idempotent bulk writes of metrics, rollouts and per-prompt pass rates, plus the run's step,
summary and write_seq.

Writes are ``INSERT … ON CONFLICT DO UPDATE`` on (run_id, key, step), (run_id, step, group,
index) and (run_id, step, prompt_key), so a redelivered job or a retried client batch
overwrites instead of duplicating. A batch becomes numpy columns first (sorted, one row per key,
non-finite values as NaN); the dialect strategy (``backend.storage.dialect``) sends them in
bulk.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from backend.models import MAX_ABS_VALUE, MetricRollup, RolloutText, Run, finite, utcnow
from backend.runs.lifecycle import owned_by
from backend.runs.progress import pace_values
from backend.schemas import RolloutOut, renderable
from backend.storage.columns import MetricColumns, RolloutColumns, last_unique, none_if_nan
from backend.storage.dialect import Dialect
from backend.storage.prompts import PromptPoint, prompt_rows, write_prompts
from backend.storage.series import refresh_rollups
from backend.storage.strategies import dialect_of
from conspo import metrics as M
from conspo.sink import clip_text


@dataclass
class StepPoints:
    """One step's metrics as written by the DB sink or the external logging endpoint.

    ``rollouts``: that step's sampled rollouts, any objects with ``group``, ``index``,
    ``reward``, ``score``, ``length`` and ``truncated`` (``conspo.sink.RolloutRecord`` is one).
    ``prompts``: every prompt of the step, objects with ``key``, ``n`` and ``correct``
    (``conspo.sink.PromptRecord``).
    """

    step: int
    metrics: Mapping[str, float | None]
    wall_time: float | None = None
    rollouts: Sequence[Any] = ()
    prompts: Sequence[Any] = ()


class RolloutPoint(RolloutOut):
    """One rollout to write: the fields a read gives back (``RolloutOut``, the API's), its text
    "" and its episode and critique None when it has none (a read leaves them out unless asked
    for them)."""

    prompt: str = ""
    completion: str = ""


ROLLOUT_TEXTS = RolloutText.__table__
ROLLOUT_TEXT_KEY = ("run_id", "step", "group", "index")


@dataclass
class Written:
    points: int = 0
    rollouts: int = 0
    prompts: int = 0
    last_step: int | None = None
    last_values: dict[str, float | None] = field(default_factory=dict)
    owned: bool = True
    seq: int | None = None  # the run's write_seq given to these points


@dataclass
class Encoded:
    """A batch of points as the columns ``write_encoded`` stores (``encode_points``): built
    without the database, so a writer can encode the next batch while this one is written."""

    metrics: MetricColumns
    rollouts: RolloutColumns
    texts: list[dict[str, Any]]  # rollout_texts rows
    prompts: list[dict[str, Any]]  # prompt_stats rows
    last_step: int | None
    last_values: dict[str, float | None]
    last_step_at: float | None = None  # the last step's wall time (unix), for the run's pace
    first_step: tuple[int, float] | None = None  # the batch's first step and its wall time
    # Seconds its steps spent on the held-out evaluation (time/eval_s), the first step's apart:
    # the pace leaves them out (backend.runs.progress.pace_values).
    eval_s: float = 0.0
    first_eval_s: float = 0.0


def encode_points(
    run_id: int,
    steps: Sequence[StepPoints],
    rollouts: Iterable[RolloutPoint] = (),
    prompts: Iterable[PromptPoint] = (),
) -> Encoded:
    """The columns of a batch (see ``write_points``)."""
    m = _metric_columns(steps)
    r, texts = _rollout_columns(run_id, steps, rollouts)
    p = prompt_rows(run_id, ((s.step, s.prompts) for s in steps), prompts)
    last_values: dict[str, float | None] = {}
    if len(m.step):
        ends = np.flatnonzero(np.append(m.k[1:] != m.k[:-1], True))  # last row of each key
        last_values = {
            m.keys[k]: none_if_nan(v)
            for k, v in zip(m.k[ends].tolist(), m.value[ends].tolist(), strict=True)
        }
    last_step = max(s.step for s in steps) if steps else None
    last_step_at, first_step = None, None
    if steps:
        latest = max(steps, key=lambda s: s.step)
        last_step_at = latest.wall_time if latest.wall_time is not None else time.time()
        earliest = min(steps, key=lambda s: s.step)
        if earliest.wall_time is not None:
            first_step = (earliest.step, earliest.wall_time)
    evaluating = {s.step: _eval_seconds(s.metrics) for s in steps}
    first_eval = evaluating[min(evaluating)] if evaluating else 0.0
    return Encoded(
        m, r, texts, p, last_step, last_values, last_step_at, first_step,
        sum(evaluating.values()), first_eval,
    )  # fmt: skip


def _eval_seconds(metrics: Mapping[str, float | None]) -> float:
    value = metrics.get(M.TIME_EVAL_S)
    return value if isinstance(value, int | float) and math.isfinite(value) and value > 0 else 0.0


def write_points(
    session: Session,
    run_id: int,
    steps: Sequence[StepPoints],
    rollouts: Iterable[RolloutPoint] = (),
    *,
    prompts: Iterable[PromptPoint] = (),
    owner_attempt: int | None = None,
    run_values: dict[str, Any] | None = None,
) -> Written:
    """Upsert metrics, rollouts and prompt pass rates; move the run's step, summary and
    ``run_values`` along: ``write_encoded`` of ``encode_points``.

    A handful of statements whatever the batch size (the caller commits):

    1. one UPDATE of the run: step only moves forward, the summary keeps each key's value at
       the highest step, ``write_seq`` goes up by one and every point written gets it as its
       ``seq``. It locks the run row, so writes of one run are serialised (and ``seq`` follows
       commit order). With ``owner_attempt`` only while that attempt still owns the running
       run; else nothing is written and ``owned`` is False.
    2. one DELETE of the rollup-cache rows of the written keys the new points fall into;
    3. the metric rows and the rollouts' rows (one per step, an array per field): on
       PostgreSQL, rows above the highest step already stored for their key (every row, in a
       run that only moves forward) go in with a binary COPY, the others with INSERT … ON
       CONFLICT DO UPDATE (a stored step's rollouts are read back and merged with the new
       ones first, so a rollout sent again replaces its twin and the others stay);
    4. the rollups of the written keys' complete buckets at the charts' widths
       (``backend.storage.series.refresh_rollups``: buckets made only of the written points
       aggregated in numpy and copied in; a series growing into a wider width has its narrower
       rows deleted and summed into the wider ones; the rest recomputed from their points in
       SQL, one aggregate per width);
    5. the prompt rows (``backend.storage.prompts``), one upsert.

    A (key, step) or (step, group, index) given twice keeps its last value. Columns are built
    with numpy: the per-point Python work is a list extend.
    """
    batch = encode_points(run_id, steps, rollouts, prompts)
    return write_encoded(session, run_id, batch, owner_attempt=owner_attempt, run_values=run_values)


def write_encoded(
    session: Session,
    run_id: int,
    batch: Encoded,
    *,
    owner_attempt: int | None = None,
    run_values: dict[str, Any] | None = None,
) -> Written:
    """``write_points`` of an encoded batch (``batch`` is only read: a retry can write it again)."""
    dialect = dialect_of(session)
    m, r, texts, p = batch.metrics, batch.rollouts, batch.texts, batch.prompts
    out = Written(last_step=batch.last_step, last_values=batch.last_values)
    values = dict(run_values or {})
    if batch.last_step is not None and batch.last_step_at is not None:
        values |= pace_values(
            batch.last_step, batch.last_step_at, batch.first_step, batch.eval_s, batch.first_eval_s
        )
    seq = _update_run(session, dialect, run_id, out, owner_attempt, values)
    if seq is None:
        out.owned = False
        return out
    out.seq = seq
    if len(m.step):
        session.execute(
            delete(MetricRollup).where(
                MetricRollup.run_id == run_id,
                MetricRollup.key.in_(m.keys),  # other keys' buckets keep their points
                MetricRollup.hi_step >= int(m.step.min()),
            )
        )
        before = dialect.write_metrics(session, run_id, seq, m)
        out.points = len(m.step)
        refresh_rollups(session, dialect, run_id, m, before)
    if len(r.step):
        out.rollouts = dialect.write_rollouts(session, run_id, r)
    if texts:
        dialect.upsert(session, ROLLOUT_TEXTS, texts, ROLLOUT_TEXT_KEY)  # type: ignore[arg-type]
    if p:
        out.prompts = write_prompts(session, dialect, p)
    return out


def _finite_array(values: Sequence[Any]) -> Any:
    """float64 array with None, NaN, ±Inf and |x| > MAX_ABS_VALUE as NaN (stored as NULL)."""
    arr = np.array(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        arr[~(np.abs(arr) <= MAX_ABS_VALUE)] = np.nan
    return arr


def _metric_columns(steps: Sequence[StepPoints]) -> MetricColumns:
    now = time.time()
    slot: dict[str, int] = {}  # key -> its code, in order of first appearance
    # A step's keys, in order -> their codes: steps mostly log the same keys, so the per-key
    # Python work is done once per distinct set, not once per point.
    layouts: dict[tuple[str, ...], Any] = {}
    code_parts: list[Any] = []
    value_col: list[Any] = []
    step_col: list[int] = []
    wall_col: list[float] = []
    for s in steps:
        n = len(s.metrics)
        if not n:
            continue
        wall = s.wall_time if s.wall_time is not None and finite(s.wall_time) is not None else now
        names = tuple(s.metrics)
        codes_of = layouts.get(names)
        if codes_of is None:
            codes_of = np.array([slot.setdefault(k, len(slot)) for k in names], dtype=np.int32)
            layouts[names] = codes_of
        code_parts.append(codes_of)
        value_col.extend(s.metrics.values())
        step_col.extend([s.step] * n)
        wall_col.extend([wall] * n)
    codes = np.concatenate(code_parts) if code_parts else np.zeros(0, dtype=np.int32)
    keys = sorted(slot)
    rank = np.empty(len(slot), dtype=np.int32)
    rank[[slot[k] for k in keys]] = np.arange(len(keys), dtype=np.int32)
    k = rank[codes]
    step = np.asarray(step_col, dtype=np.int64)
    pick = last_unique(k, step)
    return MetricColumns(
        keys,
        k[pick],
        step[pick],
        _finite_array(value_col)[pick],
        np.asarray(wall_col, dtype=np.float64)[pick],
    )


_GET = {name: operator.attrgetter(name) for name in ("group", "index", "reward", "score")}
_GET |= {
    name: operator.attrgetter(name) for name in ("length", "truncated", "prompt", "completion")
}


def _rollout_columns(
    run_id: int, steps: Sequence[StepPoints], extra: Iterable[Any]
) -> tuple[RolloutColumns, list[dict[str, Any]]]:
    """The rollouts' columns, and the ``rollout_texts`` rows of those that carry text (a later
    row of a key wins).

    A C-level pass over the rollouts per field, straight into numpy: no tuple per rollout (at
    64 rollouts a step, building those, and the garbage collector's passes over them, cost
    more than the whole COPY of the rows)."""
    extra = list(extra)
    every = [r for s in steps for r in s.rollouts] + extra
    n = len(every)
    counts = [len(s.rollouts) for s in steps]
    step = np.concatenate(
        [np.repeat(np.array([s.step for s in steps], dtype=np.int64), counts)]
        + [np.fromiter((r.step for r in extra), dtype=np.int64, count=len(extra))]
    )
    group, index, length = (
        np.fromiter(map(_GET[name], every), dtype=np.int64, count=n)
        for name in ("group", "index", "length")
    )
    truncated = np.fromiter(map(_GET["truncated"], every), dtype=bool, count=n)
    reward, score = (_finite_array(list(map(_GET[name], every))) for name in ("reward", "score"))
    columns = RolloutColumns.of(step, group, index, reward, score, length, truncated)
    texts: dict[tuple[int, int, int], dict[str, Any]] = {}
    try:
        prompt, completion = list(map(_GET["prompt"], every)), list(map(_GET["completion"], every))
    except AttributeError:  # duck-typed rollouts without text
        prompt = [getattr(r, "prompt", "") for r in every]
        completion = [getattr(r, "completion", "") for r in every]
    episode = [getattr(r, "episode", None) for r in every]
    critique = [getattr(r, "critique", None) for r in every]
    kept = [
        bool(p or c or e is not None or k is not None)
        for p, c, e, k in zip(prompt, completion, episode, critique, strict=True)
    ]
    for i in np.flatnonzero(kept):
        st, g, ix = int(step[i]), int(group[i]), int(index[i])
        said = critique[i]
        texts[(st, g, ix)] = {
            "run_id": run_id, "step": st, "group": g, "index": ix,
            "prompt": clip_text(prompt[i]), "completion": clip_text(completion[i]),
            # renderable: what the database and a response take (no lone surrogate, NaN)
            "episode": None if episode[i] is None else renderable(episode[i]),
            "critique": None if said is None else renderable(clip_text(str(said))),
        }  # fmt: skip
    return columns, list(texts.values())


def _update_run(
    session: Session,
    dialect: Dialect,
    run_id: int,
    out: Written,
    owner_attempt: int | None,
    values: dict[str, Any],
) -> int | None:
    """The run's new ``write_seq``, or None when the run is gone (or not owned)."""
    if owner_attempt is None:
        stmt = update(Run).where(Run.id == run_id)
    else:  # the lifecycle's rule: only the attempt that owns the running run writes
        stmt = update(Run).where(*owned_by(run_id, owner_attempt))
    values = {"updated_at": utcnow(), "write_seq": Run.write_seq + 1, **values}
    if out.last_step is not None:
        values |= dialect.advance_run(session, run_id, out.last_step, out.last_values)
    return session.execute(stmt.values(**values).returning(Run.write_seq)).scalar()
