"""The TRL bridge: key mapping, robustness, and real GRPOTrainer steps into a live server."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conspo import metrics as M
from conspo_lab.client import Client
from conspo_lab.trl_bridge import KEY_MAP, ConSPOLabCallback, groups_per_batch, map_logs
from tests.support import closed_port_url

ROOT = Path(__file__).resolve().parents[2]


def test_map_logs_keeps_originals_and_maps_known_keys():
    logs = {
        "loss": 0.5,
        "grad_norm": 1.5,
        "learning_rate": 1e-5,
        "reward": 0.25,
        "reward_std": 0.1,
        "completions/mean_length": 7.0,
        "entropy": 2.0,
        "kl": 0.01,
        "epoch": 0.5,
        "rewards/f/mean": None,  # TRL logs None when no reward was valid
        "note": "text",
    }
    out = map_logs(logs)
    assert out[M.LOSS] == 0.5 and out[M.GRAD_NORM] == 1.5 and out[M.LR] == 1e-5
    assert out[M.BATCH_PASS_RATE] == 0.25 and out["trl/completions/mean_length"] == 7.0
    assert out[M.ENTROPY] == 2.0 and out[M.KL] == 0.01
    assert set(KEY_MAP.values()) <= {m.key for m in M.METRICS}  # targets are catalogue keys
    assert out["trl/reward"] == 0.25 and out["trl/epoch"] == 0.5
    assert "trl/rewards/f/mean" not in out and "trl/note" not in out
    assert "batch/pass_rate" not in map_logs({"reward": 0.25}, binary_reward=False)
    assert "batch/pass_rate" not in map_logs({"reward": 3.0})  # not a 0/1 mean
    assert math.isnan(map_logs({"loss": math.nan})[M.LOSS])
    # ConSPOTrainer's statistics are catalogue keys already: kept as they are, once.
    assert map_logs({M.SEP_GAP: 0.1, "rewards/verify/mean": 0.5}) == {
        M.SEP_GAP: 0.1,
        M.reward_key("verify"): 0.5,
        "trl/rewards/verify/mean": 0.5,
    }


def test_map_logs_counts_mixed_groups_and_keeps_what_the_trainer_logged_itself():
    args = SimpleNamespace(generation_batch_size=16, num_generations=4, scale_rewards="group")
    groups = groups_per_batch(args)
    assert groups == 4
    out = map_logs({"reward": 0.5, "frac_reward_zero_std": 0.25}, groups=groups)
    assert out[M.BATCH_VALID_GROUPS] == 3.0 and out["trl/frac_reward_zero_std"] == 0.25
    assert M.BATCH_VALID_GROUPS not in map_logs({"frac_reward_zero_std": 0.25})  # groups unknown
    for other in (
        {"scale_rewards": "batch"},
        {"multi_objective_aggregation": "normalize_then_sum"},
    ):
        assert groups_per_batch(SimpleNamespace(**{**vars(args), **other})) is None  # not per group
    # ConSPOTrainer's own counts and pass rate win over what TRL's means would give, whatever
    # the order of the log dict.
    logged = {M.BATCH_VALID_GROUPS: 1.0, M.BATCH_PASS_RATE: 0.4}
    for logs in ({**logged, "reward": 0.5, "frac_reward_zero_std": 0.25},
                 {"reward": 0.5, "frac_reward_zero_std": 0.25, **logged}):  # fmt: skip
        out = map_logs(logs, groups=groups)
        assert (out[M.BATCH_VALID_GROUPS], out[M.BATCH_PASS_RATE]) == (1.0, 0.4)


def test_a_refused_log_for_a_closed_run_stops_the_trainer_and_is_said_once(lab, caplog):
    from transformers import TrainerControl

    cb = ConSPOLabCallback(lab, run_name="cb-deleted", flush_steps=1, retry_wait=0)
    args, control = SimpleNamespace(logging_steps=1), TrainerControl()
    cb.on_train_begin(args, fake_state(0, 9), control)
    cb.on_log(args, fake_state(1, 9), control, logs={"loss": 1.0})
    assert not control.should_training_stop
    lab.delete(cb.run_id)  # a 404 from now on
    with caplog.at_level(logging.WARNING, logger="conspo_lab.trl_bridge"):
        cb.on_log(args, fake_state(2, 9), control, logs={"loss": 0.5})
        assert control.should_training_stop and cb.stopped
        cb.on_log(args, fake_state(3, 9), control, logs={"loss": 0.25})  # TRL's last log
        cb.on_train_end(args, fake_state(3, 9), control)
    assert [r.getMessage() for r in caplog.records] == [
        f"ConSPO Lab: run {cb.run_id} no longer accepts points ({cb.stopped}): stopping training"
    ]


def fake_state(step: int, max_steps: int = 3):
    return SimpleNamespace(global_step=step, max_steps=max_steps, is_world_process_zero=True)


def test_only_the_main_process_logs_even_a_failure():
    cb = ConSPOLabCallback(Client(closed_port_url(), "t", timeout=1), retries=1)
    state = SimpleNamespace(global_step=0, max_steps=3, is_world_process_zero=False)
    cb.on_train_begin(SimpleNamespace(logging_steps=1), state, None)
    cb.on_rollouts(None, state, None, step=1, rollouts=[])
    cb.fail(RuntimeError("boom"))  # would try to create a run if this process logged
    assert cb.run_id is None and not cb._rollouts and not cb._finished


def test_a_dead_server_never_breaks_training():
    cb = ConSPOLabCallback(
        Client(closed_port_url(), "t", timeout=1), run_name="x", retries=2, retry_wait=0
    )
    args = SimpleNamespace(logging_steps=1)
    cb.on_train_begin(args, fake_state(0), None)
    for step in (1, 2, 3):
        cb.on_log(args, fake_state(step), None, logs={"loss": 1.0 / step})
    cb.on_train_end(args, fake_state(3), None)
    assert cb.run_id is None and sorted(cb._pending) == [1, 2, 3]  # kept, not lost


def test_callback_batches_steps_and_marks_success(lab_server, lab):
    cb = ConSPOLabCallback(lab, run_name="cb-unit", flush_steps=2, flush_seconds=1e9)
    args = SimpleNamespace(logging_steps=1)
    cb.on_train_begin(args, fake_state(0, 3), None)
    cb.on_log(args, fake_state(1, 3), None, logs={"loss": 1.0, "reward": 0.0})
    assert cb._pending  # buffered, not yet sent
    cb.on_log(args, fake_state(2, 3), None, logs={"loss": 0.5, "reward": 0.5})
    assert not cb._pending  # flushed at 2 steps
    cb.on_log(args, fake_state(3, 3), None, logs={"loss": 0.25, "reward": 1.0})
    cb.on_train_end(args, fake_state(3, 3), None)
    run = lab.get_run(cb.run_id)
    assert run.status == "succeeded" and run.external and run.total_steps == 3
    assert lab.metrics(run.id, ["batch/pass_rate"])["batch/pass_rate"].values == [0.0, 0.5, 1.0]


@pytest.mark.slow
def test_trl_grpo_example_logs_every_step_into_the_lab(lab_server, lab, tmp_path):
    """Three real GRPOTrainer steps on the tiny model, through examples/trl_grpo.py."""
    steps = 3
    env = {**lab_server.env, "CONSPO_URL": lab_server.url, "CONSPO_TOKEN": lab_server.token}
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    script = str(ROOT / "examples" / "trl_grpo.py")
    flags = f"--model tiny --model-store {tmp_path / 'models'} --steps {steps}"
    flags += " --prompts-per-step 2 --num-generations 4 --max-new-tokens 4 --name trl-test"
    cmd = [sys.executable, script, *flags.split(), "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "logged to run" in proc.stdout

    run = lab.list_runs(q="trl-test").items[0]
    assert run.status == "succeeded" and run.external and run.total_steps == steps
    keys = set(lab.metric_keys(run.id))
    mapped = [M.LOSS, M.GRAD_NORM, M.ENTROPY, M.LR, M.BATCH_PASS_RATE]
    assert set(mapped) <= keys and {"trl/reward", "trl/completions/mean_length"} <= keys
    series = lab.metrics(run.id, mapped)
    for key in mapped:
        assert series[key].steps == list(range(1, steps + 1)), key  # every step, not every 10
    assert os.path.isdir(tmp_path / "models" / "tiny")


CRASHING_TRAINER = """
from types import SimpleNamespace as NS
from conspo_lab.trl_bridge import ConSPOLabCallback
cb = ConSPOLabCallback(run_name="crashing", retry_wait=0)
args, state = NS(logging_steps=1), NS(global_step=0, max_steps=5, is_world_process_zero=True)
cb.on_train_begin(args, state, None)
state.global_step = 1
cb.on_log(args, state, None, logs={"loss": 1.0})
raise RuntimeError("CUDA out of memory")
"""


def test_a_crashed_training_marks_the_run_failed(lab_server, lab):
    env = {**lab_server.env, "CONSPO_URL": lab_server.url, "CONSPO_TOKEN": lab_server.token}
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_TRAINER], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "CUDA out of memory" in proc.stderr
    run = lab.list_runs(q="crashing").items[0]
    assert run.status == "failed" and "CUDA out of memory" in (run.error or "")
    assert lab.metrics(run.id, [M.LOSS])[M.LOSS].steps == [1]  # buffered points still sent
