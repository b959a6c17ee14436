"""No metric key is typed in the pages' JavaScript or templates: they render from the catalogue."""

from __future__ import annotations

import re
from pathlib import Path

from conspo import metrics as M

FRONTEND = Path(__file__).resolve().parents[2] / "frontend"
PAGES = sorted([*(FRONTEND / "static").glob("*.js"), *(FRONTEND / "templates").glob("*.html")])
NAMESPACES = sorted({m.key.split("/")[0] for m in M.METRICS} | {"reward", "trl"})
# A string literal that looks like a metric key: "<namespace>/<name>" of a known namespace.
KEY_LITERAL = re.compile(
    r"""["'`](""" + "|".join(map(re.escape, NAMESPACES)) + r""")/[\w@]+["'`]"""
)


def test_pages_spell_no_metric_key() -> None:
    found = {
        f"{path.name}:{lineno}: {match.group(0)}"
        for path in PAGES
        for lineno, line in enumerate(path.read_text().splitlines(), 1)
        for match in KEY_LITERAL.finditer(line)
    }
    assert not found, "metric keys typed in the pages (take them from catalogue.js):\n" + "\n".join(
        sorted(found)
    )


def test_templates_are_scanned() -> None:
    assert any(p.suffix == ".html" for p in PAGES) and any(p.suffix == ".js" for p in PAGES)


def test_the_pattern_catches_a_typed_key() -> None:
    assert KEY_LITERAL.search('const k = "sep/gap";')
    assert KEY_LITERAL.search("keys: ['grpo/clip_frac']")
    assert KEY_LITERAL.search('<input id="f-metric" value="eval/accuracy">')
    assert not KEY_LITERAL.search("get(`/api/runs/${id}/metrics`)")
