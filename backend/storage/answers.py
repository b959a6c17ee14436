"""Per-problem evaluation results (``eval_answers``): written with the step that evaluated (in
its transaction: a crash loses them with the step, a resumed run writes them again in place),
thinned to ``MAX_EVALUATIONS`` per run and source, and read across runs by problem.

A problem is the same across runs when its prompt is (``problem_key``, the prompt's hash): runs
of one task, template and seed hold the same held-out split, so a study's arms at one seed
answer the same problems."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from backend.models import EvalAnswer
from backend.schemas import renderable
from conspo.sink import AnswerRecord

# Evaluations a run keeps per source: past it, the interior evaluation closest to its
# neighbours goes (the first and the latest always stay), so what is kept stays evenly spread.
MAX_EVALUATIONS = 24


def _text(value: str) -> str:
    return str(renderable(value)).replace("\x00", "\ufffd")  # PostgreSQL's text takes no NUL


def write_answers(
    session: Session, run_id: int, by_step: Mapping[int, Sequence[AnswerRecord]]
) -> None:
    """Store each step's answers in place of any it had (a resumed run's second write of a
    step replaces the first), then thin the run's evaluations."""
    sources: set[str] = set()
    for step, answers in by_step.items():
        if not answers:
            continue
        these = {a.source for a in answers}
        sources |= these
        session.execute(
            delete(EvalAnswer).where(
                EvalAnswer.run_id == run_id, EvalAnswer.step == step, EvalAnswer.source.in_(these)
            )
        )
        rows = {
            (a.source, a.position): {
                "run_id": run_id,
                "step": step,
                "source": a.source,
                "position": a.position,
                "problem_key": a.key[:64],
                "prompt": _text(a.prompt),
                "reference": _text(a.reference),
                "answer": _text(a.answer),
                "solved": bool(a.solved),
                "score": renderable(a.score),
                "samples": a.samples,
                "samples_correct": a.samples_correct,
                "episode": None if a.episode is None else renderable(a.episode),
            }  # fmt: skip
            for a in answers
        }
        session.execute(insert(EvalAnswer), list(rows.values()))
    for source in sorted(sources):
        thin(session, run_id, source)


def thin(session: Session, run_id: int, source: str, keep: int = MAX_EVALUATIONS) -> list[int]:
    """Drop evaluations of (run, source) past ``keep``; the steps dropped."""
    steps = sorted(
        session.scalars(
            select(EvalAnswer.step)
            .where(EvalAnswer.run_id == run_id, EvalAnswer.source == source)
            .distinct()
        ).all()
    )
    dropped = []
    while len(steps) > max(keep, 2):
        i = min(range(1, len(steps) - 1), key=lambda j: (steps[j + 1] - steps[j - 1], steps[j]))
        dropped.append(steps.pop(i))
    if dropped:
        session.execute(
            delete(EvalAnswer).where(
                EvalAnswer.run_id == run_id,
                EvalAnswer.source == source,
                EvalAnswer.step.in_(dropped),
            )
        )
    return dropped


def evaluations(session: Session, run_ids: Iterable[int]) -> dict[int, dict[str, list[int]]]:
    """What each run holds: per source, its kept evaluation steps (ascending); a run with none
    is absent."""
    found: dict[int, dict[str, list[int]]] = {}
    rows = session.execute(
        select(EvalAnswer.run_id, EvalAnswer.source, EvalAnswer.step)
        .where(EvalAnswer.run_id.in_(list(run_ids)))
        .group_by(EvalAnswer.run_id, EvalAnswer.source, EvalAnswer.step)
        .order_by(EvalAnswer.run_id, EvalAnswer.source, EvalAnswer.step)
    )
    for run_id, source, step in rows:
        found.setdefault(run_id, {}).setdefault(source, []).append(step)
    return found


ROW_COLUMNS = (
    EvalAnswer.position, EvalAnswer.problem_key, EvalAnswer.solved, EvalAnswer.score,
    EvalAnswer.samples, EvalAnswer.samples_correct,
)  # fmt: skip
TEXT_COLUMNS = (EvalAnswer.prompt, EvalAnswer.reference, EvalAnswer.answer, EvalAnswer.episode)


def answers_at(
    session: Session, run_id: int, source: str, step: int, *, text: bool
) -> list[dict[str, Any]]:
    """A run's problems at one evaluation, by position; texts only with ``text``."""
    columns = ROW_COLUMNS + (TEXT_COLUMNS if text else (EvalAnswer.prompt,))
    rows = session.execute(
        select(*columns)
        .where(EvalAnswer.run_id == run_id, EvalAnswer.source == source, EvalAnswer.step == step)
        .order_by(EvalAnswer.position)
    )
    return [dict(r._mapping) for r in rows]


OUTCOME = ("position", "solved", "score", "samples", "samples_correct")


def outcomes(session: Session, run_id: int, source: str, step: int) -> dict[str, dict[str, Any]]:
    """A run's problems at one evaluation by ``problem_key``, numbers only (no text): what a
    comparison of many runs reads for every problem."""
    rows = session.execute(
        select(EvalAnswer.problem_key, *(getattr(EvalAnswer, c) for c in OUTCOME))
        .where(EvalAnswer.run_id == run_id, EvalAnswer.source == source, EvalAnswer.step == step)
        .order_by(EvalAnswer.position)
    ).all()
    return {row[0]: dict(zip(OUTCOME, row[1:], strict=True)) for row in rows}


def texts(
    session: Session,
    run_id: int,
    source: str,
    step: int,
    keys: Sequence[str],
    fields: Sequence[str] = ("prompt",),
) -> dict[str, dict[str, Any]]:
    """``fields`` (prompt, reference, answer, episode) of each of ``keys`` as the run's
    evaluation at ``step`` stored them, by problem key: the texts of one page of problems."""
    if not keys:
        return {}
    rows = session.execute(
        select(EvalAnswer.problem_key, *(getattr(EvalAnswer, f) for f in fields)).where(
            EvalAnswer.run_id == run_id,
            EvalAnswer.source == source,
            EvalAnswer.step == step,
            EvalAnswer.problem_key.in_(list(keys)),
        )
    )
    return {row[0]: dict(zip(fields, row[1:], strict=True)) for row in rows}


def history(session: Session, run_id: int, source: str, problem_key: str) -> list[dict[str, Any]]:
    """One problem across a run's evaluations: each step's answer and outcome."""
    rows = session.execute(
        select(
            EvalAnswer.step,
            EvalAnswer.solved,
            EvalAnswer.score,
            EvalAnswer.samples,
            EvalAnswer.samples_correct,
            EvalAnswer.answer,
        )  # fmt: skip
        .where(
            EvalAnswer.run_id == run_id,
            EvalAnswer.source == source,
            EvalAnswer.problem_key == problem_key,
        )
        .order_by(EvalAnswer.step)
    )
    return [dict(r._mapping) for r in rows]


def count(session: Session, run_id: int) -> int:
    return int(session.scalar(select(func.count()).where(EvalAnswer.run_id == run_id)) or 0)
