"""Which rules fire, for which runs: one pass over every rule (``fire_due``), each firing
inserted once per (rule, run) whoever inserts it first."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from backend.models import (
    FINISHED,
    AlertFiring,
    AlertRule,
    Metric,
    Run,
    RunStatus,
    StudyRun,
    utcnow,
)

MAX_ERROR_CHARS = 300  # of a failed run's error, in a message


@dataclass(frozen=True)
class Fired:
    rule_id: int
    run_id: int
    event: str
    message: str
    step: int | None = None
    value: float | None = None


def in_scope(rule: AlertRule) -> ColumnElement[bool]:
    """The runs ``rule`` watches: its run, its study's runs, or its owner's runs."""
    if rule.run_id is not None:
        return Run.id == rule.run_id
    if rule.study_id is not None:
        members = select(StudyRun.run_id).where(
            StudyRun.study_id == rule.study_id, StudyRun.run_id.is_not(None)
        )
        return Run.id.in_(members)
    return Run.owner_id == rule.owner_id


def _not_fired(rule: AlertRule) -> ColumnElement[bool]:
    return ~exists().where(AlertFiring.rule_id == rule.id, AlertFiring.run_id == Run.id)


def _label(run_id: int, name: str) -> str:
    return f"run #{run_id} {name!r}"


def _first_line(text: str | None) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "no error recorded"
    return line[:MAX_ERROR_CHARS]


def firings(session: Session, rule: AlertRule, now: datetime) -> Iterator[Fired]:
    """What ``rule`` fires for now, for runs it has not fired for yet."""
    where = [in_scope(rule), _not_fired(rule)]
    if rule.event in ("failed", "finished"):
        ended = [RunStatus.failed] if rule.event == "failed" else list(FINISHED)
        rows = session.execute(
            select(Run.id, Run.name, Run.status, Run.step, Run.error).where(
                *where, Run.status.in_(ended), Run.finished_at >= rule.created_at
            )
        )
        for run_id, name, status, step, error in rows:
            said = f": {_first_line(error)}" if status == RunStatus.failed else ""
            message = f"{_label(run_id, name)} {status} at step {step}{said}"
            yield Fired(rule.id, run_id, rule.event, message, step)
    elif rule.event == "stalled":
        quiet = rule.stall_s or 600.0
        since = time.time() - quiet
        quiet_rows = session.execute(
            select(Run.id, Run.name, Run.step).where(
                *where,
                Run.status == RunStatus.running,
                or_(
                    Run.last_step_at < since,
                    and_(
                        Run.last_step_at.is_(None), Run.started_at < now - timedelta(seconds=quiet)
                    ),
                ),
            )
        )
        for run_id, name, step in quiet_rows:
            message = (
                f"{_label(run_id, name)} stalled: no step for {quiet / 60:g} min (at step {step})"
            )
            yield Fired(rule.id, run_id, "stalled", message, step)
    elif rule.event == "metric" and rule.metric_key:
        yield from _metric_firings(session, rule, where)


def _metric_firings(session: Session, rule: AlertRule, where: list[Any]) -> Iterator[Fired]:
    watched = select(Run.id).where(
        *where, or_(Run.status == RunStatus.running, Run.finished_at >= rule.created_at)
    )
    crossed: ColumnElement[bool]
    if rule.comparison == "nonfinite":
        crossed = Metric.value.is_(None)
    elif rule.comparison == "below":
        crossed = Metric.value < rule.threshold
    else:
        crossed = Metric.value > rule.threshold
    first = (
        select(Metric.run_id, func.min(Metric.step).label("step"))
        .where(Metric.key == rule.metric_key, Metric.run_id.in_(watched), crossed)
        .group_by(Metric.run_id)
        .subquery()
    )
    rows = session.execute(
        select(Run.id, Run.name, Metric.step, Metric.value)
        .join(first, first.c.run_id == Run.id)
        .join(
            Metric,
            and_(
                Metric.run_id == first.c.run_id,
                Metric.key == rule.metric_key,
                Metric.step == first.c.step,
            ),
        )
    )
    for run_id, name, step, value in rows:
        if rule.comparison == "nonfinite":
            what = "is not finite"
        else:
            what = f"= {value:.6g}, {rule.comparison} {rule.threshold:g}"
        message = f"{_label(run_id, name)}: {rule.metric_key} {what} at step {step}"
        yield Fired(rule.id, run_id, "metric", message, step, value)


def fire_due(session: Session, now: datetime | None = None) -> int:
    """Insert a firing for every (rule, run) that fires now and has none; how many this
    process inserted (another process may have inserted the same ones: the unique index keeps
    one)."""
    now = now or utcnow()
    inserted = 0
    for rule in session.scalars(select(AlertRule).order_by(AlertRule.id)).all():
        for fired in list(firings(session, rule, now)):
            inserted += _insert_once(session, fired, now)
    session.commit()
    return inserted


def _insert_once(session: Session, fired: Fired, now: datetime) -> int:
    values = {
        "rule_id": fired.rule_id,
        "run_id": fired.run_id,
        "event": fired.event,
        "message": fired.message,
        "step": fired.step,
        "value": fired.value,
        "created_at": now,
        "state": "pending",
        "attempts": 0,
        "next_attempt_at": now,
    }
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = (
        insert(AlertFiring)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["rule_id", "run_id"])
    )
    return int(session.execute(stmt).rowcount or 0)  # type: ignore[attr-defined]
