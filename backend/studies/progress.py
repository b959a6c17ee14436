"""A study's progress, defined once: the studies list, the study page and the runs list's study
row (which reads the studies list) all show this, so they cannot disagree.

* ``runs``: every (arm, seed) row it planned, released or not. A row the study cancelled before
  releasing it still counts, as a run that ended cancelled: a demo of 15 runs cancelled after
  two had started read "2 runs · 0/600" on the runs list and the studies list, and 15 runs on
  its page.
* ``counts``: its runs per status, a row without a run by its state (``pending``, or
  ``cancelled`` when the study stopped before releasing it).
* ``steps`` / ``total_steps``: steps done against steps planned, over every row (a row not
  released plans its config's steps). A run that ended early keeps its plan: the bar says how
  much of the planned work was done, ``counts`` and ``ended`` say why the rest will not be.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from backend.models import FINISHED, StudyRunState
from backend.storage import studies as stored
from backend.storage.studies import PlanRow

# The order statuses are listed in, here and on every page: what is moving first.
STATUS_ORDER = ("running", "queued", "pending", "succeeded", "failed", "cancelled")


def status_of(state: str, run_status: str | None) -> str:
    """A row's status: its run's once released, else its own state (pending, cancelled)."""
    return str(run_status) if run_status is not None else str(state)


def ended(status: str) -> bool:
    return status in FINISHED or status == StudyRunState.cancelled


def study_progress(rows: Iterable[PlanRow]) -> dict[str, Any]:
    """``runs`` planned, ``started`` (released), ``ended`` (succeeded, failed, cancelled, or
    cancelled before release), ``steps`` done, ``total_steps`` planned, ``counts`` per status
    (in ``STATUS_ORDER``)."""
    out: dict[str, Any] = {"runs": 0, "started": 0, "ended": 0, "steps": 0, "total_steps": 0}
    counts: dict[str, int] = {}
    for row in rows:
        status = status_of(row.state, row.status)
        out["runs"] += 1
        out["started"] += row.status is not None
        out["ended"] += ended(status)
        out["steps"] += row.step or 0
        # a released run's own total (its worker may correct it), else the row's plan
        out["total_steps"] += row.total_steps or row.planned_steps
        counts[status] = counts.get(status, 0) + 1
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    out["counts"] = dict(sorted(counts.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    return out


def progress_of(session: Session, study_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """``study_progress`` of each of these studies (one query for them all)."""
    rows: dict[int, list[PlanRow]] = {i: [] for i in study_ids}
    for row in stored.plan_rows(session, study_ids):
        rows[row.study_id].append(row)
    return {i: study_progress(r) for i, r in rows.items()}
