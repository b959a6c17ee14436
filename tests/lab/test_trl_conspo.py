"""ConSPOTrainer runs logging into a live server: the separation statistics and rollout samples
of every step land under the native keys, with one process and with two (accelerate, gloo), where
they are those of the whole batch (both processes' groups), not of the main process's half."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conspo import metrics as M

ROOT = Path(__file__).resolve().parents[1].parent
RUN = str(ROOT / "tests" / "lab" / "trl_conspo_run.py")
STEPS = 3
GROUPS, G = 4, 4  # trl_conspo_run.py: four prompts of four rollouts per step


def run_script(lab_server, name: str, launcher: list[str]) -> None:
    env = {**lab_server.env, "CONSPO_URL": lab_server.url, "CONSPO_TOKEN": lab_server.token}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*launcher, RUN, name, str(STEPS)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("logged to run") == 1  # only the main process logs


def assert_whole_batch_logged(lab, name: str) -> None:
    run = lab.list_runs(q=name).items[0]
    assert run.status == "succeeded" and run.external and run.algorithm == "conspo"
    keys = set(lab.metric_keys(run.id))
    wanted = [*M.SEPARATION_KEYS, M.LOSS, M.ENTROPY, M.OFFPOLICY_RATIO_MEAN, "trl/reward"]
    assert set(wanted) <= keys and M.reward_key("parity_reward") in keys
    series = lab.metrics(run.id, wanted)
    steps = list(range(1, STEPS + 1))
    for key in (M.SEP_GAP, M.BATCH_PASS_RATE, M.BATCH_VALID_GROUPS, M.CONSPO_MARGIN):
        assert series[key].steps == steps, key  # every step, none twice
    counts = zip(
        series[M.BATCH_VALID_GROUPS].values,
        series[M.BATCH_ALL_POS_GROUPS].values,
        series[M.BATCH_ALL_NEG_GROUPS].values,
        strict=True,
    )
    assert all(sum(c) == GROUPS for c in counts)  # every group of the step, on any process
    # TRL's own mean reward is gathered over processes: the pass rate must be that whole mean.
    assert series[M.BATCH_PASS_RATE].values == pytest.approx(series["trl/reward"].values)
    assert series[M.CONSPO_MARGIN].values == pytest.approx([0.01] * STEPS)  # fixed, M = 0.01
    assert any(v is not None and v > 0 for v in series[M.BATCH_VALID_GROUPS].values)

    rows = lab.rollouts(run.id)
    assert sorted({r.step for r in rows}) == steps
    for step, pass_rate in zip(steps, series[M.BATCH_PASS_RATE].values, strict=True):
        mine = [r for r in rows if r.step == step]
        assert len(mine) == GROUPS * G  # the whole batch (under the 64-rollout sample bound)
        assert {(r.group, r.index) for r in mine} == {
            (g, i) for g in range(GROUPS) for i in range(G)
        }
        assert sum(r.reward for r in mine) / len(mine) == pytest.approx(pass_rate)
        assert all(r.score is not None and r.score < 0 and 1 <= r.length <= 6 for r in mine)


@pytest.mark.slow
def test_conspo_trainer_logs_separation_statistics_into_the_lab(lab_server, lab):
    run_script(lab_server, "trl-conspo-1p", [sys.executable])
    assert_whole_batch_logged(lab, "trl-conspo-1p")


@pytest.mark.slow
def test_two_processes_log_the_statistics_of_the_whole_batch(lab_server, lab):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    run_script(lab_server, "trl-conspo-2p", launch)
    assert_whole_batch_logged(lab, "trl-conspo-2p")
