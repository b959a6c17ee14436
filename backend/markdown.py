"""Notes as HTML: Markdown rendered with raw HTML off, so nothing a user typed becomes markup.

CommonMark (markdown-it-py, the parser rich uses) with tables and strikethrough. Raw HTML in the
source is escaped, not passed; links and images keep only the schemes markdown-it's validator
allows (no ``javascript:``, ``vbscript:``, ``file:`` or non-image ``data:``), and every link opens
without the page's opener and is marked ``nofollow``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from markdown_it import MarkdownIt


@cache
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])

    def link_open(renderer: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("rel", "nofollow noopener noreferrer")
        return str(renderer.renderToken(tokens, idx, options, env))

    md.add_render_rule("link_open", link_open)
    return md


def render(text: str) -> str:
    """``text`` (Markdown) as safe HTML; "" for an empty note."""
    return _parser().render(text) if text.strip() else ""
