"""The run page's Logs tab and a failed run's last lines: a run trained by the real worker whose
dataset is gone by the time it starts fails, and its page leads with what it printed last (the
traceback) beside the error; the Logs tab shows the whole log as text."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_run_leads_with_its_traceback_and_the_logs_tab_shows_it(
    page: Any, shot: Any, ui_server: Any
) -> None:
    if not ui_server.has_worker:
        pytest.skip("needs the embedded worker: the log is what its process printed")
    folder = ui_server.data_dir / "datasets" / f"ui-log-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    path = folder / "train.jsonl"
    path.write_text("".join(f'{{"prompt": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(20)))
    config = {
        "algorithm": "grpo", "steps": 2, "model": {"name": "tiny"},
        "task": {"name": "jsonl", "params": {"path": str(path)}, "eval_size": 4},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "name": "ui-log-fails",
    }  # fmt: skip
    run_id = ui_server.api("POST", "/api/runs", json={"config": config})["runs"][0]["id"]
    path.unlink()  # accepted at submit, gone when the worker reads it
    wait_until(page, lambda: ui_server.api("GET", f"/api/runs/{run_id}")["status"] == "failed",
               timeout=300, what="the run to fail")  # fmt: skip
    page.goto(f"{ui_server.url}/runs/{run_id}")
    tail = page.wait_for_selector("#run-error-log pre.log-tail")
    last = tail.inner_text()  # the traceback's last lines: its frames and the exception
    assert 'File "' in last and "not a readable regular file" in last, last
    assert not page.is_hidden("#run-error")
    page.click(".tabs button[data-tab='logs']")
    wait_until(page, lambda: "Traceback (most recent call last)" in page.inner_text("#run-log"),
               what="the traceback in the Logs tab")  # fmt: skip
    assert page.query_selector("#run-log script, #run-log img") is None
    shutil.copy(shot(page, "run-logs"), ROOT / "docs" / "screenshot-run-logs.png")


def test_carriage_returns_redraw_the_line_as_on_a_terminal(page: Any, ui_server: Any) -> None:
    """tqdm redraws its bar with "\\r": the Logs tab shows each bar's last state on one line,
    a redraw split across two chunks included, not every state run together."""
    from backend.config import Settings
    from backend.db import Database
    from backend.storage import run_logs

    if not (ui_server.data_dir / "conspo.db").is_file():
        pytest.skip("writes the log into the server's own database")
    run = ui_server.external_run(f"ui-log-cr-{uuid.uuid4().hex[:6]}", {}, total_steps=3)
    chunks = [
        "loading the model\n",
        "steps:   0%|      | 0/3\rsteps:  33%|##    | 1/3\r",  # the worker keeps endless lines
        "steps:  67%|####  | 2/3\rsteps: 100%|######| 3/3\n",
        "evaluating\r\ndone\n",
    ]
    db = Database(Settings(data_dir=ui_server.data_dir))
    try:
        with db.session() as session:
            for text in chunks:
                run_logs.append(session, run["id"], 1, text)
            session.commit()
    finally:
        db.engine.dispose()
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    page.click(".tabs button[data-tab='logs']")
    log = page.locator("#run-log")
    wait_until(page, lambda: "done" in log.inner_text(), what="the log's last line")
    assert log.inner_text().splitlines() == [
        "loading the model",
        "steps: 100%|######| 3/3",
        "evaluating",
        "done",
    ]
    # a shorter redraw writes over the start of the line and leaves the rest, as a terminal
    typed = page.evaluate(
        "() => import('/static/run_log.js').then(m => m.asOnTerminal('12345\\rab\\r\\nnext'))"
    )
    assert typed == "ab345\nnext"
