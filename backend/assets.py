"""Where the web UI's files lie: the Jinja2 templates, the static JS and CSS, and Plotly.js.

The HTML pages (``backend.pages``) serve them; a study's exported report
(``backend.studies.report``) inlines them. Plotly.js comes from the installed ``plotly`` package
(its ``package_data/plotly.min.js``) or, for the pages that need no more, its cartesian bundle
from ``node_modules`` (``npm ci``); never from a CDN, so the UI works offline.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"
TEMPLATES_DIR = FRONTEND_DIR / "templates"
STATIC_DIR = FRONTEND_DIR / "static"


@lru_cache(maxsize=1)
def plotly_js_path() -> Path:
    """The plotly.min.js bundled with the installed ``plotly`` Python package."""
    import plotly

    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():  # pragma: no cover - a broken plotly install
        raise RuntimeError(f"plotly.min.js not found at {path}; reinstall the plotly package")
    return path


# Plotly's official cartesian bundle (npm plotly.js-cartesian-dist-min, pinned in package.json to
# the plotly.js version of the Python package): scatter, bar, heatmap, box, ... but no parcoords,
# and a third of the full bundle, which took a second or more to compile and run on a loaded
# 2-core machine before a page could draw its first chart.
PLOTLY_CARTESIAN = FRONTEND_DIR.parent.joinpath(
    "node_modules", "plotly.js-cartesian-dist-min", "plotly-cartesian.min.js"
)


def plotly_cartesian_path() -> Path:
    """The cartesian bundle where ``npm ci`` installed it (``make run`` does), else the full one."""
    return PLOTLY_CARTESIAN if PLOTLY_CARTESIAN.is_file() else plotly_js_path()
