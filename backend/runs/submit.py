"""Submit-time checks: one function for every route that accepts a run config.

A config arrives by ``POST /api/runs``, a clone's overrides, a study's arms (every arm, over
every task it crosses) and every value of a search study's space, and a pipeline's stages. Each
names things a worker will read, load, start from or allocate: dataset files and directories,
models (``model.name``, a job kind's ``model_names`` such as distillation's teacher), runs
(``model.from_run``, DPO's ``kind_params.from_run``), optional packages, a sandbox for
model-written code (a tool such as ``python``), and sizes that set its memory. ``refuse_unfit``
checks all of them, with the operator's settings, for every config of one request, and raises
one ``InvalidInput`` (a 422) holding every problem, each located at the field as the request
spelled it; nothing is stored before it returns. The rules are ``backend.runs.inputs`` (files,
models, memory, software, the sandbox) and ``backend.runs.chaining`` (runs started from); the
worker checks again with its own settings when it runs the config.

    refuse_unfit(session, settings, [Submitted(("body", "config"), config)])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.errors import InvalidInput, dotted_loc
from backend.runs import chaining, inputs
from backend.runs.inputs import Loc, Problem
from conspo.config import RunConfig


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
        *inputs.problems(config, settings),
        *chaining.start_problems(config, session, settings),
    ]


def refuse_unfit(session: Session, settings: Settings, configs: Iterable[Submitted]) -> None:
    """A 422 listing the problems of every submitted config, or nothing."""
    errors: list[dict[str, Any]] = []
    for loc, config, overrides in configs:
        for where, message, value in problems(config, session, settings):
            inside = dotted_loc(where, overrides) if overrides else where
            error = {"type": "value_error", "loc": (*loc, *inside), "msg": message, "input": value}
            if error not in errors:
                errors.append(error)
    if errors:
        raise InvalidInput(errors)
