"""Every page the app registers, walked in a real Chromium (see conftest.py for the stack).

The pages are read from the app itself (``backend.main.create_app``'s GET routes that answer
HTML, outside /api), not listed by hand: a page added to the app is walked here by being
registered. A path parameter is filled from a real row this module creates (a run, a study, a
pipeline); a page whose parameter has no row fails, naming it. Each page answers 200 and, once
its first requests are answered, has logged no console error, raised no uncaught exception and
asked nothing off the server (the ``page`` fixture).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute, iter_route_contexts

from backend.config import Settings
from backend.main import create_app
from tests.ui.test_pages import wait_until
from tests.ui.test_study_page import TINY

pytestmark = pytest.mark.browser


def page_routes(data_dir: Path) -> list[str]:
    """The path templates of the app's HTML pages ("/runs/{run_id}"), in registration order."""
    app = create_app(Settings(data_dir=data_dir))  # an engine is made, nothing is connected
    return [
        route.path_format
        for route in iter_route_contexts(app.routes)  # included routers' routes too
        if isinstance(route.original_route, APIRoute)
        and "GET" in (route.methods or ())
        and route.original_route.response_class is HTMLResponse
        and not route.path_format.startswith("/api/")
    ]


@pytest.fixture(scope="module")
def rows(ui_server: Any) -> dict[str, int]:
    """A real row for each path parameter a page takes: an externally logged run, and a study
    and a pipeline, cancelled at once (their pages must read whatever state they are in)."""
    tag = uuid.uuid4().hex[:6]
    run = ui_server.external_run(f"every-page-{tag}", {"task": {"name": "arith"}}, total_steps=4)
    ui_server.log(run["id"], range(4))
    study = ui_server.api(
        "POST",
        "/api/studies",
        json={
            "name": f"every-page-{tag}",
            "config": {**TINY, "steps": 1},
            "arms": [
                {"name": "grpo", "overrides": {"algorithm": "grpo"}},
                {"name": "conspo", "overrides": {"algorithm": "conspo"}},
            ],
            "seeds": [0, 1],
            "objective": {"metric": "eval/accuracy", "reduce": "mean_last_k", "k": 1},
            "baseline": "grpo",
            "concurrency": 1,
        },
    )
    ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
    sft = {**TINY, "kind": "sft", "kind_params": {"batch_size": 4}, "eval": {"every": 0}}
    stages = [sft, {**TINY, "algorithm": "conspo"}]
    made = ui_server.api("POST", "/api/pipelines", json={"name": f"every-{tag}", "stages": stages})
    ui_server.api("POST", f"/api/pipelines/{made['id']}/cancel")
    return {"run_id": run["id"], "study_id": study["id"], "pipeline_id": made["id"]}


def fill(template: str, rows: dict[str, int]) -> str:
    """The template's path parameters replaced by the rows' ids; a parameter with no row fails."""
    missing = [p for p in re.findall(r"{(\w+)(?::\w+)?}", template) if p not in rows]
    assert not missing, f"page {template}: no row for {missing}: create one in rows()"
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: str(rows[m.group(1)]), template)


def test_the_walk_reads_the_pages_from_the_app(tmp_path: Path) -> None:
    """The routes found are the app's pages: the known ones among them, no API route."""
    found = page_routes(tmp_path)
    assert {"/", "/runs/new", "/runs/{run_id}", "/models", "/pipelines/{pipeline_id}"} <= set(found)
    assert all(not p.startswith("/api") and not p.startswith("/static") for p in found), found


# Still being drawn: a page's "loading…" placeholder, or a request of its own not yet answered
# (the live streams stay open by design and are not counted).
LOADING = re.compile(r"\bloading( \w+)?…", re.I)  # "loading…", "Loading presets…"


def test_every_registered_page_loads_with_no_error(
    page: Any, ui_server: Any, rows: dict[str, int], tmp_path: Path
) -> None:
    pending: set[Any] = set()

    def started(request: Any) -> None:
        if "/api/stream" not in request.url:
            pending.add(request)

    page.on("request", started)
    page.on("requestfinished", lambda request: pending.discard(request))
    page.on("requestfailed", lambda request: pending.discard(request))
    walked = []
    for template in page_routes(tmp_path):
        path = fill(template, rows)
        response = page.goto(ui_server.url + path)
        assert response is not None and response.status == 200, f"{path}: {response}"
        wait_until(
            page,
            lambda: not pending and not LOADING.search(page.inner_text("main")),
            120,
            f"{path} drawn (requests answered, no loading placeholder)",
        )
        assert not page.problems.errors, f"{path}:\n" + "\n".join(page.problems.errors)
        walked.append(path)
    assert len(walked) >= 10, walked  # the app's pages, not an empty list
