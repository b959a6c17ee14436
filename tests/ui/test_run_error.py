"""A failed run's page says why it failed first (issue 49: the reason is a traceback's last line,
and the box, under the details panel and cut at a fixed height, left it below the fold): the
line that says why leads the box, in view at 1440 × 900 and at 800 px wide, with the traceback
folded under it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.browser

FRAMES = "".join(
    f'  File "/srv/conspo/module_{i}.py", line {10 + i}, in step_{i}\n    call_{i}()\n'
    for i in range(40)
)
REASON = "ValueError: kind_params.path: data/sft.jsonl holds no problems"
TRACEBACK = f"Traceback (most recent call last):\n{FRAMES}{REASON}\n"


@pytest.mark.parametrize("width", [1440, 800])
def test_a_failed_runs_reason_is_in_view_above_its_traceback(
    page: Any, ui_server: Any, width: int
) -> None:
    run = ui_server.external_run(f"fails-{uuid.uuid4().hex[:6]}", {}, total_steps=10)
    closed = {"steps": [], "status": "failed", "error": TRACEBACK}
    ui_server.api("POST", f"/api/runs/{run['id']}/log", json=closed)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{ui_server.url}/runs/{run['id']}")
    why = page.wait_for_selector("#run-error-why")
    assert why.inner_text() == f"Error: {REASON}"
    box = why.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900, box  # above the fold
    trace = page.query_selector("#run-error details.error-trace")
    assert trace is not None and trace.get_attribute("open") is None  # folded
    trace.click()
    assert "module_39.py" in page.inner_text("#run-error details.error-trace pre")
