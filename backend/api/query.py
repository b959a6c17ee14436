"""Comma-separated list query parameters (``keys=a,b``, ``runs=1,2``), parsed in one place.

Bad lists are 422s located at the query field, like FastAPI's own validation errors.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from fastapi.exceptions import RequestValidationError

from backend.schemas import INT32_MAX
from conspo.input_checks import label_problem

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
