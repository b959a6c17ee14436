"""The columns the storage writes and reads in bulk, as numpy arrays: points, rollouts and
rollups of one run, each with ``rows`` for a dialect that writes row by row. Plain values shared
by ``writes``, ``series`` and both dialects (they import this module, never each other)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

    def rows(self, run_id: int) -> list[dict[str, Any]]:
        """The rollouts as ``rollouts`` rows (NaN back to None), for a row-wise upsert."""
        return [
            {
                "run_id": run_id,
                "step": st,
                "group": g,
                "index": i,
                "reward": none_if_nan(rw),
                "score": none_if_nan(sc),
                "length": ln,
                "truncated": bool(tr),
            }
            for st, g, i, rw, sc, ln, tr in zip(*(c.tolist() for c in self.columns()), strict=True)
        ]


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
