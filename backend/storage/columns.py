"""The columns the storage writes and reads in bulk, as numpy arrays: points, rollouts and
rollups of one run, each with ``rows`` for a dialect that writes row by row. Plain values shared
by ``writes``, ``series`` and both dialects (they import this module, never each other)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from sqlalchemy import Table

from backend.models import MetricRollup

ROLLUPS: Table = MetricRollup.__table__  # type: ignore[assignment]
ROLLUP_KEY = ("run_id", "key", "width", "bucket")


@dataclass
class MetricColumns:
    """Points sorted by (key, step), one per (key, step); NULL values as NaN."""

    keys: list[str]  # sorted; ``k`` indexes it
    k: Any  # (n,) int32
    step: Any  # (n,) int64
    value: Any  # (n,) float64
    wall: Any  # (n,) float64

    def rows(self, run_id: int, seq: int) -> list[dict[str, Any]]:
        """The points as ``metrics`` rows (NaN back to None), for a row-wise upsert."""
        keys = self.keys
        cols = (self.k.tolist(), self.step.tolist(), self.value.tolist(), self.wall.tolist())
        return [
            {"run_id": run_id, "key": keys[k], "step": st, "value": none_if_nan(v)}
            | {"wall_time": w, "seq": seq}
            for k, st, v, w in zip(*cols, strict=True)
        ]


@dataclass
class RolloutColumns:
    """Rollouts sorted by (step, group, index), one per key; NULL reward/score as NaN. Stored
    one row per step (``rollout_steps``): ``step_bounds`` cuts the columns into those rows."""

    step: Any
    group: Any
    index: Any
    reward: Any
    score: Any
    length: Any
    truncated: Any

    FIELDS = ("step", "group", "index", "reward", "score", "length", "truncated")
    ARRAYS = FIELDS[1:]  # the array columns of a ``rollout_steps`` row

    def columns(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    @classmethod
    def of(cls, step: Any, group: Any, index: Any, reward: Any, score: Any, length: Any,
           truncated: Any) -> RolloutColumns:  # fmt: skip
        """Columns of rollouts in any order, sorted by (step, group, index); of rows given twice
        the later one is kept."""
        step, group, index, length = (
            np.asarray(c, dtype=np.int64) for c in (step, group, index, length)
        )
        reward, score = (np.asarray(c, dtype=np.float64) for c in (reward, score))
        pick = last_unique(step, group, index)
        truncated = np.asarray(truncated, dtype=bool)
        return cls(*(c[pick] for c in (step, group, index, reward, score, length, truncated)))

    @classmethod
    def from_step_rows(cls, rows: Iterable[Sequence[Any]]) -> RolloutColumns:
        """The rollouts of ``rollout_steps`` rows given as (step, *ARRAYS) (a None element of
        reward or score as NaN), rows in step order."""
        rows = list(rows)
        step = np.repeat(np.array([r[0] for r in rows], dtype=np.int64), [len(r[1]) for r in rows])
        flat = [list(chain.from_iterable(r[j] for r in rows)) for j in range(1, 7)]
        group, index, length = (np.array(flat[j], dtype=np.int64) for j in (0, 1, 4))
        reward, score = (np.array(flat[j], dtype=np.float64) for j in (2, 3))  # None: NaN
        return cls(step, group, index, reward, score, length, np.array(flat[5], dtype=bool))

    def step_bounds(self) -> Any:
        """Row boundaries of each step: step j's rollouts are rows bounds[j]..bounds[j+1]-1."""
        starts = np.flatnonzero(np.append(True, self.step[1:] != self.step[:-1]))
        return np.append(starts, len(self.step)) if len(self.step) else np.zeros(1, np.int64)

    def take(self, rows: Any) -> RolloutColumns:
        """The rollouts selected by ``rows`` (a boolean mask or indices)."""
        return RolloutColumns(*(c[rows] for c in self.columns()))

    def over(self, stored: RolloutColumns) -> RolloutColumns:
        """These rollouts written over ``stored`` ones: the stored rollouts of these steps that
        these do not replace, and these (``stored`` may hold other steps: they are left out)."""
        keep = stored.take(np.isin(stored.step, self.step))
        both = [np.concatenate([a, b]) for a, b in zip(keep.columns(), self.columns(), strict=True)]
        return RolloutColumns.of(*both)

    def step_rows(self, run_id: int) -> list[dict[str, Any]]:
        """The rollouts as ``rollout_steps`` rows (NaN as None), for a row-wise upsert."""
        bounds = self.step_bounds().tolist()
        cols = {name: getattr(self, name).tolist() for name in self.ARRAYS}
        for name in ("reward", "score"):
            cols[name] = [none_if_nan(v) for v in cols[name]]
        steps = self.step.tolist()
        return [
            {"run_id": run_id, "step": steps[a]} | {n: c[a:b] for n, c in cols.items()}
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]


def last_unique(*sort_keys: Any) -> Any:
    """Indices that sort by ``sort_keys`` (most significant first), keeping the last of equals."""
    n = len(sort_keys[0])
    if n <= 1 or _strictly_increasing(*sort_keys):  # the usual batch: in order, no repeats
        return np.arange(n)
    order = np.lexsort((np.arange(n), *reversed(sort_keys)))
    keep = np.ones(n, dtype=bool)
    same = np.ones(n - 1, dtype=bool)
    for key in sort_keys:
        sk = key[order]
        same &= sk[1:] == sk[:-1]
    keep[:-1] = ~same  # a row followed by an equal one is superseded by it
    return order[keep]


def _strictly_increasing(*sort_keys: Any) -> bool:
    """Whether the rows are in strictly increasing order of ``sort_keys`` (most significant
    first)."""
    later = np.zeros(len(sort_keys[0]) - 1, dtype=bool)  # row i+1 already after row i
    tied = np.ones(len(sort_keys[0]) - 1, dtype=bool)  # equal so far
    for key in sort_keys:
        later |= tied & (key[1:] > key[:-1])
        tied &= key[1:] == key[:-1]
    return bool(later.all())


def none_if_nan(v: float) -> float | None:
    return None if v != v else v


@dataclass
class RollupColumns:
    """``metric_rollups`` rows of one run as columns, NULL floats as NaN."""

    keys: list[str]  # ``k`` indexes it
    k: Any  # (n,) int
    width: Any  # (n,) int
    bucket: Any  # (n,) int64
    n: Any  # (n,) int: points in the bucket
    n_valid: Any  # (n,) int: non-NULL values
    v_sum: Any  # (n,) float64
    v_min: Any
    v_max: Any
    last_step: Any  # (n,) int
    last_wall: Any  # (n,) float64

    def rows(self, run_id: int) -> list[dict[str, Any]]:
        """The rollups as ``metric_rollups`` rows (NaN back to None), for a row-wise upsert."""
        names = ("width", "bucket", "n", "n_valid", "v_sum", "v_min", "v_max", "last_step")
        cols = [getattr(self, name).tolist() for name in (*names, "last_wall")]
        out = []
        for k, *values in zip(self.k.tolist(), *cols, strict=True):
            row = dict(zip((*names, "last_wall"), values, strict=True))
            for name in ("v_sum", "v_min", "v_max"):
                row[name] = None if row[name] != row[name] else row[name]
            row |= {"run_id": run_id, "key": self.keys[k]}
            out.append(row | {"hi_step": (row["bucket"] + 1) * row["width"] - 1})
        return out


def rollup_rows(
    run_id: int, key: str, width: int, new: dict[str, list[Any]], keep: Callable[[int], bool]
) -> list[dict[str, Any]]:
    """``metric_rollups`` rows of the buckets of ``new`` that ``keep`` accepts."""
    rows = []
    for i, b in enumerate(new["bucket"]):
        if keep(b):
            mean, n_valid = new["mean"][i], new["n_valid"][i]
            rows.append(
                {
                    "run_id": run_id,
                    "key": key,
                    "width": width,
                    "bucket": b,
                    "hi_step": (b + 1) * width - 1,
                    "n": new["n"][i],
                    "n_valid": n_valid,
                    "v_sum": None if mean is None else mean * n_valid,
                    "v_min": new["v_min"][i],
                    "v_max": new["v_max"][i],
                    "last_step": new["last_step"][i],
                    "last_wall": new["last_wall"][i],
                }
            )
    return rows
