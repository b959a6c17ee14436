"""Error bodies that always render, whatever the refused input held.

FastAPI's own 422 echoes each invalid ``input`` as is: a NaN, an unpaired surrogate or a
300-level object then fails to render and the refusal becomes a 500. Here ``loc`` and ``msg``
(which name the field and the problem) are kept, cut to a readable length, and ``input`` is
echoed only when it is small, made renderable first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from backend.schemas import renderable

log = logging.getLogger(__name__)

ECHO_CHARS = 1_000  # an input or message longer than this is cut (msg) or not echoed (input)
LOC_PART_CHARS = 200  # a dict key in a location (a metric key of 10k characters) is cut
MAX_ERRORS = 50  # 10,000 bad rollouts need not come back as 10,000 errors


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    detail = [echoed(e) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        detail.append(
            {"type": "too_many_errors", "loc": [], "msg": f"{len(errors) - MAX_ERRORS} more"}
        )
    return JSONResponse({"detail": detail}, status_code=422)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """An unexpected exception: a 500 with a JSON body (the server logs the traceback)."""
    log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
    return JSONResponse({"detail": "internal server error"}, status_code=500)


def echoed(error: dict[str, Any]) -> dict[str, Any]:
    """One pydantic error as JSON that renders: type, loc, msg, and input/ctx when small."""
    out: dict[str, Any] = {
        "type": error.get("type", "value_error"),
        "loc": _loc(error.get("loc", ())),
        "msg": _cut(renderable(str(error.get("msg", ""))), ECHO_CHARS),
    }
    for key in ("input", "ctx"):
        if key in error and _fits(error[key], ECHO_CHARS):
            out[key] = renderable(error[key])
    if isinstance(error.get("input"), float) and out.get("input") is None:
        out["input"] = str(error["input"])  # "nan", "inf": null would hide what was refused
    return out


def _loc(loc: Sequence[Any]) -> list[Any]:
    return [p if isinstance(p, int) else _cut(renderable(str(p)), LOC_PART_CHARS) for p in loc]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _fits(value: Any, limit: int) -> bool:
    """Whether ``value`` renders in about ``limit`` characters (stops as soon as it does not)."""
    stack, budget = [value], limit
    while stack and budget >= 0:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
            budget -= 2 + sum(len(str(k)) + 4 for k in item)
        elif isinstance(item, list | tuple):
            stack.extend(item)
            budget -= 2 + len(item)
        elif isinstance(item, str | bytes):
            budget -= len(item) + 2
        else:
            budget -= 24
    return budget >= 0
