"""What a value from outside may hold, checked once for the run config and the REST API.

Whatever is accepted is stored by SQLite and PostgreSQL alike and rendered again by every
reader (JSON responses, the live streams, the CLI). So:

* text holds no NUL (PostgreSQL text cannot) and no unpaired UTF-16 surrogate (``"\\ud800"`` in
  JSON: UTF-8 cannot encode it, so a row holding one would store and then fail every read);
* a *label* (a name, a tag, a metric key, a model id: one line shown in lists and terminals)
  holds no control characters either;
* free-form JSON (an external run's config, clone overrides, an algorithm's or a task's params)
  holds only finite numbers (JSON has no NaN or Infinity, and ``1e400`` parses as infinity),
  integers that fit in 64 bits, keys of at most ``MAX_JSON_KEY_CHARS``, and is at most
  ``MAX_JSON_DEPTH`` containers deep and about ``MAX_JSON_CHARS`` long.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

MAX_JSON_DEPTH = 32
MAX_JSON_CHARS = 1_000_000
MAX_JSON_KEY_CHARS = 1_000
INT64_LIMIT = 2**63

Loc = tuple[str | int, ...]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"must not contain unpaired surrogates ({value[exc.start]!r} at character {exc.start})"
        )
    return None


def label_problem(value: str) -> str | None:
    """Why ``value`` cannot be a one-line label, or None."""
    problem = text_problem(value)
    if problem is None and (found := _CONTROL.search(value)):
        problem = f"must not contain control characters ({found.group()!r} at {found.start()})"
    return problem


def _refusing(problem_of: Callable[[str], str | None]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if (problem := problem_of(value)) is not None:
            raise ValueError(problem)
        return value

    return check


# The end of the string in a pattern: Python's $ (in the regular expressions a fuzzer draws
# strings from) also matches before a final newline, JSON Schema's does not; this means the end
# in both.
END = r"(?![\s\S])"


@dataclass(frozen=True)
class _Refused:
    """An after-validator whose JSON schema states what it refuses as a ``pattern`` (the
    OpenAPI document, the form's schema); an unpaired surrogate no pattern can state."""

    check: Callable[[str], str]
    pattern: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = self.pattern
        return json_schema


# Validators for ``Annotated[str, Field(max_length=...), LABEL]`` (after the length, so a too
# long string gets pydantic's own message), and the plain types.
check_text = _refusing(text_problem)
check_label = _refusing(label_problem)
TEXT_PATTERN = rf"^[^\x00]*{END}"
LABEL_PATTERN = rf"^[^\x00-\x1f\x7f-\x9f]*{END}"  # _CONTROL, NUL included
TEXT = _Refused(check_text, TEXT_PATTERN)
LABEL = _Refused(check_label, LABEL_PATTERN)


def anchored(body: str) -> Any:
    """``Field(pattern=...)`` for a whole string matching ``body``. pydantic checks it with
    Rust's regular expressions, where $ is the end; the JSON schema says END instead, the end
    in Python's too."""
    return Field(pattern=f"^{body}$", json_schema_extra={"pattern": f"^{body}{END}"})


Text = Annotated[str, TEXT]
Label = Annotated[str, LABEL]


def json_problem(value: Any) -> tuple[Loc, str] | None:
    """The first thing in ``value`` that stored JSON may not hold, as (where, what), or None.

    Iterative, so no nesting depth can overflow the stack; it stops at the first problem and
    at the size limit, so a huge input costs no more than the limit.
    """
    budget = MAX_JSON_CHARS
    stack: list[tuple[Any, Loc]] = [(value, ())]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, dict | list) and len(loc) >= MAX_JSON_DEPTH:
            return loc, f"nested deeper than {MAX_JSON_DEPTH} levels of objects and arrays"
        children, size, problem = _inspect(item)
        if problem is not None:
            return loc, problem
        budget -= size
        if budget < 0:
            return (), f"longer than {MAX_JSON_CHARS:,} characters of JSON"
        stack.extend((child, (*loc, key)) for key, child in children)
    return None


def _inspect(item: Any) -> tuple[list[tuple[str | int, Any]], int, str | None]:
    """(children, approximate JSON length of ``item`` itself, problem) of one node."""
    if isinstance(item, dict):
        for key in item:
            if not isinstance(key, str):
                return [], 0, f"key {key!r} is not a string"
            if len(key) > MAX_JSON_KEY_CHARS:
                return [], 0, f"key {key[:40]!r}… is over {MAX_JSON_KEY_CHARS} characters"
            if (problem := text_problem(key)) is not None:
                return [], 0, f"key {key[:40]!r}: {problem}"
        return list(item.items()), 2 + sum(len(k) + 4 for k in item), None
    if isinstance(item, list | tuple):
        return list(enumerate(item)), 2 + len(item), None
    if isinstance(item, str):
        return [], len(item) + 2, text_problem(item) if len(item) <= MAX_JSON_CHARS else None
    return [], 24, _scalar_problem(item)


def _scalar_problem(item: Any) -> str | None:
    if item is None or isinstance(item, bool):
        return None
    if isinstance(item, int):
        return None if -INT64_LIMIT <= item < INT64_LIMIT else "integers must fit in 64 bits"
    if isinstance(item, float):
        return None if math.isfinite(item) else "must be a finite number (not NaN or Infinity)"
    return f"a {type(item).__name__} is not a JSON value"


def loc_text(loc: Loc) -> str:
    """``("a", 0, "b")`` → ``a[0].b``, for messages (cut at 200 characters)."""
    text = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc).lstrip(".")
    return text if len(text) <= 200 else text[:200] + "…"
