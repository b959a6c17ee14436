"""``conspo-lab submit`` of a run with tools: the YAML is checked locally, the server refuses a
tool that runs code while no live worker has a sandbox (the field and the capability in the
message), and queues it as written once one does; the client lists the tools."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from backend.config import Settings
from backend.db import Database
from backend.liveness import WorkerIdentity, mark_alive, mark_stopped
from conspo_lab.cli import app
from tests.lab.test_cli import invoke
from tests.support import closed_port_url

runner = CliRunner()
TOOLS_YAML = """\
algorithm: grpo
steps: 2
sampling: {prompts_per_step: 2, group_size: 2, max_new_tokens: 8}
tools:
  names: [python, calculator]
  max_turns: 3
  timeout_s: 10
"""


def lab_database(server: Any) -> Database:
    env = server.env
    return Database(
        Settings(
            data_dir=server.data_dir,
            database_url=env["CONSPO_DATABASE_URL"],
            broker_url=env["CONSPO_BROKER_URL"],
        )
    )


def test_submit_a_yaml_with_tools(lab_server, lab, tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text(TOOLS_YAML)
    # No worker runs beside this server: nothing could sandbox the python tool.
    refused = invoke(lab_server, "submit", str(config), "--tag", "cli-tools")
    assert refused.exit_code == 2
    said = " ".join(refused.output.split())  # the console wraps long lines
    assert "HTTP 422: config.tools.names.0: tool 'python' runs model-written code" in said
    assert "no live worker has a sandbox" in said
    db = lab_database(lab_server)
    worker = WorkerIdentity(host="cli-tools", pid=1, capabilities={"sandbox": "bwrap"})
    try:
        with db.session() as session:
            mark_alive(session, worker)
        queued = invoke(lab_server, "submit", str(config), "--tag", "cli-tools")
        assert queued.exit_code == 0, queued.output
    finally:
        with db.session() as session:
            mark_stopped(session, worker)
        db.dispose()
    (run,) = lab.list_runs(tag="cli-tools").items
    lab.cancel(run.id)  # nothing trains beside this server
    tools = run.config["tools"]
    assert tools["names"] == ["python", "calculator"]
    assert tools["max_turns"] == 3 and tools["timeout_s"] == 10
    sandboxed = {t.name: t.sandboxed for t in lab.presets().tools}
    assert sandboxed["python"] is True and sandboxed["calculator"] is False


def test_a_tools_section_out_of_bounds_is_named_before_anything_is_sent(tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text("algorithm: grpo\ntools:\n  names: [shell]\n  max_turns: 17\n")
    result = runner.invoke(app, ["submit", str(config), "--url", closed_port_url()])
    assert result.exit_code == 2
    assert "tools.names.0" in result.output and "tools.max_turns" in result.output
