"""Text templates with named placeholders and nothing else: a prompt's ``{question}``, an SFT
target's ``{answer}``.

    render("Q: {question}\\nA: \\\\boxed{{}}", {"question": "2+3?"})   # 'Q: 2+3?\\nA: \\\\boxed{}'

The syntax is ``str.format``'s subset that a template needs: ``{name}`` for a field the caller
names, ``{{`` and ``}}`` for literal braces. Not ``str.format`` itself: its attribute and index
access (``{question.__class__}``, ``{question[0]}``) reach into the interpreter, and a format
spec (``{question:>1000000000}``) makes a 100-byte template allocate gigabytes. Here anything but
a listed field is refused by ``template_problem`` with its position, and ``render`` computes the
output's length from the parts before it joins them, refusing one over ``max_chars``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from functools import lru_cache

MAX_RENDERED_CHARS = 1_000_000  # a prompt or a target; a model's context is far shorter

# "{{", "}}", a placeholder "{...}" (whatever is inside, judged below), or a lone brace
_TOKEN = re.compile(r"\{\{|\}\}|\{[^{}]*\}|[{}]")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateTooLarge(ValueError):
    """A template whose output would be over ``max_chars``."""


class Placeholder(str):
    """A field's name among a parsed template's literal parts."""


def template_problem(template: str, fields: Collection[str]) -> str | None:
    """Why ``template`` is not a template over ``fields``, or None."""
    try:
        _parse(template, tuple(sorted(fields)))
    except ValueError as exc:
        return str(exc)
    return None


def placeholders(template: str, fields: Collection[str]) -> list[str]:
    """The fields ``template`` uses, in order, repeated as often as it uses them."""
    return [p for p in _parse(template, tuple(sorted(fields))) if isinstance(p, Placeholder)]


def render(template: str, values: Mapping[str, str], max_chars: int = MAX_RENDERED_CHARS) -> str:
    """``template`` with each ``{field}`` replaced by ``values[field]``; ``ValueError`` for a
    template that is not one over ``values``' fields, ``TemplateTooLarge`` (before anything is
    built) for an output over ``max_chars``."""
    parts = _parse(template, tuple(sorted(values)))
    size = sum(len(values[p]) if isinstance(p, Placeholder) else len(p) for p in parts)
    if size > max_chars:
        raise TemplateTooLarge(
            f"the template would make {size:,} characters; at most {max_chars:,}"
        )
    return "".join(values[p] if isinstance(p, Placeholder) else p for p in parts)


@lru_cache(maxsize=256)
def _parse(template: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    """Literal text and ``Placeholder``s in order; ``ValueError`` naming the first bad brace."""
    allowed = ", ".join(f"{{{f}}}" for f in fields)
    parts: list[str] = []
    at = 0
    for token in _TOKEN.finditer(template):
        parts.append(template[at : token.start()])
        at = token.end()
        text = token.group()
        if text in ("{{", "}}"):
            parts.append(text[0])
            continue
        where = f"{text[:40]!r} at character {token.start()}"
        if text in ("{", "}"):
            raise ValueError(f"a lone {where}: write a literal brace doubled ({text * 2})")
        name = text[1:-1]
        if not _FIELD.fullmatch(name) or name not in fields:
            raise ValueError(
                f"{where}: the only placeholders are {allowed} (no format specs, conversions,"
                " attribute or index access); write a literal brace doubled"
            )
        parts.append(Placeholder(name))
    parts.append(template[at:])
    return tuple(p for p in parts if p)
