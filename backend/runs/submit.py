"""Submit-time checks: one function for every route that accepts a run config.

A config arrives by ``POST /api/runs``, a clone's overrides, a study's arms (every arm, over
every task it crosses) and every value of a search study's space, and a pipeline's stages. Each
names things a worker will read, load, start from or allocate: dataset files and directories,
models (``model.name``, a job kind's ``model_names`` such as distillation's teacher), runs
(``model.from_run``, DPO's ``kind_params.from_run``), optional packages, a sandbox for
model-written code (a tool such as ``python``), and sizes that set its memory. ``refuse_unfit``
checks all of them, with the operator's settings, for every config of one request, and raises
one ``InvalidInput`` (a 422) holding every problem, each located at the field as the request
spelled it; nothing is stored before it returns. Before those, the runs a config starts from
must be the caller's to use (``backend.runs.sharing``): another user's run that is not shared
is a ``Forbidden`` (a 403) located the same way. The rules are ``backend.runs.inputs`` (files,
models, memory, software, the sandbox) and ``backend.runs.chaining`` (runs started from); the
worker checks again with its own settings when it runs the config.

    refuse_unfit(session, settings, [Submitted(("body", "config"), config)], caller)
    warnings(config, settings)      # what is fit but worth a second look: said, not refused
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from backend import task_checks
from backend.config import Settings
from backend.errors import Busy, Forbidden, InvalidInput, dotted_loc
from backend.models import User
from backend.runs import chaining, inputs
from backend.runs.inputs import Loc, Problem
from conspo.access import DataFiles, Unavailable
from conspo.config import RunConfig
from conspo.tasks import make_task
from conspo.tasks.probe import TaskRefused, probed

# Under this many held-out problems an evaluation's accuracy moves in steps of over 3 points:
# worth saying at submit (not refusing: a small file of one's own is a fair thing to try).
MIN_HELD_OUT = 32
# A dataset file is read at submit to count its held-out problems only up to this size; a
# bigger one holds far more problems than MIN_HELD_OUT, or names its own eval_path.
COUNTED_DATASET_BYTES = 4 * 2**20


class Submitted(NamedTuple):
    loc: Loc  # where the request holds the config (or the overrides it was made from)
    config: RunConfig
    # a study's overrides: an error is named by their own spelling ("params.tau")
    overrides: dict[str, Any] | None = None


def problems(config: RunConfig, session: Session, settings: Settings) -> list[Problem]:
    """Everything ``config`` names that cannot be used here, as (where in the config, message,
    offending value)."""
    return [
        *inputs.missing_software(config, session, settings),
        *inputs.missing_sandbox(config, session, settings),
        *inputs.missing_plugins(config, session, settings),
        *inputs.problems(config, settings, inputs.auto_device(session, settings)),
        *chaining.start_problems(config, session, settings),
    ]


def refuse_unfit(
    session: Session, settings: Settings, configs: Iterable[Submitted], caller: User | None
) -> None:
    """A 403 naming each run a submitted config starts from that ``caller`` may not use, else a
    422 listing the problems of every submitted config, else nothing. ``caller`` None (a
    check that stores nothing, asked without a token) leaves the 403 to the submit itself."""
    configs = list(configs)
    if caller is not None:
        forbidden = _located(
            configs, lambda config: chaining.refused_starts(config, session, caller), "forbidden"
        )
        if forbidden:
            raise Forbidden(forbidden)
    errors = _located(configs, lambda config: problems(config, session, settings), "value_error")
    if not errors and caller is not None:
        # Building each task (in a probe helper, under a budget) only for configs that pass
        # the rest, and never for a check asked without a token.
        checks = task_checks.for_settings(settings)
        errors = _located(configs, checks.problems, "value_error")
    if errors:
        raise InvalidInput(errors)


def _located(
    configs: list[Submitted], found: Callable[[RunConfig], list[Problem]], kind: str
) -> list[dict[str, Any]]:
    """``found``'s problems of each config, located where the request holds them, each once."""
    errors: list[dict[str, Any]] = []
    for loc, config, overrides in configs:
        for where, message, value in found(config):
            inside = dotted_loc(where, overrides) if overrides else where
            error = {"type": kind, "loc": (*loc, *inside), "msg": message, "input": value}
            if error not in errors:
                errors.append(error)
    return errors


def warnings(config: RunConfig, settings: Settings) -> list[str]:
    """What the submit response says of a config it accepted: a held-out split too small to
    measure with (under ``MIN_HELD_OUT`` problems, where ``task.eval_size`` asks for more)."""
    limit = min(config.task.eval_size, MIN_HELD_OUT)
    found = held_out_problems(config, settings, limit)
    if found is None or found >= limit:
        return []
    return [held_out_warning(found)]


def held_out_warning(found: int) -> str:
    return (
        f"held-out split: {found} problem{'' if found == 1 else 's'}, under {MIN_HELD_OUT}: each"
        f" moves eval/accuracy by {100 / max(found, 1):.0f} points; a bigger dataset (or one of"
        " its own as task.params.eval_path) gives a steadier measure"
    )


def held_out_problems(config: RunConfig, settings: Settings, limit: int) -> int | None:
    """The distinct held-out problems a run of ``config`` would score, counted up to ``limit``;
    None where that is not known cheaply here: a procedural task's from its check (built in a
    probe helper, remembered), a task reading files by building it from them when they are
    small regular files."""
    if probed(config.task):
        try:
            probe = task_checks.for_settings(settings).probe(config.task, config.task.eval_size)
        except (TaskRefused, Busy):
            return None
        return None if probe.held_out is None else min(probe.held_out, limit)
    files = DataFiles(roots=tuple(settings.data_roots), max_bytes=COUNTED_DATASET_BYTES)
    try:  # a directory (a saved dataset) or a big file: not read here (Unavailable)
        return len(make_task(config.task, files).eval_examples(limit))
    except (Unavailable, ValueError, OSError):
        return None
