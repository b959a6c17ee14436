"""HTML pages of the web UI and their static files.

The pages are thin Jinja2 shells; everything they show comes from the REST API (docs/api.md)
through the plain JS modules in ``frontend/static``. Plotly.js is served from the installed
``plotly`` package or, for the pages that need no more, its cartesian bundle from
``node_modules``; never from a CDN, so the UI works offline. Where those files lie is
``backend.assets`` (shared with the exported reports, ``backend.studies.report``).

The API token reaches the page (``window.CONSPO_TOKEN``) only when the server runs with
``CONSPO_UI_TOKEN_INJECT=true`` (the embedded default) and the page was asked for by a loopback
name; see :func:`_ui_token`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from functools import lru_cache
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from backend.api.deps import SessionDep
from backend.assets import STATIC_DIR, TEMPLATES_DIR, plotly_cartesian_path, plotly_js_path
from backend.config import Settings
from backend.models import Pipeline, Run, Study
from backend.schemas import INT32_MAX
from backend.studies.comparison import RUN_FIELDS
from conspo.metrics import catalogue

router = APIRouter(include_in_schema=False)
Row = TypeVar("Row", Run, Study, Pipeline)
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))

_STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})


def _loopback_host(request: Request) -> bool:
    """Whether the page was asked for as 127.0.0.1, localhost or [::1] (any port).

    The Host header, not the socket: a DNS-rebinding page (evil.example resolved to 127.0.0.1)
    reaches the loopback socket too, but its requests still name evil.example.
    """
    host = request.headers.get("host", "").strip().lower()
    name = host.rsplit(":", 1)[0] if host.rfind(":") > host.rfind("]") else host
    return name in LOOPBACK_HOSTS


def _ui_token(request: Request) -> str | None:
    """The token to inject into pages, or None.

    Nothing is injected unless the app's settings say ``ui_token_inject`` (the embedded
    default) and the request names a loopback host. Then it is the token the app factory read
    at start, else the token file embedded mode writes (``<data dir>/token``), read now: it may
    have been written after the start.
    """
    settings: Settings = request.app.state.settings
    if not settings.ui_token_inject or not _loopback_host(request):
        return None
    token = getattr(request.app.state, "ui_token", None)
    if token:
        return str(token).strip()
    try:
        return settings.token_file.read_text().strip() or None
    except OSError:
        return None


def _script_json(value: Any) -> str:
    """JSON that is safe inside an inline <script> element."""
    return json.dumps(value).replace("</", "<\\/")


@lru_cache(maxsize=1)
def _catalogue_json() -> str:
    return _script_json(asdict(catalogue()))


_IMPORTED = re.compile(r'(?:\bfrom|^import)\s*"(/static/[\w./-]+\.js)"', re.M)


def module_graph(entry: str) -> list[str]:
    """``entry`` and every module it imports, directly or not, as /static paths: the page's
    <head> names them all (modulepreload), so the browser fetches them at once instead of one
    level of imports after another. Read at each render: an edited file is seen."""
    seen: list[str] = []
    todo = [f"/static/{entry}"]
    while todo:
        src = todo.pop()
        if src in seen:
            continue
        seen.append(src)
        path = STATIC_DIR / src.removeprefix("/static/")
        todo.extend(_IMPORTED.findall(path.read_text()) if path.is_file() else [])
    return seen


def _render(
    request: Request, template: str, page: str, entry: str | None = None, **extra: Any
) -> HTMLResponse:
    context = {
        "page": page,
        "token_json": _script_json(_ui_token(request)),
        "catalogue_json": _catalogue_json(),
        # a chart page's first API requests, sent from <head> while Plotly and the modules load
        "early_js": (STATIC_DIR / "early.js").read_text().replace("</", "<\\/") if entry else "",
        "modules": module_graph(entry) if entry else [],
        **extra,
    }
    response = templates.TemplateResponse(request, template, context)
    response.headers["Cache-Control"] = "no-store"
    return response


CARTESIAN_SRC = "/static/plotly-cartesian.min.js"


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request) -> HTMLResponse:
    return _render(request, "runs.html", "runs", title="Runs")


@router.get("/runs/new", response_class=HTMLResponse)
def new_run_page(request: Request) -> HTMLResponse:
    return _render(request, "new_run.html", "new", title="New run")


def _row(session: Session, model: type[Row], key: int) -> Row | None:
    """The row ``key`` of ``model``, or None (an id past the database's integer range too: asked
    for, it would be an error of the database, not a missing page)."""
    return session.get(model, key) if 1 <= key <= INT32_MAX else None


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: int, session: SessionDep) -> HTMLResponse:
    if _row(session, Run, run_id) is None:  # a clear 404, not a page whose requests all fail
        return not_found_page(request, f"There is no run {run_id} at")
    return _render(
        request, "run.html", "run", entry="run.js", title=f"Run {run_id}", run_id=run_id,
        plotly_src=CARTESIAN_SRC,
    )  # fmt: skip


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request) -> HTMLResponse:
    fields = _script_json(list(RUN_FIELDS))  # what a group-by path may name besides config paths
    return _render(
        request,
        "compare.html",
        "compare",
        entry="compare.js",
        plotly_src=CARTESIAN_SRC,
        title="Compare runs",
        group_fields_json=fields,
    )


@router.get("/compare/rollouts", response_class=HTMLResponse)
def compare_rollouts_page(request: Request) -> HTMLResponse:
    """Several runs' rollouts at one step, side by side per prompt (GET /api/compare/rollouts);
    the runs and the step are the page's query (``?runs=1,2&step=N``), read by its module."""
    return _render(
        request,
        "compare_rollouts.html",
        "compare",
        entry="compare_rollouts.js",
        title="Rollouts side by side",
    )


@router.get("/answers", response_class=HTMLResponse)
def answers_page(request: Request) -> HTMLResponse:
    """Runs' held-out answers problem by problem (GET /api/answers); the runs, the evaluation
    and the filter are the page's query (``?runs=1,2&step=last&show=disagree``)."""
    return _render(request, "answers.html", "compare", entry="answers.js", title="Answers")


@router.get("/docs", response_class=HTMLResponse)
def api_docs_page(request: Request) -> HTMLResponse:
    """The API reference, rendered from /openapi.json by our own script: works offline."""
    return _render(request, "api_docs.html", "docs", title="API reference")


def not_found_page(request: Request, what: str = "") -> HTMLResponse:
    """The HTML 404 a browser gets for an unknown page (API clients keep their JSON 404);
    ``what`` says what is missing ("There is no study 999 at")."""
    response = _render(
        request, "not_found.html", "404", title="Not found", path=request.url.path, what=what
    )
    response.status_code = 404
    return response


def wants_html(request: Request) -> bool:
    """A browser asking for a page: not under /api, and HTML accepted."""
    path = request.url.path
    if path.startswith(("/api/", "/static/")) or path == "/api":
        return False
    return "text/html" in request.headers.get("accept", "")


@router.get("/favicon.ico")
def favicon() -> Response:
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")


@router.api_route("/static/plotly.min.js", methods=["GET", "HEAD"])
def plotly_js() -> FileResponse:
    return FileResponse(
        plotly_js_path(),
        media_type=_STATIC_TYPES[".js"],
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.api_route("/static/plotly-cartesian.min.js", methods=["GET", "HEAD"])
def plotly_cartesian_js() -> FileResponse:
    """What the run and compare pages draw with (a study page too, unless it has a search: its
    parallel coordinates need the full bundle)."""
    return FileResponse(
        plotly_cartesian_path(),
        media_type=_STATIC_TYPES[".js"],
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.api_route("/static/{name:path}", methods=["GET", "HEAD"])
def static_file(name: str) -> FileResponse:
    if "\x00" in name:  # the OS refuses such a path with an exception, not a 404
        raise HTTPException(status_code=404, detail="no such static file")
    path = (STATIC_DIR / name).resolve()
    if STATIC_DIR.resolve() not in path.parents or not path.is_file():
        raise HTTPException(status_code=404, detail=f"no static file {name!r}")
    media_type = _STATIC_TYPES.get(path.suffix, "application/octet-stream")
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": "no-cache"})


@router.get("/studies", response_class=HTMLResponse)
def studies_page(request: Request) -> HTMLResponse:
    return _render(request, "studies.html", "studies", title="Studies")


@router.get("/studies/new", response_class=HTMLResponse)  # before /studies/{study_id}
def new_study_page(request: Request) -> HTMLResponse:
    return _render(request, "new_study.html", "new-study", title="New study")


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(request: Request, study_id: int, session: SessionDep) -> HTMLResponse:
    study = _row(session, Study, study_id)
    if study is None:  # a clear 404, not a page loading for ever
        return not_found_page(request, f"There is no study {study_id} at")
    search = bool((study.spec or {}).get("search"))  # parallel coordinates: the full bundle
    return _render(
        request, "study.html", "study", entry="study.js", title=f"Study {study_id}",
        study_id=study_id, plotly_src="/static/plotly.min.js" if search else CARTESIAN_SRC,
    )  # fmt: skip


@router.get("/pipelines", response_class=HTMLResponse)
def pipelines_page(request: Request) -> HTMLResponse:
    return _render(request, "pipelines.html", "pipelines", title="Pipelines")


@router.get("/pipelines/{pipeline_id}", response_class=HTMLResponse)
def pipeline_page(request: Request, pipeline_id: int, session: SessionDep) -> HTMLResponse:
    if _row(session, Pipeline, pipeline_id) is None:
        return not_found_page(request, f"There is no pipeline {pipeline_id} at")
    title = f"Pipeline {pipeline_id}"
    return _render(request, "pipeline.html", "pipeline", title=title, pipeline_id=pipeline_id)


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request) -> HTMLResponse:
    return _render(request, "models.html", "models", title="Models")
