"""The client-side ``conspo-lab`` commands (submit, runs, watch, compare, export)."""

from __future__ import annotations

import csv
import io
import json

import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from conspo_lab import cli_client
from conspo_lab.cli import app
from tests.support import closed_port_url

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch):
    # Tables wide enough that no value is cut; Console(file=None) writes to the runner's stdout.
    monkeypatch.setattr(cli_client, "console", Console(width=250))
    monkeypatch.setattr(cli_client, "err_console", Console(width=250, stderr=True))


def invoke(server, *args: str):
    return runner.invoke(app, [*args, "--url", server.url, "--token", server.token])


@pytest.fixture
def logged_run(lab):
    """An external run with 4 steps of 3 keys (one null), finished."""
    run = lab.create_external_run("cli-ext", {}, "trl-grpo", "arith", "tiny", ["cli"], 4)
    rows = [
        {"step": s, "metrics": {"sep/gap": 0.1 * s, "loss": 2.0 - 0.25 * s}, "wall_time": 1e9 + s}
        for s in range(1, 5)
    ]
    rows[1]["metrics"]["batch/pass_rate"] = 0.5
    lab.log_steps(run.id, rows, status="succeeded")
    return run


def test_submit_bad_config_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: grpo\nsampling:\n  group_size: 1\n")
    result = runner.invoke(app, ["submit", str(bad), "--url", closed_port_url()])
    assert result.exit_code == 2
    assert "sampling.group_size" in result.output
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("algorithm: conspo\nparams:\n  taux: 3\n")
    result = runner.invoke(app, ["submit", str(unknown)])
    assert result.exit_code == 2 and "params.taux" in result.output
    result = runner.invoke(app, ["submit", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_submit_queues_one_run_per_seed_and_runs_lists_them(lab_server, lab, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("algorithm: dapo\nsteps: 3\nsampling:\n  group_size: 4\n")
    result = invoke(lab_server, "submit", str(good), "--seeds", "0,1,2", "--tag", "cli-submit")
    assert result.exit_code == 0, result.output
    assert "queued runs" in result.output
    page = lab.list_runs(tag="cli-submit")
    assert page.total == 3 and sorted(r.seed for r in page.items) == [0, 1, 2]
    assert all(r.config["sampling"]["group_size"] == 4 for r in page.items)

    listed = invoke(lab_server, "runs", "--tag", "cli-submit", "--status", "queued")
    assert listed.exit_code == 0, listed.output
    for run in page.items:
        assert str(run.id) in listed.output
    assert "dapo" in listed.output and "3 of 3" in listed.output
    # Issue 26 item 15: a queued run's place in the queue and why it waits, as on the page.
    for run in lab.list_runs(tag="cli-submit").items:
        assert f"queued #{run.queue_position}" in listed.output
        assert run.waiting_reason and run.waiting_reason in listed.output


def test_export_csv_jsonl_parquet(lab_server, logged_run, tmp_path):
    out = tmp_path / "wide.csv"
    result = invoke(lab_server, "export", str(logged_run.id), "--format", "csv", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "wide layout" in result.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[2]["sep/gap"]) == pytest.approx(0.3)
    assert rows[1]["batch/pass_rate"] == "0.5" and rows[0]["batch/pass_rate"] == ""
    assert float(rows[3]["wall_time"]) == pytest.approx(1e9 + 4)

    out = tmp_path / "long.jsonl"
    result = invoke(
        lab_server,
        "export",
        str(logged_run.id),
        "--format",
        "jsonl",
        "--layout",
        "long",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "long layout" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 9  # 4 + 4 + 1 points
    assert {"run_id", "key", "step", "value", "wall_time"} == set(lines[0])
    gap = {r["step"]: r["value"] for r in lines if r["key"] == "sep/gap"}
    assert gap[4] == pytest.approx(0.4)

    out = tmp_path / "wide.parquet"
    result = invoke(
        lab_server, "export", str(logged_run.id), "--format", "parquet", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    table = pq.read_table(out).to_pydict()
    assert table["step"] == [1, 2, 3, 4]
    assert table["loss"] == pytest.approx([1.75, 1.5, 1.25, 1.0])
    assert table["batch/pass_rate"] == [None, 0.5, None, None]


def test_compare_shows_last_mean_and_extreme(lab_server, lab, logged_run, tmp_path):
    other = lab.create_external_run("cli-ext-2", {}, "trl-grpo", "arith", "tiny", [], 2)
    lab.log_steps(
        other.id,
        [{"step": s, "metrics": {"sep/gap": 0.9 - 0.1 * s, "loss": 3.0}} for s in (1, 2)],
        status="succeeded",
    )
    result = invoke(
        lab_server, "compare", str(logged_run.id), str(other.id), "--keys", "sep/gap,loss"
    )
    assert result.exit_code == 0, result.output
    text = result.output
    assert "sep/gap" in text and "cli-ext-2" in text
    # logged_run: last gap 0.4 (its max), min loss 1; other: last gap 0.7, max 0.8, mean 0.75.
    assert "┃ best" not in text and "extreme" in text and "0.75" in text
    assert "0.4" in text and "0.8" in text and "0.7" in text

    # --report: one self-contained HTML file (or the CSV of last-3 means), grouped
    ids = [str(logged_run.id), str(other.id)]
    out = tmp_path / "cmp.html"
    args = ["--keys", "sep/gap", "--report", str(out)]
    result = invoke(lab_server, "compare", *ids, *args)
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "renderStudy(VIEW" in html and "Comparison of 2 runs, grouped by algorithm" in html
    out = tmp_path / "cmp.csv"
    args[-1] = str(out)
    assert invoke(lab_server, "compare", *ids, *args).exit_code == 0
    last = out.read_text().splitlines()[2].split(",")
    assert last[0] == "algorithm=trl-grpo" and float(last[-1]) == pytest.approx(0.75)
    bad = invoke(lab_server, "compare", ids[0], "999999", *args)
    assert bad.exit_code == 2 and "999999 not found" in bad.output


def test_watch_follows_a_run_to_its_end(lab_server, logged_run):
    result = invoke(lab_server, "watch", str(logged_run.id))
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output and "sep/gap" in result.output


def test_api_errors_become_messages_and_exit_codes(lab_server):
    result = invoke(lab_server, "watch", "999999")
    assert result.exit_code == 2 and "404" in result.output
    result = runner.invoke(app, ["runs", "--url", closed_port_url()])
    assert result.exit_code == 1 and "cannot reach" in result.output


def test_export_pages_through_raw_points_beyond_10000(lab_server, lab, tmp_path):
    run = lab.create_external_run("cli-long", {}, "trl-grpo", "arith", "tiny", [], 12_500)
    rows = [{"step": s, "metrics": {"loss": s / 1000}} for s in range(1, 12_501)]
    for row in rows[99::100]:
        row["metrics"]["eval/accuracy"] = row["step"] / 1e5  # sparse: every 100 steps
    lab.log_steps(run.id, rows, status="succeeded")
    out = tmp_path / "long.jsonl"
    result = invoke(
        lab_server,
        "export",
        str(run.id),
        "--format",
        "jsonl",
        "--layout",
        "long",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "bucketed" not in result.output and "warning" not in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    loss = [r["step"] for r in lines if r["key"] == "loss"]
    assert loss == list(range(1, 12_501))  # every raw point once, none a bucket mean
    value = {r["step"]: r["value"] for r in lines if r["key"] == "loss"}
    assert value[7777] == pytest.approx(7.777)
    evals = [r["step"] for r in lines if r["key"] == "eval/accuracy"]
    assert evals == list(range(100, 12_501, 100))
    # Small pages: sparse keys widen the step range, dense ones are never bucketed.
    pages = list(lab.iter_points(run.id, ["eval/accuracy"], page_points=10))
    steps = [s for p in pages for s in p["eval/accuracy"].steps]
    assert steps == evals and not any(p["eval/accuracy"].sampled for p in pages)
    assert len(pages) < 125 // 2


def test_cancel_cancels_a_queued_run_and_refuses_a_finished_one(lab_server, lab, logged_run):
    from conspo.config import RunConfig

    sub = lab.create_runs(RunConfig.model_validate({"algorithm": "grpo", "steps": 2}))
    queued = sub.runs[0]  # no worker serves this server: it stays queued
    result = invoke(lab_server, "cancel", str(queued.id))
    assert result.exit_code == 0, result.output
    assert "cancelled" in result.output and lab.get_run(queued.id).status == "cancelled"
    again = invoke(lab_server, "cancel", str(logged_run.id))
    assert again.exit_code == 1 and "already succeeded" in again.output


def test_piped_watch_prints_each_step_as_it_comes(lab_server, lab):
    """`watch | tee log`: a line per step reaches the pipe while the run is still going."""
    import queue
    import subprocess
    import sys
    import threading

    run = lab.create_external_run("cli-pipe", {}, "conspo", "arith", "tiny", [], 3)
    lab.log_steps(run.id, [{"step": 1, "metrics": {"sep/gap": 0.1, "eval/accuracy": 0.5}}])
    proc = subprocess.Popen(
        [sys.executable, "-m", "conspo_lab.cli", "watch", str(run.id),
         "--url", lab_server.url, "--token", lab_server.token],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()

    def next_line_with(text: str, timeout: float = 60.0) -> str:
        while True:
            line = lines.get(timeout=timeout)
            if text in line:
                return line

    try:
        # The stream's step 1, before the run ends: flushed, not buffered.
        first = next_line_with("eval/accuracy=0.5 @1")
        assert "step 1/3" in first and "sep/gap=0.1" in first
        assert first.startswith("[0:")  # the run's elapsed time, h:mm:ss
        lab.log_steps(run.id, [{"step": 2, "metrics": {"sep/gap": 0.2}}])
        second = next_line_with("step 2/3")
        assert "sep/gap=0.2" in second and "eval/accuracy=0.5 @1" in second  # eval keeps its step
        lab.log_steps(run.id, [{"step": 3, "metrics": {"sep/gap": 0.3}}], status="succeeded")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_export_of_a_run_without_points_exits_1(lab_server, lab):
    run = lab.create_external_run("cli-empty", {}, "conspo", "arith", "tiny", [], 3)
    result = invoke(lab_server, "export", str(run.id), "--out", "-")
    assert result.exit_code == 1 and "no metric points" in result.output


def test_submit_prints_each_runs_url(lab_server, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("algorithm: grpo\nsteps: 2\n")
    result = invoke(lab_server, "submit", str(good))
    assert result.exit_code == 0, result.output
    assert f"{lab_server.url}/runs/" in result.output


def test_runs_where_finds_runs_by_config_and_results(lab_server, lab):
    """--where: the ConSPO run with τ ≥ 5 whose held-out accuracy beat 0.2, and no other; a query
    that does not parse exits 2 naming the character where it stopped."""
    made = {}
    cases = (("where-good", 5, 0.3), ("where-low", 5, 0.1), ("where-t2", 2, 0.9))
    for name, tau, accuracy in cases:
        run = lab.create_external_run(name, {"algorithm": "conspo", "params": {"tau": tau}},
                                      "conspo", "arith", "tiny", ["cli-where"], 1)  # fmt: skip
        lab.log_steps(run.id, [{"step": 1, "metrics": {"eval/accuracy": accuracy}}])
        made[name] = run.id
    result = invoke(lab_server, "runs", "--tag", "cli-where", "--where",
                    "params.tau>=5 AND best(eval/accuracy)>0.2")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "where-good" in result.output
    assert "where-low" not in result.output and "where-t2" not in result.output
    bad = invoke(lab_server, "runs", "--where", "params.tau>=5 OR x=1")
    assert bad.exit_code != 0
    assert "where" in bad.output and "at character 15" in bad.output, bad.output


def test_yaml_files_read_exponents_as_numbers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The API takes a number only as a number: a study's search space written "low: 1e-6"
    (text to YAML 1.1, which PyYAML follows) must reach it as 1e-6."""
    spec = tmp_path / "study.yaml"
    spec.write_text("low: 1e-6\nhigh: -3E+2\ndotted: 1.0e-4\ntext: x1e5\nquoted: '1e-5'\n")
    read = cli_client._read_mapping(spec, "a mapping")
    assert read == {"low": 1e-6, "high": -300.0, "dotted": 1e-4, "text": "x1e5", "quoted": "1e-5"}


def test_runs_and_watch_say_what_a_running_run_is_doing(lab_server, lab):
    """Minutes of evaluation log no step: `runs` and `watch` say "running (evaluating)", as the
    run's page does, and a piped watch prints a line when the phase changes."""
    import sqlite3
    from contextlib import closing

    from conspo_lab.client import Run, StreamEvent

    run = lab.create_external_run("cli-phase", {}, "conspo", "arith", "tiny", ["cli-phase"], 3)
    # The phase is the worker's to write (its trainer's phase events); no worker serves this
    # server, so the test writes it where the worker would.
    with closing(sqlite3.connect(lab_server.data_dir / "conspo.db")) as db, db:
        db.execute("UPDATE runs SET phase = 'evaluating' WHERE id = ?", (run.id,))
    result = invoke(lab_server, "runs", "--tag", "cli-phase")
    assert result.exit_code == 0, result.output
    assert "running (evaluating)" in result.output

    # A worker's run between its claim and its first phase event is setting up.
    setting_up = Run(id=7, status="running", total_steps=3)
    view = cli_client._WatchView(setting_up)
    assert "run 7 · running (setting up)" in cli_client._describe(setting_up)
    evaluating = {**setting_up.model_dump(), "phase": "evaluating"}
    lines = view.apply(StreamEvent("status", evaluating))
    assert len(lines) == 1 and lines[0].endswith("run 7: running (evaluating)"), lines
    assert view.apply(StreamEvent("status", evaluating)) == []  # no change, no line
