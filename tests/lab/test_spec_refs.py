"""Every "§N" / "§N.M" the code and docs cite resolves to a numbered heading of docs/objectives.md.

Headings are numbered as ``## 2. ConSPO`` (section 2) and ``### 2.3 Stable form`` (section 2.3).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "objectives.md"
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)
CITATION = re.compile(r"§\s*(\d+(?:\.\d+)?)")
TEXT_SUFFIXES = {".py", ".md", ".js", ".html", ".css", ".yaml", ".yml", ".toml", ".txt"}


def cited_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in ("conspo", "backend", "worker", "conspo_lab", "docs"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in TEXT_SUFFIXES]
    return sorted(p for p in files if p.is_file())


def where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def test_every_section_reference_has_a_heading():
    sections = set(HEADING.findall(SPEC.read_text()))
    assert {"1", "2", "3", "4", "5"} <= sections, f"docs/objectives.md headings: {sections}"
    missing = [
        f"{where(path, text, m.start())} cites §{m.group(1)}"
        for path in cited_files()
        for text in [path.read_text()]
        for m in CITATION.finditer(text)
        if m.group(1) not in sections
    ]
    assert not missing, "no such heading in docs/objectives.md:\n" + "\n".join(missing)


def test_spec_is_cited_inside_the_repository():
    outside = [
        where(path, text, m.start())
        for path in cited_files()
        for text in [path.read_text()]
        for m in re.finditer(re.escape("shared/docs/objectives.md"), text)
    ]
    assert not outside, "cite docs/objectives.md instead:\n" + "\n".join(outside)
