"""A study, or a comparison of runs, as one self-contained HTML file: Plotly, the page's styles
and its renderer inlined, the data embedded, so it opens from disk and makes no network request.

The renderer is the study page's own (``frontend/static/study_render.js`` on ``util.js``):
both files are inlined into one module script with their import and export lines stripped.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from html import escape
from typing import Any

from backend.assets import STATIC_DIR, plotly_js_path

# Belt and braces: even a browser that follows a stray URL in Plotly's bundle may fetch nothing.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; "
    "style-src 'unsafe-inline'; img-src data:; font-src data:"
)
_IMPORT = re.compile(r"^import .*?;\s*$", re.M)
_EXPORT = re.compile(r"^export ", re.M)


@lru_cache(maxsize=1)
def _renderer() -> str:
    parts = [(STATIC_DIR / name).read_text() for name in ("util.js", "study_render.js")]
    return _EXPORT.sub("", _IMPORT.sub("", "\n".join(parts)))


def _script(text: str) -> str:
    """Script text safe inside <script>: no "</script" can close the element early."""
    return text.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def _title(view: dict[str, Any]) -> str:
    return view.get("title") or f"Study {view['id']}: {view['name']}"


def study_report(view: dict[str, Any]) -> str:
    """A study (``service.study_view``) or a comparison (``comparison.comparison_view``)."""
    data = _script(json.dumps(view).replace("<", "\\u003c"))
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>{escape(_title(view))} · ConSPO Lab report</title>
<style>{(STATIC_DIR / "app.css").read_text()}</style>
<script>{_script(plotly_js_path().read_text())}</script>
</head>
<body>
<main>
<div id="study"></div>
<p class="muted small">Exported from ConSPO Lab. Run links point at the server it came from.</p>
</main>
<script type="module">
{_script(_renderer())}
const VIEW = {data};
renderStudy(VIEW, document.getElementById("study"), window.Plotly);
</script>
</body>
</html>
"""
