"""Alerts end to end, on SQLite and PostgreSQL: rules made through the API, fired by the API
process's own dispatcher thread, delivered to a real HTTP receiver on this machine (standing
for Slack/Discord), retried with backoff, each (rule, run) once, and the webhook's secret path
never in an answer or the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from backend.alerts import webhooks
from backend.config import Settings
from tests.api.conftest import Api, make_tokens
from tests.support import WebhookReceiver

SECRET = "s3cr3t-key"


@pytest.fixture
def alerting(own_settings: Settings) -> Iterator[Api]:
    """An API whose dispatcher checks rules every 0.2 s and may call this machine's receiver."""
    from fastapi.testclient import TestClient

    from backend.main import create_app

    settings = own_settings.model_copy(update={"alert_poll_s": 0.2, "alert_allow_private": True})
    with TestClient(create_app(settings)) as client:
        yield Api(client, settings, make_tokens(settings))


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    made = WebhookReceiver()
    yield made
    made.close()


def firings(api: Api, **params: Any) -> list[dict[str, Any]]:
    r = api.get("/api/alerts/firings", user="alice", params=params)
    assert r.status_code == 200, r.text
    return list(r.json()["firings"])


def wait_for_firings(api: Api, run_id: int, n: int, state: str | None = "delivered") -> list[Any]:
    """At least ``n`` firings for ``run_id`` in ``state`` (None: in any state)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = [f for f in firings(api, run_id=run_id) if state in (None, f["state"])]
        if len(seen) >= n:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"no {n} {state} firings for run {run_id}: {firings(api, run_id=run_id)}")


def rule(api: Api, **body: Any) -> dict[str, Any]:
    r = api.post("/api/alerts", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_a_failed_run_and_a_metric_below_a_line_reach_the_webhook_once(
    alerting: Api, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    api = alerting
    run = api.external(name="alerting-run")
    hook = receiver.url()
    on_drop = rule(
        api, run_id=run["id"], event="metric", metric="eval/accuracy", comparison="below",
        threshold=0.3, webhook=hook, name="accuracy fell",
    )  # fmt: skip
    rule(api, run_id=run["id"], event="failed", webhook=hook, format="json")
    rule(api, event="finished", webhook=hook, format="discord")  # every run of alice
    assert on_drop["webhook"] == f"http://127.0.0.1:{receiver.server.server_address[1]}/…"
    log = lambda steps, **kw: api.post(f"/api/runs/{run['id']}/log", json={"steps": steps, **kw})  # noqa: E731
    assert log([{"step": 1, "metrics": {"eval/accuracy": 0.5}}]).status_code == 200
    assert log([{"step": 2, "metrics": {"eval/accuracy": 0.2}}]).status_code == 200
    assert log([{"step": 3, "metrics": {"eval/accuracy": 0.1}}]).status_code == 200

    (metric,) = wait_for_firings(api, run["id"], 1)
    assert metric["event"] == "metric" and metric["step"] == 2 and metric["value"] == 0.2
    path, body, _ = receiver.calls[0]
    assert path.endswith(SECRET)
    assert "eval/accuracy = 0.2, below 0.3 at step 2" in body["text"]
    assert "'alerting-run'" in body["text"]

    error = "CUDA out of memory <b>&</b>"
    assert log([], status="failed", error=error).status_code == 200
    delivered = wait_for_firings(api, run["id"], 3)
    assert {f["event"] for f in delivered} == {"metric", "failed", "finished"}
    bodies = [b for _, b, _ in receiver.calls]
    failed = next(b for b in bodies if "alert" in b)  # the json format
    assert failed["alert"]["event"] == "failed" and failed["alert"]["run_id"] == run["id"]
    assert error in failed["text"] and failed["alert"]["step"] == 3
    discord = next(b for b in bodies if "content" in b)
    assert "failed at step 3" in discord["content"]
    assert discord["allowed_mentions"] == {"parse": []}
    slack = next(b for b in bodies if "eval/accuracy" in b.get("text", ""))
    assert "<" not in slack["text"]  # Slack's control characters escaped (none here)

    time.sleep(2)  # ten more passes: nothing fires twice
    assert len(receiver.calls) == 3
    listed = api.get("/api/alerts", user="alice").json()["rules"]
    assert [r["fired"] for r in listed] == [1, 1, 1]
    assert api.get("/api/alerts", user="bob").json()["rules"] == []
    assert firings(api) and not api.get("/api/alerts/firings", user="bob").json()["firings"]
    everything = str(listed) + str(firings(api)) + caplog.text
    assert SECRET not in everything


def test_a_failing_webhook_is_retried_with_doubling_waits_and_a_refusing_one_is_not(
    alerting: Api,
) -> None:
    api = alerting
    flaky, refusing = (
        WebhookReceiver(fail=2, fail_status=503),
        WebhookReceiver(fail=9, fail_status=404),
    )
    try:
        run = api.external(name="flaky-hooks")
        rule(api, run_id=run["id"], event="failed", webhook=flaky.url())
        rule(api, run_id=run["id"], event="failed", webhook=refusing.url())
        api.post(f"/api/runs/{run['id']}/log", json={"steps": [], "status": "failed"})
        wait_for_firings(api, run["id"], 1, "delivered")
        (gone,) = wait_for_firings(api, run["id"], 1, "failed")
        times = [t for _, _, t in flaky.wait(3)]
        assert times[1] - times[0] >= 1.9 and times[2] - times[1] >= 3.9  # 2 s, then 4 s
        assert len(refusing.calls) == 1 and gone["attempts"] == 1
        assert "answered HTTP 404" in gone["last_error"] and SECRET not in gone["last_error"]
        by_state = {f["state"]: f for f in firings(api, run_id=run["id"])}
        assert by_state["delivered"]["attempts"] == 3
    finally:
        flaky.close()
        refusing.close()


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"event": "metric", "comparison": "below", "threshold": 1}, "metric", "names its metric"),
        ({"event": "metric", "metric": "loss"}, "comparison", "below, above or nonfinite"),
        ({"event": "metric", "metric": "l", "comparison": "above"}, "threshold", "a threshold"),
        ({"event": "metric", "metric": "x", "comparison": "nonfinite", "threshold": 1},
         "threshold", "no threshold"),
        ({"event": "failed", "metric": "loss"}, "metric", "only a metric alert"),
        ({"event": "failed", "stall_minutes": 5}, "stall_minutes", "only a stalled alert"),
        ({"event": "failed", "webhook": "ftp://hooks.example.com/x"}, "webhook", "only http"),
        ({"event": "failed", "webhook": "http://127.0.0.1:6379/x"}, "webhook", "loopback, private"),
        ({"event": "failed", "webhook": "http://169.254.169.254/latest"}, "webhook", "link-local"),
        ({"event": "failed", "webhook": "http://[::ffff:10.0.0.1]/x"}, "webhook", "private"),
        ({"event": "failed", "webhook": "http://localhost:8000/x"}, "webhook", "loopback"),
        ({"event": "failed", "webhook": "https://u:p@hooks.example.com/x"}, "webhook", "password"),
        ({"event": "failed", "webhook": "https:///x"}, "webhook", "no host"),
        ({"event": "failed", "run_id": 1, "study_id": 1}, "study_id", "not both"),
        ({"event": "sometimes"}, "event", ""),
        ({"event": "metric", "metric": "x", "comparison": "below", "threshold": "1"},
         "threshold", ""),
    ],
)  # fmt: skip
def test_bad_rules_are_refused_at_their_field(
    api: Api, body: dict[str, Any], field: str, says: str
) -> None:
    payload = {"webhook": "https://hooks.example.com/services/T/B/x", **body}
    held = len(api.get("/api/alerts", user="alice").json()["rules"])
    r = api.post("/api/alerts", json=payload)
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert any(e["loc"] == ["body", field] and says in e["msg"] for e in errors), errors
    assert len(api.get("/api/alerts", user="alice").json()["rules"]) == held  # nothing made


def test_rules_need_a_token_a_real_scope_and_belong_to_their_maker(api: Api) -> None:
    hook = "https://hooks.example.com/services/T/B/x"
    assert (
        api.post("/api/alerts", user=None, json={"event": "failed", "webhook": hook}).status_code
        == 401
    )
    r = api.post("/api/alerts", json={"event": "failed", "webhook": hook, "run_id": 10**9})
    assert r.status_code == 404 and "run 1000000000 not found" in r.text
    made = rule(api, event="failed", webhook=hook)
    assert (
        made["webhook"] == "https://hooks.example.com/…"
        and made["scope"] == "every run of its owner"
    )
    assert api.delete(f"/api/alerts/{made['id']}", user="bob").status_code == 404
    assert api.delete(f"/api/alerts/{made['id']}", user="alice").status_code == 204
    assert api.delete(f"/api/alerts/{made['id']}", user="alice").status_code == 404


def test_the_operator_allow_list_and_private_switch() -> None:
    listed = Settings(alert_webhook_hosts="hooks.slack.com, *.discord.com")
    assert webhooks.check_url("https://hooks.slack.com/services/x", listed)[0] == "hooks.slack.com"
    assert webhooks.check_url("https://ptb.discord.com/api/webhooks/1", listed)
    with pytest.raises(webhooks.WebhookRefused, match="allow-list"):
        webhooks.check_url("https://evil.example.com/x", listed)
    with pytest.raises(webhooks.WebhookRefused, match="allow-list"):
        webhooks.check_url("https://discord.com.evil.org/x", listed)
    with pytest.raises(webhooks.WebhookRefused, match="loopback"):
        webhooks.check_url("http://127.0.0.1/x", Settings())
    assert webhooks.check_url("http://127.0.0.1:9/x", Settings(alert_allow_private=True))
    # A name is judged by what it resolves to when called: localhost's names are loopback.
    with pytest.raises(webhooks.WebhookRefused, match="loopback"):
        webhooks.check_resolved("localhost", 80, Settings())


def test_a_run_without_a_step_for_the_window_is_stalled_once(
    alerting: Api, receiver: WebhookReceiver
) -> None:
    api = alerting
    quiet, busy = api.external(name="goes-quiet"), api.external(name="keeps-logging")
    for run in (quiet, busy):
        rule(api, run_id=run["id"], event="stalled", stall_minutes=0.05, webhook=receiver.url())
    deadline = time.monotonic() + 60
    step = 0
    while time.monotonic() < deadline and not receiver.calls:
        step += 1  # the busy run logs a step every 0.3 s, well inside its 3 s window
        points = {"steps": [{"step": step, "metrics": {"loss": 1.0}}]}
        api.post(f"/api/runs/{busy['id']}/log", json=points)
        time.sleep(0.3)
    (stalled,) = wait_for_firings(api, quiet["id"], 1)
    assert "stalled: no step for 0.05 min" in stalled["message"]
    assert firings(api, run_id=busy["id"]) == []


def test_test_calls_and_deliveries_share_the_per_minute_budget(
    own_settings: Settings, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from backend.main import create_app

    monkeypatch.setattr(webhooks, "CALLS", webhooks.CallBudget())  # this test's minute alone
    settings = own_settings.model_copy(
        update={"alert_poll_s": 0.2, "alert_allow_private": True, "alert_per_minute": 2}
    )
    with TestClient(create_app(settings)) as client:
        api = Api(client, settings, make_tokens(settings))
        run = api.external(name="budget")
        made = rule(api, run_id=run["id"], event="failed", webhook=receiver.url())
        for _ in range(2):
            assert api.post(f"/api/alerts/{made['id']}/test").json()["delivered"] is True
        r = api.post(f"/api/alerts/{made['id']}/test")
        assert r.status_code == 429 and r.headers["Retry-After"] == "60"
        api.post(f"/api/runs/{run['id']}/log", json={"steps": [], "status": "failed"})
        (waiting,) = wait_for_firings(api, run["id"], 1, state=None)
        time.sleep(1.5)  # several passes: the budget holds the delivery back
        assert len(receiver.calls) == 2
        assert firings(api, run_id=run["id"])[0]["state"] == "pending" and waiting["attempts"] == 0
