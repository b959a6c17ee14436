"""The run page's status line says what a running run is doing between steps (issue 49: a run
sat 6 minutes at "0/10, ETA –" while it evaluated at step 0). The phase is the run row's, as the
worker's sink writes it from the trainer's phase events (tests/api/test_api_progress.py drives a
real run through them); here the row is written the same way and the page read."""

from __future__ import annotations

import sqlite3
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
