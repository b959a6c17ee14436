"""Whose checkpoints a caller may use: a run's model (its checkpoints, its stored rollouts) is its
owner's until the owner shares it (``Run.model_shared``, set by ``PATCH /api/runs/{id}``).

The rule, in one place (``may_use``): the run's owner, an admin, or anyone once it is shared.
A model trained from another user's model carries it, so the rule follows the lineage
(``model.from_run``, then that run's, ...): ``first_refused`` is the nearest run of a chain the
caller may not use. Applied by

* the submit checks (``backend.runs.chaining.refused_starts``): starting from a run
  (``model.from_run``: the run and its lineage) or reading its rollouts (a job kind's input
  runs such as DPO's ``kind_params.from_run``: that run);
* the export of a model (``POST /api/models/{run_id}/export``): every run of its lineage;
* the model registry (``GET /api/models``), which says what the caller may do with each.

Checked when a config is submitted, not again by the worker: a run queued (or a study's or a
pipeline's run planned) while the model was shared still trains from it after its owner stops
sharing; sharing governs what is submitted and exported from then on.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

from sqlalchemy.orm import Session

from backend.models import Run, User


def may_use(run: Run, user: User) -> bool:
    """Whether ``user`` may start from ``run``'s model, read its rollouts or export what was
    trained from it: theirs, shared by its owner, or an admin."""
    return user.is_admin or run.owner_id == user.id or run.model_shared


def trained_from(session: Session, run: Run) -> Iterator[Run]:
    """The runs ``run``'s model was trained from (its ``model.from_run``, then that run's, ...),
    nearest first, while they exist (a deleted run ends the chain: nothing is left of it)."""
    seen = {run.id}
    current = run
    while (source := _from_run(current)) is not None and source not in seen:
        seen.add(source)
        previous = session.get(Run, source)
        if previous is None:
            return
        yield previous
        current = previous


def first_refused(session: Session, run: Run, user: User, *, itself: bool = True) -> Run | None:
    """The nearest run of ``run``'s lineage (``run`` itself first, unless ``itself`` is False)
    that ``user`` may not use; None when they may use all of it."""
    if user.is_admin:
        return None
    lineage = chain([run] if itself else [], trained_from(session, run))
    return next((r for r in lineage if not may_use(r, user)), None)


def refusal(named: Run, refused: Run, action: str) -> str:
    """Why ``action`` (what the caller asked, said of ``named``) is refused: ``refused``, which
    is ``named`` or a run of its lineage, belongs to someone else and is not shared."""
    owner = refused.owner.name if refused.owner is not None else "a deleted user"
    head = (
        f"run {refused.id}"
        if refused.id == named.id
        else f"run {named.id} was trained from run {refused.id}, which"
    )
    return (
        f"{head} belongs to {owner} and is not shared: {action} needs {owner} to share it first"
        f' (PATCH /api/runs/{refused.id} {{"model_shared": true}}) or an admin'
    )


def _from_run(run: Run) -> int | None:
    """The run ``run`` started from, read defensively: an old or external row's config may not
    be a RunConfig."""
    model = run.config.get("model") if isinstance(run.config, dict) else None
    source = model.get("from_run") if isinstance(model, dict) else None
    return source if isinstance(source, int) and not isinstance(source, bool) else None
