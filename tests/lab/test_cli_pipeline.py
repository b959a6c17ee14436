"""`conspo-lab pipeline run / show / cancel` and `conspo-lab models` against a real server (no
worker: stage 1 stays queued, which is all the commands need; the browser test trains one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conspo_lab.cli import app
from conspo_lab.cli_pipeline import _load

runner = CliRunner()

PIPELINE = """\
name: cli-pipeline
stages:
  - {kind: sft, steps: 2, model: {name: tiny}, kind_params: {batch_size: 4}}
  - {algorithm: conspo, steps: 2, model: {name: tiny, step: last}}
"""


def invoke(server, *args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, [*args, "--url", server.url, "--token", server.token])
    return result, " ".join(result.output.split())  # rich wraps long lines


def test_pipeline_file_show_cancel_and_models(lab_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    result, text = invoke(lab_server, "pipeline", "run", str(path))
    assert result.exit_code == 0, result.output
    assert "2 stages, stage 1 is run" in text
    pipeline_id = text.split("pipeline ", 1)[1].split(" ", 1)[0]
    shown, text = invoke(lab_server, "pipeline", "show", pipeline_id)
    assert shown.exit_code == 0, shown.output
    assert "(queued)" in text and "queued" in text and "waiting" in text and "tiny" in text
    cancelled, text = invoke(lab_server, "pipeline", "cancel", pipeline_id)
    assert cancelled.exit_code == 0 and f"pipeline {pipeline_id}: cancelled" in text
    shown, text = invoke(lab_server, "pipeline", "show", pipeline_id)
    assert "not run" in text

    listed, _ = invoke(lab_server, "models")
    assert listed.exit_code == 0, listed.output
    missing, text = invoke(lab_server, "models", "export", "999999")
    assert missing.exit_code == 2 and "999999" in text

    path.write_text(PIPELINE.replace("batch_size: 4", "batch_size: 0"))
    bad, text = invoke(lab_server, "pipeline", "run", str(path))
    assert bad.exit_code == 2 and "stage 1 is not a valid run config" in text
    assert "kind_params.batch_size" in text
    path.write_text("- not a mapping")
    assert invoke(lab_server, "pipeline", "run", str(path))[0].exit_code == 2


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "pipelines").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_example_pipelines_load_as_the_cli_sends_them(path: Path) -> None:
    """Every stage of every example pipeline is a valid run config (``conspo-lab pipeline run``
    validates them all before it sends anything; a refusal exits 2)."""
    spec = _load(path)
    assert spec["stages"] and all(isinstance(stage, dict) for stage in spec["stages"])


def test_the_retool_baseline_is_the_tool_pipeline_without_the_interpreter() -> None:
    """ReTool's comparison holds only if the two pipelines differ in the tool alone."""

    def without_tools(stage: dict[str, Any]) -> dict[str, Any]:
        stage = {key: value for key, value in stage.items() if key != "tools"}
        params = {k: v for k, v in stage.get("kind_params", {}).items() if k != "tool"}
        return {**stage, "kind_params": params} if "kind_params" in stage else stage

    folder = EXAMPLES[0].parent
    tools = _load(folder / "retool_smollm2.yaml")["stages"]
    plain = _load(folder / "retool_smollm2_no_tools.yaml")["stages"]
    assert tools[0]["kind_params"]["tool"] == "python" and "python" in str(tools[1]["tools"])
    assert [without_tools(s) for s in tools] == plain
