"""Comma-separated list query parameters (``keys=a,b``, ``runs=1,2``), parsed in one place.

Bad lists are 422s located at the query field, like FastAPI's own validation errors.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from fastapi.exceptions import RequestValidationError

from backend.schemas import INT32_MAX

CommaList = Annotated[str, Query(min_length=1, max_length=20_000, description="Comma-separated.")]


def parse_keys(raw: str, field: str, limit: int) -> list[str]:
    keys = list(dict.fromkeys(k.strip() for k in raw.split(",") if k.strip()))
    problem = None
    if not keys:
        problem = "give at least one key"
    elif len(keys) > limit:
        problem = f"{len(keys)} keys; the limit is {limit}"
    elif any(len(k) > 200 or "\x00" in k for k in keys):
        problem = "keys are at most 200 characters, without NUL"
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
        if not part.isdigit() or not 1 <= int(part) <= INT32_MAX:
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
        ids.append(int(part))
    ids = list(dict.fromkeys(ids))
    if not ids or len(ids) > limit:
        msg = "give at least one run id" if not ids else f"{len(ids)} runs; the limit is {limit}"
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", field), "msg": msg, "input": raw}]
        )
    return ids
