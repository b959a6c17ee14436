"""Rollouts across runs: several runs' sampled rollouts at one step, side by side per prompt.

Runs of a study at one seed draw the same prompts from the same weights (paired seeds), so at a
step group g of one run and group g of another usually hold the same prompt. Usually is not
always (another task, a resumed run, an external trainer): groups are paired by their prompt's
text (``conspo.sink.prompt_key`` of the stored prompt, ≤ 2,000 characters), never by their
number, and a prompt that a run did not sample at that step is said to be ``missing`` there. A
group stored without its prompt cannot be paired: it is a block of its own, ``key`` null.

Bounded: at most ``MAX_RUNS`` runs, each step's sample read up to ``READ_LIMIT`` rollouts per run
(the trainer's own cap on ``logging.rollout_sample``), and an answer of at most ``MAX_ROWS``
rollouts and about ``MAX_TEXT_CHARS`` characters of text, whole prompts at a time: what is left
out is counted (``left_out``), never cut mid-prompt. The counts (``prompts``, ``paired``,
``disagree``) are of every prompt of the step, read from the rollouts' numbers.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from backend.errors import InvalidInput
from backend.models import Run
from backend.runs.rows import arm_of
from backend.storage.rollouts import group_prompts, group_texts, query_rollouts, sampled_steps
from conspo.sink import prompt_key

MAX_RUNS = 8
MAX_ROWS = 1024  # rollouts in one answer
MAX_TEXT_CHARS = 4_000_000  # prompt, completion, critique and episode text in one answer
READ_LIMIT = 4096  # rollouts of one run's step read (LoggingConfig.rollout_sample's bound)
MAX_STEPS_LISTED = 2000  # steps in common listed for the picker (thinned evenly past it)
ROLLOUT_FIELDS = ("group", "index", "reward", "score", "length", "truncated", "completion",
                  "episode", "critique")  # fmt: skip


@dataclass
class _Block:
    """One prompt of the step: each run's rollouts of it, by run id."""

    key: str | None
    prompt: str
    rollouts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    columns: list[dict[str, Any]] = field(default_factory=list)  # _columns, once all are read

    @property
    def rows(self) -> int:
        return sum(map(len, self.rollouts.values()))


def rollouts_across(
    session: Session, runs: Sequence[Run], step: int | None, disagree: bool = False
) -> dict[str, Any]:
    """The runs' rollouts at ``step`` (None: the latest step every run sampled), one block per
    prompt with a column per run; ``disagree``: only the prompts some run solved (a rollout
    with reward > 0) and another run, with rewards for it, did not. A 422 (``InvalidInput``)
    when the runs share no sampled step, or ``step`` is not one of those they share."""
    common = _common_steps(session, runs)
    at = _chosen_step(common, step)
    blocks, cut = _blocks(session, runs, at)
    for b in blocks:
        b.columns = _columns(b, runs)
    paired = sum(not _missing(b, runs) for b in blocks)
    disagreeing = [b for b in blocks if _disagree(b.columns)]
    shown = disagreeing if disagree else blocks
    kept, left_out = _bounded(session, runs, at, shown)
    return {
        "step": at,
        "steps": _listed(common, at),
        "steps_in_common": len(common),
        "runs": [_run_out(r, blocks, cut[r.id]) for r in runs],
        "prompts": len(blocks),
        "paired": paired,
        "disagree": len(disagreeing),
        "items": [_block_out(b, runs) for b in kept],
        "left_out": left_out,
        "limits": {"runs": MAX_RUNS, "rows": MAX_ROWS, "text_chars": MAX_TEXT_CHARS},
    }


def _common_steps(session: Session, runs: Sequence[Run]) -> list[int]:
    steps = {r.id: sampled_steps(session, r.id) for r in runs}
    if none := [r.id for r in runs if not steps[r.id]]:
        said = ", ".join(map(str, none))
        raise InvalidInput.at(("query", "runs"), f"run(s) {said} sampled no rollouts")
    common = set(steps[runs[0].id]).intersection(*(steps[r.id] for r in runs[1:]))
    if not common:
        spans = "; ".join(f"run {i}: steps {s[0]}–{s[-1]}" for i, s in steps.items())
        raise InvalidInput.at(("query", "runs"), f"the runs sampled no step in common ({spans})")
    return sorted(common)


def _chosen_step(common: list[int], step: int | None) -> int:
    if step is None:
        return common[-1]
    if step in common:
        return step
    at = bisect.bisect_left(common, step)
    nearest = [common[i] for i in (at - 1, at) if 0 <= i < len(common)]
    raise InvalidInput.at(
        ("query", "step"),
        f"not every run sampled step {step}; the nearest they all sampled:"
        f" {' and '.join(map(str, nearest))} ({len(common)} steps in common,"
        f" {common[0]}–{common[-1]})",
        step,
    )


def _listed(common: list[int], at: int) -> list[int]:
    """The steps in common, thinned evenly to ``MAX_STEPS_LISTED`` (the first, the last and
    ``at`` always in)."""
    if len(common) <= MAX_STEPS_LISTED:
        return common
    every = len(common) / (MAX_STEPS_LISTED - 1)
    picked = {common[round(i * every)] for i in range(MAX_STEPS_LISTED - 1)}
    return sorted(picked | {common[-1], at})


def _blocks(
    session: Session, runs: Sequence[Run], step: int
) -> tuple[list[_Block], dict[int, bool]]:
    """Every prompt of the step in the order the runs first show it (the first run's groups,
    then what the next runs add), and for each run whether its read stopped at READ_LIMIT."""
    blocks: dict[str, _Block] = {}
    cut: dict[int, bool] = {}
    for run in runs:
        numbers = query_rollouts(session, run.id, step, step, READ_LIMIT)
        cut[run.id] = len(numbers) >= READ_LIMIT
        prompts = group_prompts(session, run.id, step)
        for r in numbers:
            text = prompts.get(r["group"])
            key = prompt_key(text) if text else f"unpaired:{run.id}:{r['group']}"
            block = blocks.setdefault(key, _Block(key if text else None, text or ""))
            block.rollouts.setdefault(run.id, []).append(r)
    return list(blocks.values()), cut


def _missing(block: _Block, runs: Sequence[Run]) -> list[int]:
    return [r.id for r in runs if r.id not in block.rollouts]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _columns(block: _Block, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per run (in the runs' order): its groups of the prompt and their statistics — n, how many
    rollouts were rewarded (reward > 0), the mean reward, and the score gap: the mean score of
    the rewarded rollouts minus that of the unrewarded ones (reward ≤ 0), when both exist. A
    rollout without a reward (or a score) is left out of what needs it."""
    out = []
    for run in runs:
        rows = block.rollouts.get(run.id, [])
        rewards = [r["reward"] for r in rows if r["reward"] is not None]
        pos = [r["score"] for r in rows if _rewarded(r) and r["score"] is not None]
        neg = [r["score"] for r in rows if _unrewarded(r) and r["score"] is not None]
        gap = None if not pos or not neg else _mean(pos) - _mean(neg)  # type: ignore[operator]
        out.append({
            "run_id": run.id,
            "groups": sorted({r["group"] for r in rows}),
            "n": len(rows),
            "rewarded": sum(map(_rewarded, rows)),
            "mean_reward": _mean(rewards),
            "score_gap": gap,
            "solved": (sum(map(_rewarded, rows)) > 0) if rewards else None,
        })  # fmt: skip
    return out


def _rewarded(r: dict[str, Any]) -> bool:
    return r["reward"] is not None and r["reward"] > 0


def _unrewarded(r: dict[str, Any]) -> bool:
    return r["reward"] is not None and r["reward"] <= 0


def _disagree(columns: list[dict[str, Any]]) -> bool:
    """Some run's group has a rewarded rollout and another run's, with rewards, has none."""
    solved = {c["solved"] for c in columns if c["solved"] is not None}
    return solved == {True, False}


def _bounded(
    session: Session, runs: Sequence[Run], step: int, blocks: list[_Block]
) -> tuple[list[_Block], int]:
    """The first blocks within MAX_ROWS rollouts (at least one), their rollouts given their
    texts, then cut to MAX_TEXT_CHARS; and how many blocks were left out."""
    kept: list[_Block] = []
    rows = 0
    for block in blocks:
        if kept and rows + block.rows > MAX_ROWS:
            break
        kept.append(block)
        rows += block.rows
    for run in runs:
        groups = {r["group"] for b in kept for r in b.rollouts.get(run.id, [])}
        texts = group_texts(session, run.id, step, groups)
        for b in kept:
            for r in b.rollouts.get(run.id, []):
                completion, episode, critique = texts.get(
                    (r["group"], r["index"]), ("", None, None)
                )
                r |= {"completion": completion, "episode": episode, "critique": critique}
    chars = 0
    for n, block in enumerate(kept):
        chars += len(block.prompt) + sum(_chars(r) for rs in block.rollouts.values() for r in rs)
        if n and chars > MAX_TEXT_CHARS:
            kept = kept[:n]
            break
    return kept, len(blocks) - len(kept)


def _chars(r: dict[str, Any]) -> int:
    episode = len(json.dumps(r["episode"])) if r["episode"] is not None else 0
    return len(r["completion"]) + len(r["critique"] or "") + episode


def _run_out(run: Run, blocks: list[_Block], cut: bool) -> dict[str, Any]:
    rows = [r for b in blocks for r in b.rollouts.get(run.id, [])]
    return {
        "id": run.id,
        "name": run.name,
        "algorithm": run.algorithm,
        "arm": arm_of(run.tags),
        "seed": run.seed,
        "status": run.status,
        "rollouts": len(rows),
        "prompts": sum(run.id in b.rollouts for b in blocks),
        "cut": cut,
    }


def _block_out(block: _Block, runs: Sequence[Run]) -> dict[str, Any]:
    for column in block.columns:
        rows = block.rollouts.get(column["run_id"], [])
        column["rollouts"] = [{k: r[k] for k in ROLLOUT_FIELDS} for r in rows]
    return {
        "key": block.key,
        "prompt": block.prompt,
        "missing": _missing(block, runs),
        "disagree": _disagree(block.columns),
        "columns": block.columns,
    }
