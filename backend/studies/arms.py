"""A study's pending rows: one ``study_runs`` row per (arm, seed), each holding the config
its run will have (``service.release`` turns them into runs)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import Study, StudyRun, StudyRunState
from backend.studies.spec import row_arm, run_name
from conspo.config import RunConfig


def add_arms(
    session: Session,
    study: Study,
    seeds: Sequence[int],
    arms: Sequence[tuple[str, RunConfig]],
    *,
    trials: Sequence[int | None] | None = None,
) -> None:
    """Pending rows for ``arms`` × ``seeds``, released seed-major with the arms interleaved, so
    a study cut short still has whole seeds to pair (not all of one arm and none of another)."""
    start = (
        session.scalar(select(func.max(StudyRun.position)).where(StudyRun.study_id == study.id))
        or -1
    ) + 1
    order = [(s, a) for s in range(len(seeds)) for a in range(len(arms))]
    for position, (s, a) in enumerate(order, start):
        name, config = arms[a]
        seed = seeds[s]
        session.add(
            StudyRun(
                study_id=study.id,
                arm=row_arm(name, _task(study, config)),
                seed=seed,
                position=position,
                state=StudyRunState.pending,
                config=config.model_copy(
                    update={
                        "seed": seed,
                        "name": run_name(study.id, name, seed, _task(study, config)),
                    }
                ).model_dump(mode="json"),
                trial=trials[a] if trials else None,
            )
        )


def _task(study: Study, config: RunConfig) -> str | None:
    return config.task.name if study.spec.get("tasks") else None
