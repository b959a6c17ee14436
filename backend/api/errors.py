"""Every exception the API answers for, mapped to HTTP in this one place (``install``), with
error bodies that always render, whatever the refused input held.

* domain errors (``backend.errors``): ``InvalidInput`` → 422 located at each field (the same
  body as FastAPI's validation errors), ``Forbidden`` → 403 in that same body, a refused
  lifecycle transition → 409 (``Conflict``) or 503 (``QueueUnavailable``);
* database refusals that slip past validation → 422 / 409 / 503, never a 500;
* anything unexpected → a logged JSON 500.

FastAPI's own 422 echoes each invalid ``input`` as is: a NaN, an unpaired surrogate or a
300-level object then fails to render and the refusal becomes a 500. Here ``loc`` and ``msg``
(which name the field and the problem) are kept, cut to a readable length, and ``input`` is
echoed only when it is small, made renderable first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from backend.config import Settings
from backend.errors import Busy, DomainError, Forbidden, InvalidInput
from backend.runs.inputs import unlocated_model
from backend.runs.lifecycle import Conflict, QueueUnavailable
from backend.schemas import renderable

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

ECHO_CHARS = 1_000  # an input or message longer than this is cut (msg) or not echoed (input)
LOC_PART_CHARS = 200  # a dict key in a location (a metric key of 10k characters) is cut
MAX_ERRORS = 50  # 10,000 bad rollouts need not come back as 10,000 errors


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError | InvalidInput)
    if isinstance(exc, InvalidInput):
        return unprocessable(exc.errors)
    return unprocessable([*exc.errors(), *_unlocated_model(request, exc)])


CHECKS_MODEL_NAME: set[Callable[..., Any]] = set()  # routes a config comes to in ``body.config``


def checks_model_name(endpoint: F) -> F:
    """Marks a route whose 422s also name an unavailable ``body.config.model.name``."""
    CHECKS_MODEL_NAME.add(endpoint)
    return endpoint


def _unlocated_model(request: Request, exc: RequestValidationError) -> list[dict[str, Any]]:
    """A run submit that fails validation also names a model that is not here (the check a
    valid config meets after validation), so a form's errors come at once, not in rounds."""
    if getattr(request.scope.get("route"), "endpoint", None) not in CHECKS_MODEL_NAME:
        return []
    body = exc.body
    config = body.get("config") if isinstance(body, dict) else None
    problem = unlocated_model(config, request.app.state.settings)
    if problem is None:
        return []
    where, message, value = problem
    return [
        {"type": "value_error", "loc": ("body", "config", *where), "msg": message, "input": value}
    ]


def unprocessable(errors: Sequence[Any], status_code: int = 422) -> JSONResponse:
    """422 with each error located at its field (at most ``MAX_ERRORS`` of them); a 403 of
    ``Forbidden`` has the same body."""
    detail = [echoed(e) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        detail.append(
            {"type": "too_many_errors", "loc": [], "msg": f"{len(errors) - MAX_ERRORS} more"}
        )
    return JSONResponse({"detail": detail}, status_code=status_code)


async def forbidden(_: Request, exc: Exception) -> JSONResponse:
    """403 located at each field that names what the caller may not use."""
    assert isinstance(exc, Forbidden)
    return unprocessable(exc.errors, status_code=403)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """An unexpected exception: a 500 with a JSON body (the server logs the traceback); one
    raised because the database went away under a library of its own (Optuna's storage wraps
    SQLAlchemy's OperationalError in its StorageInternalError) is the 503 of an unavailable
    database, as the platform's own queries' are."""
    if _caused_by(exc, OperationalError):
        log.warning("database unavailable under %s", type(exc).__name__)
        return JSONResponse({"detail": "database unavailable, retry later"}, status_code=503)
    log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
    return JSONResponse({"detail": "internal server error"}, status_code=500)


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc`` or an exception it was raised from (its chain, bounded) is a ``kind``."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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


# Domain refusals (backend.errors) as HTTP statuses; InvalidInput has its own 422 body.
DOMAIN_STATUS: dict[type[DomainError], int] = {Conflict: 409, QueueUnavailable: 503, Busy: 503}
QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement past statement_timeout


def install(app: FastAPI) -> None:
    """Refused transitions and database refusals that slip past validation become 4xx/503,
    never a 500; validation errors always render; anything unexpected is a logged JSON 500."""

    async def domain_error(_: Request, exc: Exception) -> JSONResponse:
        code = next((c for t, c in DOMAIN_STATUS.items() if isinstance(exc, t)), 409)
        retry = {"Retry-After": "2"} if isinstance(exc, Busy) else None
        return JSONResponse({"detail": str(exc)}, status_code=code, headers=retry)

    async def data_error(_: Request, exc: Exception) -> JSONResponse:
        log.info("refused by the database: %s", type(exc).__name__)
        return JSONResponse({"detail": f"invalid value: {_orig(exc)}"}, status_code=422)

    async def integrity_error(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"conflict: {_orig(exc)}"}, status_code=409)

    async def operational_error(request: Request, exc: Exception) -> JSONResponse:
        if getattr(getattr(exc, "orig", None), "sqlstate", None) == QUERY_CANCELED:
            limit = request.app.state.settings.db_statement_timeout_s
            log.warning("statement cancelled after %ss: %s %s", limit, request.method, request.url)
            detail = f"query ran longer than {limit:g} s (CONSPO_DB_STATEMENT_TIMEOUT_S)"
            return JSONResponse({"detail": detail}, status_code=503)
        log.warning("database unavailable: %s", type(exc).__name__)
        return JSONResponse({"detail": "database unavailable, retry later"}, status_code=503)

    async def pool_timeout(request: Request, _: Exception) -> JSONResponse:
        settings: Settings = request.app.state.settings
        log.warning("no database connection free within %ss", settings.db_pool_timeout_s)
        detail = (
            f"server busy: no database connection free within {settings.db_pool_timeout_s:g} s "
            f"(CONSPO_DB_POOL_TIMEOUT_S; pool of CONSPO_DB_POOL_SIZE={settings.db_pool_size} + "
            f"CONSPO_DB_MAX_OVERFLOW={settings.db_max_overflow}); retry later"
        )
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})

    app.add_exception_handler(InvalidInput, validation_error)
    app.add_exception_handler(Forbidden, forbidden)
    app.add_exception_handler(DomainError, domain_error)
    app.add_exception_handler(DataError, data_error)
    app.add_exception_handler(IntegrityError, integrity_error)
    app.add_exception_handler(OperationalError, operational_error)
    app.add_exception_handler(PoolTimeout, pool_timeout)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)


def _orig(exc: Any) -> str:
    return str(getattr(exc, "orig", exc)).splitlines()[0][:200]
