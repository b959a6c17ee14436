"""`conspo-lab study run / show / report / cancel` against a real server (no worker: the runs
stay queued, which is all the commands need)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from conspo_lab.cli import app

runner = CliRunner()

STUDY = """\
name: cli-study
config: {model: {name: tiny}, steps: 2, task: {eval_size: 4}}
arms:
  - {name: grpo, overrides: {algorithm: grpo}}
  - {name: conspo, overrides: {params.tau: 1.0}}
seeds: [0, 1]
baseline: grpo
concurrency: 1
"""


def invoke(server, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [*args, "--url", server.url, "--token", server.token])


def test_study_file_to_verdict_report_and_cancel(lab_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    result = invoke(lab_server, "study", "run", str(path))
    assert result.exit_code == 0, result.output
    assert "4 runs planned, 1 queued" in result.output
    study_id = result.output.split("study ", 1)[1].split(" ", 1)[0]
    shown = invoke(lab_server, "study", "show", study_id)
    assert shown.exit_code == 0, shown.output
    assert "no seed finished by both arms yet" in shown.output and "0 of 2" in shown.output
    out = tmp_path / "r.html"
    assert invoke(lab_server, "study", "report", study_id, "-o", str(out)).exit_code == 0
    assert "renderStudy(VIEW" in out.read_text()
    assert invoke(lab_server, "study", "report", study_id, "--csv", "-o", str(out)).exit_code == 0
    assert out.read_text().startswith("study,arm,seed,run_id,status,objective\n")
    cancelled = invoke(lab_server, "study", "cancel", study_id)
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output

    path.write_text(STUDY.replace("baseline: grpo", "baseline: ppo"))
    bad = invoke(lab_server, "study", "run", str(path))
    text = " ".join(bad.output.split())  # rich wraps long lines
    assert bad.exit_code == 2 and "baseline: " in text and "is not an arm" in text
    path.write_text("- not a mapping")
    assert invoke(lab_server, "study", "run", str(path)).exit_code == 2


def test_study_check_plans_and_a_single_seed_is_refused_before_any_run(
    lab_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Issue 49: a one-seed study passed the check and said "too few seeds" only after its
    compute was spent; `study check` and `study run` now refuse it, naming `seeds`."""
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    checked = invoke(lab_server, "study", "check", str(path))
    assert checked.exit_code == 0, checked.output
    assert "ok: 4 runs (2 arms × 2 seeds), baseline grpo" in checked.output
    path.write_text(STUDY.replace("seeds: [0, 1]", "seeds: [0]"))
    with lab_server.client() as lab:
        before = lab.list_studies()["total"]
        for command in ("check", "run"):
            refused = invoke(lab_server, "study", command, str(path))
            text = " ".join(refused.output.split())  # rich wraps long lines
            assert refused.exit_code == 2, refused.output
            assert "seeds: an arm study needs at least 2 seeds" in text, text
        assert lab.list_studies()["total"] == before


TUNED = """\
name: cli-tuned
config: {model: {name: tiny}, steps: 2, task: {eval_size: 4}}
arms:
  - name: grpo
    overrides: {algorithm: grpo}
    tune: {space: {optim.lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}}, trials: 2}
  - {name: conspo, overrides: {algorithm: conspo}}
tuning_seeds: [100]
seeds: [0, 1]
baseline: grpo
concurrency: 1
"""


def test_a_tuned_study_checks_its_budget_and_shows_its_search(lab_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`study check` prints the budget of both phases; `study show` each tuned arm's search
    while it tunes (no worker here: the first trial's run stays queued)."""
    path = tmp_path / "tuned.yaml"
    path.write_text(TUNED)
    checked = invoke(lab_server, "study", "check", str(path))
    text = " ".join(checked.output.split())
    assert checked.exit_code == 0, checked.output
    assert "ok: 6 runs (2 arms × 2 seeds + 2 tuning runs)" in text
    assert "budget: 6 runs (2 tuning + 4 final), ≤ 24,576 generated tokens" in text, text
    created = invoke(lab_server, "study", "run", str(path))
    assert created.exit_code == 0, created.output
    study_id = created.output.split("study ", 1)[1].split(" ", 1)[0]
    shown = invoke(lab_server, "study", "show", study_id)
    assert shown.exit_code == 0 and "grpo: tuning, 1 trials asked" in shown.output, shown.output
    assert invoke(lab_server, "study", "cancel", study_id).exit_code == 0
