"""The run page's status line says what a running run is doing between steps (issue 49: a run
sat 6 minutes at "0/10, ETA –" while it evaluated at step 0). The phase is the run row's, as the
worker's sink writes it from the trainer's phase events (tests/api/test_api_progress.py drives a
real run through them); here the row is written the same way and the page read."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from typing import Any

import pytest

from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser


def test_the_status_line_says_evaluating(page: Any, ui_server: Any) -> None:
    database = ui_server.data_dir / "conspo.db"
    if not database.exists():
        pytest.skip("needs the test's own embedded server (its SQLite database)")
    run = ui_server.external_run(f"phase-{uuid.uuid4().hex[:6]}", {}, total_steps=10)
    with sqlite3.connect(database) as db:  # what worker.db_sink writes on a phase event
        db.execute("UPDATE runs SET phase = 'evaluating' WHERE id = ?", (run["id"],))
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    wait_until(page, lambda: page.query_selector("#run-phase"), what="the phase note")
    assert page.inner_text("#run-phase") == "evaluating"
    assert page.inner_text("#run-status").startswith("running")


def test_an_evaluation_under_way_shows_what_is_left_of_it(page: Any, ui_server: Any) -> None:
    """Issue 49: "ETA 0s" while the last evaluation ran. The ETA is the evaluation's estimate,
    marked as such; once the countdown outlasts it the page says so instead of 0 s."""
    database = ui_server.data_dir / "conspo.db"
    if not database.exists():
        pytest.skip("needs the test's own embedded server (its SQLite database)")
    run = ui_server.external_run(f"eval-eta-{uuid.uuid4().hex[:6]}", {}, total_steps=10)

    def evaluating_last_step(eval_s: float) -> None:
        # the last step's evaluation just began (its step is logged when it ends), timed before
        summary = json.dumps({"time/eval_s": eval_s})
        with sqlite3.connect(database) as db:
            db.execute(
                "UPDATE runs SET phase = 'evaluating', step = 9, pace_s = 1, last_step_at = ?,"
                " summary = ? WHERE id = ?",
                (time.time(), summary, run["id"]),
            )

    evaluating_last_step(600.0)
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    eta = page.locator("#meta-eta")
    wait_until(page, lambda: "(evaluating)" in eta.inner_text(), what="the evaluation's ETA")
    assert eta.inner_text().startswith(("~10m", "~9m"))  # 600 s of it left, less the load
    assert "ETA ~" in page.inner_text("#run-progress .plabel")
    evaluating_last_step(0.5)  # an estimate the evaluation has outlasted
    page.reload()
    wait_until(page, lambda: "past its estimate" in eta.inner_text(), what="an overdue evaluation")
    assert "0s" not in page.inner_text("#run-progress .plabel")
