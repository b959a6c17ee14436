"""Ordered by a summary, the runs list shows that summary (issue 49: ordered by max, the value
column showed each run's last value, so the list looked out of order): the column's head names
the summary, each row shows its run's value of it, and the column reads in order."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser


def test_the_value_column_shows_what_the_list_is_ordered_by(page: Any, ui_server: Any) -> None:
    tag = f"ordered-{uuid.uuid4().hex[:6]}"
    series = {"peaked": [0.1, 0.9, 0.2], "climbing": [0.1, 0.3, 0.6]}  # max 0.9, last 0.2
    ids = {}
    for name, values in series.items():
        run = ui_server.external_run(f"{name}-{tag}", {}, tags=[tag], total_steps=3)
        steps = [{"step": s, "metrics": {"sep/gap": v}} for s, v in enumerate(values)]
        ui_server.api("POST", f"/api/runs/{run['id']}/log", json={"steps": steps})
        ids[name] = run["id"]
    query = urlencode({"tag": tag, "metric": "sep/gap", "order_by": "-max(sep/gap)"})
    page.goto(f"{ui_server.url}/?{query}")
    rows = f'tr[data-id="{ids["peaked"]}"], tr[data-id="{ids["climbing"]}"]'
    wait_until(page, lambda: len(page.query_selector_all(rows)) == 2, what="both runs listed")
    assert page.text_content("#value-head") == "max"  # (shown upper-case)
    shown = [
        (int(row.get_attribute("data-id")), row.query_selector("td.value-cell").inner_text())
        for row in page.query_selector_all(rows)
    ]
    assert shown == [(ids["peaked"], "0.9"), (ids["climbing"], "0.6")]
    page.select_option("#f-order", "")  # newest first: the column is the last values again
    wait_until(page, lambda: page.text_content("#value-head") == "last", what="the last values")
    cell = f'tr[data-id="{ids["peaked"]}"] td.value-cell'
    wait_until(page, lambda: page.inner_text(cell) == "0.2", what="the peaked run's last value")
