"""Per-prompt pass rates: the bulk write, and the difficulty-over-time view read from them.

Write: ``prompt_rows`` turns steps' prompt records into ``prompt_stats`` rows (a (step, key)
given twice keeps its last counts) and ``write_prompts`` upserts them on (run_id, step,
prompt_key), so a re-emitted or redelivered step overwrites instead of duplicating.
``writes.write_points`` calls it inside the transaction that stores the step's metrics.

Read: ``prompt_difficulty`` reads the rows in step order once. Per step it counts the prompts
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
from typing import Any

import numpy as np
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


def prompt_difficulty(
    session: Session, run_id: int, step_min: int, step_max: int | None, max_steps: int
) -> dict[str, Any]:
    """Bands and fates (see the module docstring) for the steps with prompt data from
    ``step_min`` to ``step_max`` (None: the last), at most ``max_steps`` of them;
    ``next_step_min`` is where the next page starts (None when there is none).

    Vectorised over the rows (a 2,000-step run of 128 prompts is 256,000 of them): each row's
    fate is a function of its prompt's sightings so far, so the fate counts are a running sum of
    (this row's fate − the same prompt's previous fate) over the rows in step order.
    """
    stmt = select(PromptStat.step, PromptStat.prompt_key, PromptStat.n, PromptStat.correct)
    stmt = stmt.where(PromptStat.run_id == run_id)
    if step_max is not None:
        stmt = stmt.where(PromptStat.step <= step_max)
    rows = session.execute(stmt.order_by(PromptStat.step)).all()
    empty: dict[str, list[int]] = {name: [] for name in ("steps", "seen", *BANDS, *FATES)}
    if not rows:
        return {**empty, "next_step_min": None}
    step_col, key_col, n_col, correct_col = zip(*rows, strict=True)
    step = np.asarray(step_col, dtype=np.int64)
    n = np.asarray(n_col, dtype=np.int64)
    correct = np.asarray(correct_col, dtype=np.int64)
    slot: dict[str, int] = {}  # a code per prompt: cheaper than sorting the strings
    prompt = np.fromiter((slot.setdefault(k, len(slot)) for k in key_col), np.int64, len(key_col))
    steps, step_index = np.unique(step, return_inverse=True)
    ends = np.flatnonzero(np.append(step[1:] != step[:-1], True))  # last row of each step
    bands = _band_counts(n, correct, step_index, len(steps))
    fates, first = _fate_deltas(prompt, n, correct)
    out: dict[str, Any] = {"steps": steps, "seen": np.cumsum(first)[ends]}
    out |= {name: bands[:, i] for i, name in enumerate(BANDS)}
    out |= {name: np.cumsum(fates[:, i])[ends] for i, name in enumerate(FATES)}
    shown = np.flatnonzero(steps >= step_min)[:max_steps]
    after = shown[-1] + 1 if len(shown) else len(steps)
    page = {name: out[name][shown].tolist() for name in empty}
    return {**page, "next_step_min": int(steps[after]) if after < len(steps) else None}


def _band_counts(n: Any, correct: Any, step_index: Any, n_steps: int) -> Any:
    """(steps, 4) prompts per ``BANDS`` band at each step."""
    band = np.where(correct == 0, 0, np.where(correct >= n, 3, np.where(2 * correct < n, 1, 2)))
    counts = np.bincount(step_index * len(BANDS) + band, minlength=n_steps * len(BANDS))
    return counts.reshape(n_steps, len(BANDS))


def _fate_deltas(prompt: Any, n: Any, correct: Any) -> tuple[Any, Any]:
    """Per row (in step order): (rows, 4) change of each ``FATES`` count that this sighting
    makes, and whether it is the prompt's first sighting."""
    order = np.argsort(prompt, kind="stable")  # each prompt's rows together, in step order
    p = prompt[order]
    first = np.append(True, p[1:] != p[:-1])
    start = np.maximum.accumulate(np.where(first, np.arange(len(p)), 0))  # its first row

    def so_far(flag: Any) -> Any:  # how many of the prompt's sightings up to this row had it
        total = np.cumsum(flag)
        return total - (total - flag)[start]

    high = 2 * correct[order] >= n[order]
    ever_correct = so_far(correct[order] > 0) > 0
    always_all = so_far(correct[order] < n[order]) == 0
    first_high = high[start]
    fate = np.select(
        [~ever_correct, always_all, ~first_high & high, first_high & ~high], [2, 3, 0, 1], -1
    )
    before = np.where(first, -1, np.roll(fate, 1))  # the prompt's fate after its last sighting
    kinds = np.arange(len(FATES))
    delta = (fate[:, None] == kinds).astype(np.int64) - (before[:, None] == kinds)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return delta[back], first[back]
