"""Per-prompt pass rates: the bulk write, and the difficulty-over-time view read from them.

Write: ``prompt_rows`` turns steps' prompt records into ``prompt_stats`` rows (a (step, key)
given twice keeps its last counts) and ``write_prompts`` upserts them on (run_id, step,
prompt_key), so a re-emitted or redelivered step overwrites instead of duplicating.
``writes.write_points`` calls it inside the transaction that stores the step's metrics.

Read: ``prompt_difficulty`` walks the rows in step order once. Per step it counts the prompts
sampled at that step by pass-rate band (``BANDS``), and, over every prompt seen up to that
step (from step 1, whatever the range asked for), how many have each fate (``FATES``):

* learned: pass rate < 0.5 at its first sighting, ≥ 0.5 at its latest;
* forgotten: ≥ 0.5 at its first sighting, < 0.5 at its latest;
* never solved: no correct rollout at any sighting so far;
* always solved: every rollout correct at every sighting so far.

A prompt has at most one fate (a never-solved prompt stays below 0.5, an always-solved one at 1);
one that is neither (say, 0.25 then 0.25) counts only in ``seen``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from backend.models import PromptStat
from backend.storage.dialect import Dialect

PROMPT_STATS: Table = PromptStat.__table__  # type: ignore[assignment]
PROMPT_KEY = ("run_id", "step", "prompt_key")
BANDS = ("zero", "low", "high", "one")  # pass rate 0, (0, 0.5), [0.5, 1), 1
FATES = ("learned", "forgotten", "never_solved", "always_solved")


@dataclass
class PromptPoint:
    """One prompt at one step, as the external logging endpoint receives it."""

    step: int
    key: str
    n: int
    correct: int


def prompt_rows(
    run_id: int, per_step: Iterable[tuple[int, Sequence[Any]]], extra: Iterable[PromptPoint]
) -> list[dict[str, Any]]:
    """Rows for ``prompt_stats``: ``per_step`` pairs a step with objects having ``key``, ``n``
    and ``correct`` (``conspo.sink.PromptRecord``); ``extra`` carries its own steps."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    points = [(step, p) for step, prompts in per_step for p in prompts]
    points += [(p.step, p) for p in extra]
    for step, p in points:
        rows[(step, p.key)] = {
            "run_id": run_id, "step": step, "prompt_key": p.key, "n": p.n, "correct": p.correct,
        }  # fmt: skip
    return list(rows.values())


def write_prompts(session: Session, dialect: Dialect, rows: Sequence[dict[str, Any]]) -> int:
    """Upsert the rows (one statement on PostgreSQL); the caller holds the run row's lock."""
    return dialect.upsert(session, PROMPT_STATS, rows, PROMPT_KEY)


def band(n: int, correct: int) -> int:
    """Index into ``BANDS`` of a pass rate correct / n (n ≥ 1)."""
    if correct == 0:
        return 0
    if correct >= n:
        return 3
    return 1 if 2 * correct < n else 2


@dataclass
class _History:
    """What a prompt's fate depends on: its first and latest sighting, and every one between."""

    first_high: bool
    latest_high: bool
    ever_correct: bool
    always_all: bool

    def fate(self) -> int | None:
        """Index into ``FATES``, or None."""
        if not self.ever_correct:
            return 2
        if self.always_all:
            return 3
        if self.first_high != self.latest_high:
            return 1 if self.first_high else 0
        return None


def prompt_difficulty(
    session: Session, run_id: int, step_min: int, step_max: int | None, max_steps: int
) -> dict[str, Any]:
    """Bands and fates (see the module docstring) for the steps with prompt data from
    ``step_min`` to ``step_max`` (None: the last), at most ``max_steps`` of them;
    ``next_step_min`` is where the next page starts (None when there is none)."""
    stmt = select(PromptStat.step, PromptStat.prompt_key, PromptStat.n, PromptStat.correct)
    stmt = stmt.where(PromptStat.run_id == run_id)
    if step_max is not None:
        stmt = stmt.where(PromptStat.step <= step_max)
    stmt = stmt.order_by(PromptStat.step).execution_options(yield_per=10_000)
    out: dict[str, Any] = {"steps": [], "seen": [], "next_step_min": None}
    out |= {name: [] for name in (*BANDS, *FATES)}
    history: dict[str, _History] = {}
    fates = [0] * len(FATES)
    result = session.execute(stmt)
    try:
        for step, rows in groupby(result, key=itemgetter(0)):
            if step >= step_min and len(out["steps"]) == max_steps:
                out["next_step_min"] = step
                break
            bands = [0] * len(BANDS)
            for _, key, n, correct in rows:
                bands[band(n, correct)] += 1
                _sight(history, fates, key, high=2 * correct >= n, correct=correct, n=n)
            if step >= step_min:
                out["steps"].append(step)
                out["seen"].append(len(history))
                for name, count in zip((*BANDS, *FATES), (*bands, *fates), strict=True):
                    out[name].append(count)
    finally:
        result.close()
    return out


def _sight(
    history: dict[str, _History], fates: list[int], key: str, *, high: bool, correct: int, n: int
) -> None:
    """Record one sighting of ``key`` and move the fate counts along."""
    h = history.get(key)
    if h is None:
        h = history[key] = _History(high, high, correct > 0, correct >= n)
    else:
        if (old := h.fate()) is not None:
            fates[old] -= 1
        h.latest_high = high
        h.ever_correct |= correct > 0
        h.always_all &= correct >= n
    if (new := h.fate()) is not None:
        fates[new] += 1
