"""The run page's Alerts tab in a real Chromium: a rule set from the form (a bad webhook
refused at its field), fired by the server when the run's metric drops below the line, its
delivery to a real local webhook receiver shown in the page; the URL's secret path never in it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support import WebhookReceiver
from tests.ui.test_pages import wait_until

pytestmark = pytest.mark.browser


def test_an_alert_set_on_the_run_page_fires_and_shows_its_delivery(
    page: Any, shot: Any, ui_server: Any
) -> None:
    page.problems.allow_http_error(422, "/api/alerts")
    receiver = WebhookReceiver()
    try:
        run = ui_server.external_run(f"ui-alerts-{uuid.uuid4().hex[:6]}", {"seed": 0})
        page.goto(f"{ui_server.url}/runs/{run['id']}")
        page.click('.tabs button[data-tab="alerts"]')
        page.wait_for_selector("#alert-form")
        page.wait_for_selector('#alert-rules:has-text("No alert watches this run")')
        # a URL the platform will not call: refused at the field, nothing made
        page.select_option('[name="alert.event"]', "metric")
        page.fill('[name="alert.metric"]', "eval/accuracy")
        page.select_option('[name="alert.comparison"]', "below")
        page.fill('[name="alert.threshold"]', "0.3")
        page.fill('[name="alert.webhook"]', "file:///etc/passwd")
        page.click("#alert-add")
        error = page.wait_for_selector('[data-field="webhook"].has-error .err')
        assert "only http and https" in error.inner_text()
        hook = receiver.url()
        page.fill('[name="alert.webhook"]', hook)
        page.select_option('[name="alert.format"]', "json")
        page.fill('[name="alert.name"]', "accuracy fell")
        page.click("#alert-add")
        page.wait_for_selector("#alert-rules tr[data-rule]")
        row = page.inner_text("#alert-rules")
        assert "eval/accuracy below 0.3" in row and "accuracy fell" in row
        assert f"127.0.0.1:{receiver.server.server_address[1]}/…" in row
        assert "s3cr3t" not in page.content()

        for step, accuracy in ((1, 0.6), (2, 0.1)):
            points = {"steps": [{"step": step, "metrics": {"eval/accuracy": accuracy}}]}
            ui_server.api("POST", f"/api/runs/{run['id']}/log", json=points)
        (_, body, _) = receiver.wait(1)[0]
        assert body["alert"]["run_id"] == run["id"] and body["alert"]["step"] == 2
        wait_until(
            page,
            lambda: page.locator('#alert-firings tr[data-state="delivered"]').count() == 1,
            120,
            "the delivery shown",
        )
        fired = page.inner_text("#alert-firings")
        assert "eval/accuracy = 0.1, below 0.3 at step 2" in fired and "delivered" in fired
        shot(page, "run_alerts")
        assert "s3cr3t" not in page.content()
    finally:
        receiver.close()
