"""No metric key is typed in the pages' JavaScript: they render from the catalogue."""

from __future__ import annotations

import re
from pathlib import Path

from conspo import metrics as M

STATIC = Path(__file__).resolve().parents[2] / "frontend" / "static"
NAMESPACES = sorted({m.key.split("/")[0] for m in M.METRICS} | {"reward", "trl"})
# A string literal that looks like a metric key: "<namespace>/<name>" of a known namespace.
KEY_LITERAL = re.compile(
    r"""["'`](""" + "|".join(map(re.escape, NAMESPACES)) + r""")/[\w@]+["'`]"""
)


def test_pages_spell_no_metric_key() -> None:
    found = {
        f"{path.name}:{lineno}: {match.group(0)}"
        for path in STATIC.glob("*.js")
        for lineno, line in enumerate(path.read_text().splitlines(), 1)
        for match in KEY_LITERAL.finditer(line)
    }
    assert not found, (
        "metric keys typed in JavaScript (take them from catalogue.js):\n"
        + "\n".join(sorted(found))
    )


def test_the_pattern_catches_a_typed_key() -> None:
    assert KEY_LITERAL.search('const k = "sep/gap";')
    assert KEY_LITERAL.search("keys: ['grpo/clip_frac']")
    assert not KEY_LITERAL.search("get(`/api/runs/${id}/metrics`)")
