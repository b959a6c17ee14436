"""A plain TRL GRPOTrainer logging into a live server through ConSPOLabCallback: cancelled on the
platform mid-run, it stops within a step, and says why once; what its rewards tell (pass rate,
mixed groups) lands under the catalogue's keys."""

from __future__ import annotations

import logging
import tempfile

import pytest

from conspo import metrics as M
from conspo_lab.client import Client
from conspo_lab.trl_bridge import ConSPOLabCallback

G = 4
PROMPTS = ["1+2=", "7-3=", "12+34=", "9-8="]  # one step's prompts (groups)
CANCEL_AT = 3  # the step whose rewards are being computed when the run is cancelled


def parity_reward(completions: list[str], **_: object) -> list[float]:
    """A deterministic 0/1 reward from the completion's characters: groups come out mixed."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


def tiny_grpo_trainer(steps: int, reward_funcs, callback: ConSPOLabCallback):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from conspo.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-cancel-test-"),
        per_device_train_batch_size=len(PROMPTS) * G,
        num_generations=G,
        max_completion_length=6,
        max_steps=steps,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        save_strategy="no",
        seed=0,
    )
    return GRPOTrainer(
        model=build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * steps]),
        processing_class=tokenizer,
        callbacks=[callback],
    )


@pytest.mark.slow
def test_cancelling_the_run_on_the_platform_stops_the_trainer(lab_server, lab, caplog):
    steps = 40
    cb = ConSPOLabCallback(lab, run_name="trl-cancelled", flush_steps=1, retry_wait=0)
    canceller = Client(lab_server.url, lab_server.token)
    calls = []

    def cancelling_reward(completions: list[str], **kw: object) -> list[float]:
        calls.append(1)  # one call per step (one generation batch per optimiser step)
        if len(calls) == CANCEL_AT:
            assert canceller.cancel(cb.run_id).status == "cancelled"  # what the Cancel button does
        return parity_reward(completions)

    trainer = tiny_grpo_trainer(steps, cancelling_reward, cb)
    with caplog.at_level(logging.WARNING, logger="conspo_lab.trl_bridge"):
        trainer.train()

    # Step CANCEL_AT's points are refused: the trainer ends right after it, not 37 steps later.
    assert trainer.state.global_step == CANCEL_AT
    said = [r.getMessage() for r in caplog.records]
    stopping = [m for m in said if "stopping training" in m]
    assert len(stopping) == 1 and f"run {cb.run_id} is cancelled" in stopping[0], said
    assert not [m for m in said if "rejected" in m or "could not mark" in m], said
    run = lab.get_run(cb.run_id)
    assert run.status == "cancelled"  # on_train_end did not mark it succeeded
    assert lab.metrics(run.id, [M.LOSS])[M.LOSS].steps == list(range(1, CANCEL_AT))
    canceller.close()


@pytest.mark.slow
def test_a_plain_grpo_trainer_logs_the_pass_rate_and_the_mixed_groups(lab_server, lab):
    """What TRL's reward statistics tell, under the keys a native run uses: the pass rate and
    the groups whose rollouts are not all right or all wrong (no per-rollout scores, so no
    separation statistics)."""
    steps = 3
    cb = ConSPOLabCallback(lab, run_name="trl-plain", flush_steps=1)
    rewards: list[list[float]] = []

    def recorded_reward(completions: list[str], **kw: object) -> list[float]:
        rewards.append(parity_reward(completions))
        return rewards[-1]

    tiny_grpo_trainer(steps, recorded_reward, cb).train()
    run = lab.get_run(cb.run_id)
    assert run.status == "succeeded"
    series = lab.metrics(run.id, [M.BATCH_PASS_RATE, M.BATCH_VALID_GROUPS])
    groups = [[step[i : i + G] for i in range(0, len(step), G)] for step in rewards]
    mixed = [float(sum(0 < sum(g) < G for g in step)) for step in groups]
    assert series[M.BATCH_VALID_GROUPS].steps == list(range(1, steps + 1))
    assert series[M.BATCH_VALID_GROUPS].values == mixed
    assert series[M.BATCH_PASS_RATE].values == pytest.approx(
        [sum(step) / len(step) for step in rewards]
    )
    assert M.SEP_GAP not in lab.metric_keys(run.id)  # no per-rollout scores: no separation
