"""Query parameters parsed in one place: comma-separated lists (``keys=a,b``, ``runs=1,2``),
and every query's text decoded strictly (``query_is_utf8``); ``JSONBytes``, the answer of a
read that encoded its JSON itself.

Bad values are 422s located at the query field, like FastAPI's own validation errors.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from fastapi import Query, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

from backend.runs import where
from backend.runs.where import Condition
from backend.schemas import INT32_MAX
from conspo.input_checks import END, label_problem


class JSONBytes(Response):
    """JSON encoded by the handler (in its worker thread, off the event loop)."""

    media_type = "application/json"


# The patterns of the lists and of order_by, stated in the OpenAPI document, mean there what
# the parsers below accept (tests/api/test_api_contract.py holds them to each other).
CONTROL = r"\x00-\x1f\x7f-\x9f"  # conspo.input_checks refuses these in a label
KEY_CHARS = 200


def positive_up_to(limit: int) -> str:
    """A regular expression for the integers 1..``limit``, without leading zeros."""
    digits = str(limit)
    n = len(digits)
    shorter = [f"[1-9][0-9]{{0,{n - 2}}}"] if n > 1 else []
    same_length = []  # the first i digits of limit, a smaller one, then any
    for i, digit in enumerate(digits):
        low, high = 1 if i == 0 else 0, int(digit) - 1
        if high >= low:
            smaller = f"[{low}-{high}]" if high > low else str(low)
            rest = "[0-9]" + (f"{{{n - i - 1}}}" if n - i > 2 else "") if i < n - 1 else ""
            same_length.append(f"{digits[:i]}{smaller}{rest}")
    return "(?:" + "|".join([*shorter, *same_length, digits]) + ")"


RUN_ID = positive_up_to(INT32_MAX)
# A key: at most KEY_CHARS, no control character, no comma, no space first or last.
KEY = f"[^ ,{CONTROL}](?:[^,{CONTROL}]{{0,{KEY_CHARS - 2}}}[^ ,{CONTROL}])?"


def list_pattern(item: str, limit: int) -> str:
    """1..``limit`` items separated by commas; spaces around them and empty items ignored."""
    more = f"(?: *,[ ,]*{item}){{0,{limit - 1}}}" if limit > 1 else ""
    return f"^[ ,]*{item}{more}[ ,]*{END}"


def run_id_list(limit: int, max_length: int = 20_000) -> Any:
    """A query parameter of run ids, ``1,2,3`` (``parse_ids``)."""
    return Query(
        max_length=max_length,
        description=f"Comma-separated run ids (at most {limit}).",
        json_schema_extra={"pattern": list_pattern(RUN_ID, limit)},
    )


def metric_key_list(limit: int, max_length: int = 20_000, description: str = "") -> Any:
    """A query parameter of metric keys, ``eval/accuracy,sep/gap`` (``parse_keys``)."""
    return Query(
        max_length=max_length,
        description=description or f"Comma-separated metric keys (at most {limit}).",
        json_schema_extra={"pattern": list_pattern(KEY, limit)},
    )


def _items(raw: str) -> list[str]:
    return [item for part in raw.split(",") if (item := part.strip(" "))]


def parse_keys(raw: str, field: str, limit: int) -> list[str]:
    """The distinct keys of ``raw``; a 422 unless it gives 1 to ``limit`` of them (repeats
    count: the limit is on what was sent)."""
    given = _items(raw)
    problem = None
    if not given:
        problem = "give at least one key"
    elif len(given) > limit:
        problem = f"{len(given)} keys; the limit is {limit}"
    elif long := next((k for k in given if len(k) > KEY_CHARS), None):
        problem = f"keys are at most {KEY_CHARS} characters; {long[:40]!r}… has {len(long)}"
    elif bad := next((p for k in given if (p := label_problem(k))), None):
        problem = f"keys {bad}"
    if problem:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", field), "msg": problem, "input": raw}]
        )
    return list(dict.fromkeys(given))


_RUN_ID = re.compile(RUN_ID)


def parse_ids(raw: str, field: str, limit: int, noun: str = "run") -> list[int]:
    """The distinct ids of ``raw`` (run ids, or ``noun``'s); a 422 unless it gives 1 to
    ``limit`` of them (repeats count), each an integer 1..2³¹-1 in ASCII digits without leading
    zeros."""
    given = _items(raw)
    for part in given:
        if _RUN_ID.fullmatch(part) is None:
            raise RequestValidationError(
                [
                    {
                        "type": "int_parsing",
                        "loc": ("query", field),
                        "msg": f"{part[:40]!r} is not a {noun} id",
                        "input": raw,
                    }
                ]
            )
    if not given or len(given) > limit:
        msg = (
            f"{len(given)} {noun}s; the limit is {limit}"
            if given
            else f"give at least one {noun} id"
        )
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", field), "msg": msg, "input": raw}]
        )
    return list(dict.fromkeys(int(part) for part in given))


async def format_is_declared(request: Request) -> None:
    """A 422 at ``query.format`` on a route that declares no ``format`` parameter.

    A query parameter a route does not declare is ignored, so ``?format=csv`` came back as JSON
    without a word; the CSV exports are paths of their own (``GET /api/runs/{id}/metrics.csv``,
    ``…/objective.csv``). Async and string-only, like ``query_is_utf8``."""
    if "format" not in request.query_params:
        return
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is not None and _declares_query(dependant, "format"):
        return
    message = (
        "this endpoint answers JSON and takes no format; CSV is served at paths of its own,"
        " e.g. GET /api/runs/{id}/metrics.csv (docs/api.md)"
    )
    raise RequestValidationError(
        [
            {
                "type": "value_error",
                "loc": ("query", "format"),
                "msg": message,
                "input": request.query_params["format"],
            }
        ]
    )


def _declares_query(dependant: Dependant, name: str) -> bool:
    """Whether the route (or one of its dependencies) takes the query parameter ``name``."""
    return any(p.alias == name for p in dependant.query_params) or any(
        _declares_query(sub, name) for sub in dependant.dependencies
    )


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


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c}]" for c in word)


# What str.isspace() (the where parser's) holds, spelled out: \s means otherwise in JSON Schema.
SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_NAME = "[A-Za-z_][A-Za-z0-9_]*"
_SUMMARY = "|".join(map(_any_case, where.SUMMARIES))
# where.parse_order's grammar: blank (no order), or [-]path or [-]summary(metric).
ORDER = (
    f"^[{SPACE}]*(?:(?:-[{SPACE}]*)?(?:(?:{_SUMMARY})[{SPACE}]*\\([{SPACE}]*"
    f"[A-Za-z0-9_./@:+\\-]{{1,200}}[{SPACE}]*\\)|{_NAME}(?:\\.{_NAME}){{0,{where.MAX_DEPTH - 1}}})"
    f"[{SPACE}]*)?{END}"
)


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
