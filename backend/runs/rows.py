"""Making run rows: the one constructor of a queued run, and the unique names runs get.

``new_run`` is how every worker run is made (submitted runs, seeds, clones, a study's released
runs, a pipeline's stages): what it trains (``kind``, and the ``algorithm`` only for a kind that
trains one: ``conspo.registry.RegisteredJobKind``), its name, task and model all come from the
validated config, stored as validated. It makes the row; committing it and sending it are the
lifecycle's (``backend.runs.lifecycle``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.models import Run, RunStatus
from conspo.config import RunConfig
from conspo.registry import JOB_KINDS, get_job_kind

NAME_CHARS = 200  # runs.name
_SUFFIX = re.compile(r"-(\d{1,3})$")


STUDY_TAG = "study:"  # a study's runs are tagged study:<id>, then their arm's name


def study_tag(study_id: int) -> str:
    return f"{STUDY_TAG}{study_id}"


def arm_of(tags: Sequence[str] | None) -> str | None:
    """The study arm a run was made for (the tag after its ``study:<id>`` tag); None outside a
    study. Compare groups a study's runs by it (``group=arm``): its arms may differ in more than
    one path (ConSPO and its linear-contrast ablation share an algorithm)."""
    tags = list(tags or [])
    for i, tag in enumerate(tags[:-1]):
        if tag.startswith(STUDY_TAG):
            return tags[i + 1]
    return None


def default_name(config: RunConfig) -> str:
    trains = config.algorithm or config.kind  # what it trains: sft runs have no algorithm
    return config.name or f"{trains}-{config.task.name}-s{config.seed}"


def new_run(
    owner_id: int | None,
    config: RunConfig,
    *,
    tags: Sequence[str] = (),
    group_id: str | None = None,
) -> Run:
    """A queued run of ``config`` (its seed, its name or ``default_name``); not added to a
    session. The name is the wanted one: ``unique_names`` makes it free."""
    return Run(
        name=default_name(config),
        owner_id=owner_id,
        status=RunStatus.queued,
        kind=config.kind,
        algorithm=algorithm_of(config.kind, config.algorithm),
        task=config.task.name,
        model=config.model.name,
        config=config.model_dump(mode="json"),
        seed=config.seed,
        group_id=group_id,
        tags=list(dict.fromkeys(tags)),
        total_steps=config.steps,
        summary={},
    )


def algorithm_of(kind: str, algorithm: str | None) -> str | None:
    """The algorithm a run of ``kind`` trains with: None for a kind that trains none."""
    return get_job_kind(kind).algorithm_of(algorithm) if kind in JOB_KINDS.names() else algorithm


def run_label(kind: str, algorithm: str | None) -> str:
    """What a run trains, for people: ``rl · grpo``, ``sft`` (its kind's label; a kind no
    longer registered shows as its name)."""
    return get_job_kind(kind).label(algorithm) if kind in JOB_KINDS.names() else kind


def name_base(name: str) -> str:
    """``name`` without the ``-N`` suffix ``unique_names`` adds (a clone of ``x-2`` is ``x-3``)."""
    return _SUFFIX.sub("", name) or name


def unique_names(session: Session, wanted: Sequence[str]) -> list[str]:
    """Each wanted name as it is when free, else with the smallest free suffix ``-2``, ``-3``, …
    (free of stored runs and of the names picked before it in ``wanted``).

    Two sessions can pick the same free name at once: the unique index ``ux_runs_name`` makes
    the second commit fail, and ``commit_named`` picks again.
    """
    out: list[str] = []
    taken: dict[str, set[str]] = {}
    for name in wanted:
        base = name[: NAME_CHARS - 8]
        if base not in taken:
            like = Run.name.startswith(f"{base}-", autoescape=True)
            taken[base] = set(session.scalars(select(Run.name).where((Run.name == base) | like)))
        used = taken[base]
        pick, k = base, 2
        while pick in used:
            pick, k = f"{base}-{k}", k + 1
        used.add(pick)
        out.append(pick)
    return out


def name_uniquely(session: Session, runs: Sequence[Run]) -> None:
    """Give each of ``runs`` (named as wanted) a free name (``unique_names``)."""
    for run, name in zip(runs, unique_names(session, [r.name for r in runs]), strict=True):
        run.name = name


def commit_named(session: Session, runs: Sequence[Run], attempts: int = 5) -> None:
    """Add and commit ``runs`` under unique names (their ``name`` is the wanted one)."""
    wanted = [r.name for r in runs]
    for attempt in range(attempts):
        for run, name in zip(runs, unique_names(session, wanted), strict=True):
            run.name = name
        session.add_all(runs)
        try:
            session.commit()
            return
        except IntegrityError:  # a concurrent submission took one of the names: pick again
            session.rollback()
            if attempt == attempts - 1:
                raise
