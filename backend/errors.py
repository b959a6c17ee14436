"""Domain errors: refusals in the user's terms, raised by the domain modules (lifecycle,
submit checks, studies, pipelines) whoever calls them (the API, the CLI, the worker).

``backend.api.errors`` is the one place each class becomes an HTTP status; nothing below the
API raises FastAPI's exceptions.

``dotted_loc`` names an error by an override's own spelling (``params.tau``): a study's arm
validation (``backend.studies.spec``) and the submit checks (``backend.runs.submit``) both
locate errors with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Loc = tuple[str | int, ...]


class DomainError(Exception):
    """A refusal; the message says why in the user's terms."""


class InvalidInput(DomainError):
    """Input that cannot be used, field by field (HTTP 422 located at each field): each error
    is pydantic's shape, ``{"type", "loc", "msg", "input"?}``."""

    def __init__(self, errors: Sequence[Mapping[str, Any]]) -> None:
        self.errors = [dict(e) for e in errors]
        super().__init__("; ".join(f"{_dotted(e['loc'])}: {e['msg']}" for e in self.errors))

    @classmethod
    def at(cls, loc: Loc, message: str, value: Any = None) -> InvalidInput:
        """One problem at ``loc`` (with the refused ``value``, if any)."""
        error: dict[str, Any] = {"type": "value_error", "loc": loc, "msg": message}
        if value is not None:
            error["input"] = value
        return cls([error])

    def under(self, prefix: Loc) -> InvalidInput:
        """The same errors located under ``prefix`` (``body``, ``body.overrides``)."""
        return InvalidInput([{**e, "loc": (*prefix, *e["loc"])} for e in self.errors])


class Busy(DomainError):
    """A bounded resource stayed full for the request's whole wait (HTTP 503 with Retry-After):
    the task-check helpers (``backend.task_checks``)."""


class Forbidden(DomainError):
    """Input naming something the caller may not use (HTTP 403), field by field in
    ``InvalidInput``'s shape: another user's run that is not shared, started from by a config
    (``backend.runs.sharing``)."""

    def __init__(self, errors: Sequence[Mapping[str, Any]]) -> None:
        self.errors = [dict(e) for e in errors]
        super().__init__("; ".join(f"{_dotted(e['loc'])}: {e['msg']}" for e in self.errors))


def dotted_loc(loc: tuple[Any, ...], overrides: dict[str, Any]) -> tuple[Any, ...]:
    """Name an error by the override's own spelling when it used a dotted path: the override
    at or above the error's field, else the first one inside a section the error names (a
    memory refusal names ``sampling``; the override was ``sampling.max_new_tokens``)."""
    text = ".".join(str(p) for p in loc)
    for key in overrides:
        if "." in key and (text == key or text.startswith(key + ".")):
            return (key, *loc[len(key.split(".")) :])
    inside = next((key for key in overrides if text and key.startswith(text + ".")), None)
    return (inside,) if inside is not None else loc


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc)
