"""Query parameters parsed in one place: comma-separated lists (``keys=a,b``, ``runs=1,2``),
and every query's text decoded strictly (``query_is_utf8``); ``JSONBytes``, the answer of a
read that encoded its JSON itself.

Bad values are 422s located at the query field, like FastAPI's own validation errors.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import unquote, unquote_to_bytes

from fastapi import Query, Request, Response
from fastapi.exceptions import RequestValidationError

from backend.runs import where
from backend.runs.where import Condition
from backend.schemas import INT32_MAX
from conspo.input_checks import label_problem


class JSONBytes(Response):
    """JSON encoded by the handler (in its worker thread, off the event loop)."""

    media_type = "application/json"


CommaList = Annotated[str, Query(min_length=1, max_length=20_000, description="Comma-separated.")]


def parse_keys(raw: str, field: str, limit: int) -> list[str]:
    keys = list(dict.fromkeys(k.strip() for k in raw.split(",") if k.strip()))
    problem = None
    if not keys:
        problem = "give at least one key"
    elif len(keys) > limit:
        problem = f"{len(keys)} keys; the limit is {limit}"
    elif long := next((k for k in keys if len(k) > 200), None):
        problem = f"keys are at most 200 characters; {long[:40]!r}… has {len(long)}"
    elif bad := next((p for k in keys if (p := label_problem(k))), None):
        problem = f"keys {bad}"
    if problem:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", field), "msg": problem, "input": raw}]
        )
    return keys


def parse_ids(raw: str, field: str, limit: int) -> list[int]:
    ids: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        run_id = _run_id(part)
        if run_id is None:
            raise RequestValidationError(
                [
                    {
                        "type": "int_parsing",
                        "loc": ("query", field),
                        "msg": f"{part!r} is not a run id",
                        "input": raw,
                    }
                ]
            )
        ids.append(run_id)
    ids = list(dict.fromkeys(ids))
    if not ids or len(ids) > limit:
        msg = "give at least one run id" if not ids else f"{len(ids)} runs; the limit is {limit}"
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", field), "msg": msg, "input": raw}]
        )
    return ids


def _run_id(part: str) -> int | None:
    # ASCII digits only ("²" is a digit to isdigit() but not to int()), and at most 10, so int()
    # never meets the thousands of digits it refuses to convert.
    if part.isascii() and part.isdigit() and len(part) <= 10 and 1 <= int(part) <= INT32_MAX:
        return int(part)
    return None


async def query_is_utf8(request: Request) -> None:
    """A 422 at the first query parameter whose percent-escapes are not UTF-8.

    Starlette decodes them with ``errors="replace"``, so bytes that are not UTF-8 (``%ED%A0%80``,
    a lone surrogate spelled in UTF-8) would reach a handler as U+FFFD and be used or echoed in
    place of what the client sent. Async and string-only: no thread hop on any request."""
    raw: bytes = request.scope.get("query_string", b"")
    if b"%" not in raw and raw.isascii():
        return
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            try:
                unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError as exc:
                field = unquote(name.decode("latin-1"), errors="replace")
                raise RequestValidationError(
                    [
                        {
                            "type": "value_error",
                            "loc": ("query", field),
                            "msg": f"not UTF-8 text (byte {exc.start} of the decoded value)",
                            "input": None,
                        }
                    ]
                ) from None


def parse_order(raw: str) -> where.Order:
    """``order_by`` (backend.runs.where.parse_order), or a 422 at ``query.order_by``."""
    try:
        return where.parse_order(raw)
    except where.WhereError as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", "order_by"), "msg": str(exc), "input": raw}]
        ) from None


def parse_where(raw: str) -> list[Condition]:
    """``where``'s conditions (backend.runs.where), or a 422 at ``query.where`` naming the
    character where the query stopped parsing."""
    try:
        return where.parse(raw)
    except where.WhereError as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", "where"), "msg": str(exc), "input": raw}]
        ) from None
