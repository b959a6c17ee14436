"""Notes and tags edited in place on the run, study and pipeline pages (notes.js), rendered by the
server with raw HTML escaped; the runs list shows a note's first line."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_note_and_tags_are_edited_in_place(page: Any, shot: Any, ui_server: Any) -> None:
    marker = f"notes-{uuid.uuid4().hex[:6]}"
    run = ui_server.external_run(f"noted-{marker}", {"algorithm": "conspo"}, tags=["old"])
    ui_server.log(run["id"], range(1, 4))
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    page.wait_for_selector("#note-body:has-text('No note yet.')")
    page.click("#notes-edit")
    page.fill(
        "#note-input",
        f"# Why this run\n\nτ = 5 beat **GRPO** — <img src=x onerror=alert(1)> {marker}\n",
    )
    page.fill("#tags-input", f"best, {marker}")
    page.click("#notes-save")
    page.wait_for_selector("#note-body h1:has-text('Why this run')")
    assert page.inner_text("#note-body strong") == "GRPO"
    assert page.query_selector("#note-body img") is None  # shown as text, never as markup
    assert "<img src=x" in page.inner_text("#note-body")
    wait_until(
        page, lambda: marker in page.inner_text("#run-meta"), what="the new tags in the meta"
    )
    stored = ui_server.api("GET", f"/api/runs/{run['id']}")
    assert stored["tags"] == ["best", marker] and stored["note"].startswith("# Why this run")
    shutil.copy(shot(page, "run-notes"), ROOT / "docs" / "screenshot-run-notes.png")

    # a bad tag: the field is named, nothing is saved, the form stays open with the input
    page.problems.allow_http_error(422, f"/api/runs/{run['id']}")
    page.click("#notes-edit")
    page.fill("#tags-input", "x" * 101)
    page.click("#notes-save")
    wait_until(page, lambda: "body.tags.0" in page.inner_text("#notes-error"), what="the error")
    assert not page.is_hidden("#notes-form")
    assert ui_server.api("GET", f"/api/runs/{run['id']}")["tags"] == ["best", marker]

    # the runs list: the note's first line under the run's name
    page.goto(f"{ui_server.url}/?tag={marker}")
    line = page.wait_for_selector(f"tr[data-id='{run['id']}'] .note-line")
    assert line.inner_text() == "Why this run"


def test_study_and_pipeline_notes_are_edited_in_place(page: Any, ui_server: Any) -> None:
    config = {"algorithm": "grpo", "steps": 2, "task": {"name": "arith"},
              "model": {"name": "tiny"}, "eval": {"every": 0}}  # fmt: skip
    study = ui_server.api("POST", "/api/studies", json={
        "name": "noted-study", "config": config, "seeds": [0, 1],
        "arms": [{"name": "grpo", "overrides": {}},
                 {"name": "conspo", "overrides": {"algorithm": "conspo"}}],
        "objective": {"metric": "eval/accuracy"}, "concurrency": 1,
    })  # fmt: skip
    ui_server.api("POST", f"/api/studies/{study['id']}/cancel")
    page.goto(f"{ui_server.url}/studies/{study['id']}")
    page.click("#notes-edit")
    page.fill("#note-input", "Seeds 0 and 1 *first*")
    page.click("#notes-save")
    page.wait_for_selector("#note-body em:has-text('first')")
    assert ui_server.api("GET", f"/api/studies/{study['id']}")["note"] == "Seeds 0 and 1 *first*"

    pipeline = ui_server.api("POST", "/api/pipelines", json={"name": "noted", "stages": [config]})
    ui_server.api("POST", f"/api/pipelines/{pipeline['id']}/cancel")
    page.goto(f"{ui_server.url}/pipelines/{pipeline['id']}")
    page.click("#notes-edit")
    assert page.query_selector("#tags-input") is None  # a pipeline has no tags to edit
    page.fill("#note-input", "stage 0 only, for `sft`")
    page.click("#notes-save")
    page.wait_for_selector("#note-body code:has-text('sft')")


def test_the_runs_list_finds_runs_by_where_and_names_a_bad_query(
    page: Any, shot: Any, ui_server: Any
) -> None:
    marker = f"where-{uuid.uuid4().hex[:6]}"
    good = ui_server.external_run(f"tau5-{marker}", {"algorithm": "conspo", "params": {"tau": 5}},
                                  tags=[marker])  # fmt: skip
    low = ui_server.external_run(f"tau2-{marker}", {"algorithm": "conspo", "params": {"tau": 2}},
                                 tags=[marker])  # fmt: skip
    for run in (good, low):
        ui_server.log(run["id"], range(1, 3))
    page.goto(f"{ui_server.url}/?tag={marker}")
    page.wait_for_selector(f"tr[data-id='{low['id']}']")
    page.fill("#f-where", "params.tau>=5")
    wait_until(page, lambda: page.query_selector(f"tr[data-id='{low['id']}']") is None,
               what="the τ=2 run to leave the list")  # fmt: skip
    assert page.query_selector(f"tr[data-id='{good['id']}']") is not None
    assert "where=params.tau" in page.url  # the view can be shared
    shutil.copy(shot(page, "runs-where"), ROOT / "docs" / "screenshot-runs-where.png")
    page.problems.allow_http_error(422, "/api/runs")
    page.fill("#f-where", "params.tau>=5 OR x=1")
    wait_until(page, lambda: "at character 15" in page.inner_text("#f-where-error"),
               what="the parse error beside the box")  # fmt: skip
    page.reload()
    assert page.input_value("#f-where") == "params.tau>=5 OR x=1"
