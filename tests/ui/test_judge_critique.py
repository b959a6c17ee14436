"""A judge's critique in the rollout viewer, in a real Chromium (see conftest.py for the stack):
below a rollout's answer, folded, what the judge reward wrote of it, shown as text (a judge's
output is model text: hostile markup stays inert); a rollout no judge scored has none. The
critique is written the way the worker's sink writes it (``RolloutRecord.critique``, through
``backend.storage.writes``) into the server's database."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.orm import Session

from backend.db import make_engine
from backend.storage.writes import StepPoints, write_points
from conspo.sink import RolloutRecord
from tests.ui.conftest import fake_metrics

pytestmark = pytest.mark.browser
HOSTILE = '<img src=x onerror="window.__xss = 1">The sum is right.\nScore: 9'


@pytest.fixture(scope="module")
def judged_run(ui_server: Any) -> dict[str, Any]:
    database = ui_server.data_dir / "conspo.db"
    if not database.exists():
        pytest.skip("the critiques are written into the test server's own database")
    config = {"algorithm": "grpo", "steps": 1, "task": {"name": "arith"}}
    run = ui_server.external_run(
        f"ui-judge-{uuid.uuid4().hex[:6]}", config, algorithm="grpo", total_steps=1
    )
    body = {"steps": [{"step": 1, "metrics": fake_metrics(1)}], "status": "succeeded"}
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json=body)
    records = [
        RolloutRecord(0, 0, 1.0, -0.5, 3, False, "3+4=", "7", critique=HOSTILE),
        RolloutRecord(0, 1, 0.0, -0.9, 3, False, "3+4=", "8"),
    ]
    engine = make_engine(f"sqlite:///{database}")
    try:
        with Session(engine) as session:
            write_points(session, run["id"], [StepPoints(1, {}, rollouts=records)])
            session.commit()
    finally:
        engine.dispose()
    return run


def test_the_rollout_viewer_folds_each_judges_critique_under_its_answer(
    page: Any, ui_server: Any, judged_run: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/{judged_run['id']}")
    page.wait_for_selector("#rollout-body details.critique", state="attached")
    rows = page.locator("#rollout-body tr")
    judged, plain = rows.nth(0), rows.nth(1)
    critique = judged.locator("details.critique")
    assert critique.locator("summary").text_content() == "judge's critique"
    assert not critique.locator("pre").is_visible()  # folded until asked
    critique.locator("summary").click()
    assert critique.locator("pre").text_content() == HOSTILE
    assert judged.locator("img").count() == 0
    assert page.evaluate("window.__xss") is None
    assert plain.locator("details.critique").count() == 0
