"""Domain errors: refusals in the user's terms, raised by the domain modules (lifecycle,
submit checks, studies, pipelines) whoever calls them (the API, the CLI, the worker).

``backend.api.errors`` is the one place each class becomes an HTTP status; nothing below the
API raises FastAPI's exceptions.
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


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc)
