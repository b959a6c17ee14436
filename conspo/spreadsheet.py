"""CSV cells that a spreadsheet opens as text, never as a formula.

A cell whose text starts with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return, which
some spreadsheets skip before looking) is a formula to Excel, LibreOffice and Google Sheets: a run
named ``=HYPERLINK("http://evil.example/","x")`` would become a link in whoever opens the export.
Such text gets a leading ``'`` (OWASP's advice: shown as text, the apostrophe hidden). Numbers are
left as they are (``-0.5`` is a number, not a formula), so pass them as numbers, not text.

    csv_cell("=1+1")    # "'=1+1"
    csv_cell(-0.5)      # "-0.5"
    csv_cell("a,b")     # '"a,b"'
"""

from __future__ import annotations

from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralised(value: Any) -> Any:
    """``value``, with a text that a spreadsheet would take for a formula prefixed by ``'``."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_cell(value: Any) -> str:
    """One CSV cell (RFC 4180 quoting) of ``value``, neutralised."""
    text = str(neutralised(value))
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text
