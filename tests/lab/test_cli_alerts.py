"""`conspo-lab alerts add / list / test / fired / rm` and the Python client against a real
server whose dispatcher calls a real webhook receiver on this machine."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from conspo_lab.cli import app
from tests.support import WebhookReceiver

runner = CliRunner()


def invoke(server, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, [*args, "--url", server.url, "--token", server.token], env=env)
    return result, " ".join(result.output.split())  # rich wraps long lines


def test_an_alert_made_from_the_cli_reaches_the_webhook(lab_server) -> None:  # type: ignore[no-untyped-def]
    receiver = WebhookReceiver()
    lab = lab_server.client()
    try:
        run = lab.create_external_run("cli-alerts")
        hook = receiver.url()
        # the URL from the environment, not the command line (ps shows argv to every user)
        made, text = invoke(
            lab_server, "alerts", "add", "--on", "failed", "--run", str(run.id),
            "--format", "json", "--name", "it broke", env={"CONSPO_ALERT_WEBHOOK": hook},
        )  # fmt: skip
        assert made.exit_code == 0, made.output
        rule_id = int(text.split("alert #", 1)[1].split(":", 1)[0])
        assert "failed on run #" in text and "s3cr3t" not in text
        listed, text = invoke(lab_server, "alerts", "list", "--run", str(run.id))
        assert listed.exit_code == 0 and "it broke" in text and "s3cr3t" not in text

        tested, text = invoke(lab_server, "alerts", "test", str(rule_id))
        assert tested.exit_code == 0 and "took the test message" in text, text
        assert receiver.wait(1)[0][1]["alert"]["event"] == "test"

        lab.log_steps(run.id, [{"step": 1, "metrics": {"loss": 1.0}}], status="failed", error="OOM")
        body = receiver.wait(2)[1][1]
        assert body["alert"]["event"] == "failed" and "OOM" in body["text"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shown, text = invoke(lab_server, "alerts", "fired", "--run", str(run.id))
            if "delivered" in text:
                break
            time.sleep(0.5)
        assert shown.exit_code == 0 and "delivered" in text and "failed at step 1: OOM" in text

        removed, text = invoke(lab_server, "alerts", "rm", str(rule_id))
        assert removed.exit_code == 0 and lab.alerts(run_id=run.id) == []
        gone, text = invoke(lab_server, "alerts", "rm", str(rule_id))
        assert gone.exit_code == 2 and f"alert rule {rule_id} not found" in text
    finally:
        receiver.close()
        lab.close()


def test_bad_alerts_are_refused_with_the_field_named(lab_server) -> None:  # type: ignore[no-untyped-def]
    hook = "https://hooks.example.com/services/x"
    result, text = invoke(lab_server, "alerts", "add", "--on", "metric", "--webhook", hook)
    assert result.exit_code == 2 and "metric" in text and "comparison" in text
    result, text = invoke(
        lab_server, "alerts", "add", "--on", "metric", "--metric", "loss", "--below", "1",
        "--above", "2", "--webhook", hook,
    )  # fmt: skip
    assert result.exit_code == 2 and "one of --below, --above, --nonfinite" in text
    result, text = invoke(lab_server, "alerts", "add", "--on", "failed", "--webhook", "ftp://x/y")
    assert result.exit_code == 2 and "webhook" in text and "only http and https" in text
