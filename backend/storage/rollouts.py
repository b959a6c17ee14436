"""Per-rollout samples of a run, in (step, group, index) order.

A step's rollouts are one ``rollout_steps`` row of arrays; these reads unpack them into one
rollout each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import RolloutStep, RolloutText
from backend.storage.columns import RolloutColumns, none_if_nan

STEP_ROWS_PER_READ = 64  # rows of rollout_steps fetched at a time while a limit is not reached


def query_rollouts(
    session: Session,
    run_id: int,
    step_min: int | None,
    step_max: int | None,
    limit: int,
    text: bool = False,
) -> list[dict[str, Any]]:
    """The first ``limit`` rollouts of steps ``step_min``..``step_max``; with ``text``, each
    with its prompt and completion ("" when none was stored), its episode (None when it
    played none) and its critique (None when no reward gave one)."""
    items: list[dict[str, Any]] = []
    for r in _step_columns(session, run_id, step_min, step_max):
        items += _items(r, limit - len(items))
        if len(items) >= limit:
            break
    if text and items:
        texts = _texts(session, run_id, items[0]["step"], items[-1]["step"])
        for item in items:
            prompt, completion, episode, critique = texts.get(
                (item["step"], item["group"], item["index"]), ("", "", None, None)
            )
            item |= {
                "prompt": prompt,
                "completion": completion,
                "episode": episode,
                "critique": critique,
            }
    return items


def _step_columns(
    session: Session, run_id: int, step_min: int | None, step_max: int | None
) -> Iterator[RolloutColumns]:
    """The rollouts of the steps in range, a few steps at a time, in step order."""
    s = RolloutStep
    stmt = select(s.step, s.group, s.index, s.reward, s.score, s.length, s.truncated).where(
        s.run_id == run_id
    )
    if step_min is not None:
        stmt = stmt.where(s.step >= step_min)
    if step_max is not None:
        stmt = stmt.where(s.step <= step_max)
    after = None
    while True:
        page = stmt if after is None else stmt.where(s.step > after)
        rows = session.execute(page.order_by(s.step).limit(STEP_ROWS_PER_READ)).all()
        if rows:
            yield RolloutColumns.from_step_rows(rows)
        if len(rows) < STEP_ROWS_PER_READ:
            return
        after = rows[-1][0]


def _items(r: RolloutColumns, limit: int) -> list[dict[str, Any]]:
    cols = [c[:limit].tolist() for c in r.columns()]
    return [
        {
            "step": step,
            "group": group,
            "index": index,
            "reward": none_if_nan(reward),
            "score": none_if_nan(score),
            "length": length,
            "truncated": truncated,
        }  # fmt: skip
        for step, group, index, reward, score, length, truncated in zip(*cols, strict=True)
    ]


def _texts(
    session: Session, run_id: int, first: int, last: int
) -> dict[tuple[int, int, int], tuple[str, str, dict[str, Any] | None, str | None]]:
    t = RolloutText
    rows = session.execute(
        select(t.step, t.group, t.index, t.prompt, t.completion, t.episode, t.critique).where(
            t.run_id == run_id, t.step >= first, t.step <= last
        )
    )
    return {(step, g, i): (p, c, episode, k) for step, g, i, p, c, episode, k in rows}


def stored_texts(session: Session, run_id: int) -> list[tuple[str, str, float | None]]:
    """(prompt, completion, reward) of every rollout of ``run_id`` stored with its text, in
    (step, group, index) order (a job kind's inputs: DPO pairs from a run)."""
    t = RolloutText
    texts = session.execute(
        select(t.step, t.group, t.index, t.prompt, t.completion)
        .where(t.run_id == run_id)
        .order_by(t.step, t.group, t.index)
    ).all()
    if not texts:
        return []
    reward: dict[tuple[int, int, int], float | None] = {}
    for r in _step_columns(session, run_id, texts[0][0], texts[-1][0]):
        for step, g, i, value in zip(
            r.step.tolist(), r.group.tolist(), r.index.tolist(), r.reward.tolist(), strict=True
        ):
            reward[(step, g, i)] = none_if_nan(value)
    return [
        (prompt, completion, reward[(step, g, i)])
        for step, g, i, prompt, completion in texts
        if (step, g, i) in reward  # a text without its rollout's numbers is left out
    ]


def sampled_steps(session: Session, run_id: int) -> list[int]:
    """The steps of ``run_id`` with sampled rollouts, ascending (one ``rollout_steps`` row each:
    read from the primary key)."""
    s = RolloutStep
    return list(session.scalars(select(s.step).where(s.run_id == run_id).order_by(s.step)))


def group_prompts(session: Session, run_id: int, step: int) -> dict[int, str]:
    """The prompt of each group of ``run_id``'s rollouts at ``step`` stored with a prompt text
    (a group is one prompt's completions; were a group's texts to name several, the least in
    sort order). The database keeps one row per group and prompt: a step's completions are
    not read."""
    t = RolloutText
    rows = session.execute(
        select(t.group, t.prompt)
        .where(t.run_id == run_id, t.step == step, t.prompt != "")
        .distinct()
        .order_by(t.group, t.prompt)
    )
    prompts: dict[int, str] = {}
    for group, prompt in rows:
        prompts.setdefault(group, prompt)
    return prompts


def group_texts(
    session: Session, run_id: int, step: int, groups: Iterable[int]
) -> dict[tuple[int, int], tuple[str, dict[str, Any] | None, str | None]]:
    """(completion, episode, critique) of the rollouts of ``groups`` at ``step``, by (group,
    index): the texts of the groups a caller shows, not of the whole step."""
    wanted = sorted(set(groups))
    if not wanted:
        return {}
    t = RolloutText
    rows = session.execute(
        select(t.group, t.index, t.completion, t.episode, t.critique).where(
            t.run_id == run_id, t.step == step, t.group.in_(wanted)
        )
    )
    return {(g, i): (c, episode, k) for g, i, c, episode, k in rows}
