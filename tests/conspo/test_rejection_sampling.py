"""Rejection-sampling fine-tuning (issue 51 item 4): rounds of sample → keep what the accept
reward passes (deduplicated, capped per prompt) → SFT on the pool; a round's answers survive a
resume; nothing to keep fails the run saying what to change. Real tiny models."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.jobs import train_job
from conspo.jobs.rejection_sampling import ROUNDS_DIR, RejectionSamplingParams, keep
from conspo.sink import MemorySink
from conspo.tasks import make_task


def test_keep_passes_the_threshold_once_per_distinct_answer_and_caps_each_prompt() -> None:
    params = RejectionSamplingParams(max_per_prompt=2, threshold=0.5)
    prompts = ["a", "a", "a", "a", "a", "b", "b"]
    answers = ["1", " 1 ", "2", "3", "4", "9", "8"]
    values = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5]
    # a: "1" kept, " 1 " the same trimmed, "2" failed, "3" kept, "4" over the cap of 2;
    # b: "9" kept, "8" not above the threshold
    assert keep(prompts, answers, values, params) == [("a", "1"), ("a", "3"), ("b", "9")]


def config(steps: int, **kind_params) -> RunConfig:
    return RunConfig.model_validate({
        "kind": "rejection_sampling",
        "kind_params": {"round_steps": 1, "batch_size": 4, **kind_params},
        "steps": steps,
        "seed": 2,
        "model": {"name": "tiny-arith"},
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 4},
        "sampling": {"prompts_per_step": 6, "group_size": 4, "max_new_tokens": 6},
        "eval": {"every": 0, "pass_k": 1},
        "checkpoint": {"every": 1, "keep": 2},
    })  # fmt: skip


def rounds(workdir) -> list[list[dict]]:
    files = sorted((workdir / ROUNDS_DIR).glob("round_*.jsonl"))
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


def test_rounds_keep_verified_answers_and_a_resume_reads_them_back(model_store, tmp_path):
    workdir = tmp_path / "rft"
    first = MemorySink()
    result = train_job(config(1), first, workdir=workdir, model_store=model_store)
    assert result.status == "succeeded"
    (kept,) = rounds(workdir)
    assert kept, "tiny-arith answers some one-digit sums right"
    task = make_task(config(1).task)
    assert all(task.verify(row["answer"], task_example(task, row["prompt"])) for row in kept)
    drawn = first.steps[1].metrics
    assert drawn[M.RFT_KEPT] == len(kept) == drawn[M.RFT_POOL]
    assert 0 < drawn[M.RFT_ACCEPTED] <= 1
    before = (workdir / ROUNDS_DIR / "round_000.jsonl").stat().st_mtime_ns

    # Two more steps in the same workdir: it resumes at step 2; round 0 is read, not redrawn.
    second = MemorySink()
    train_job(config(3), second, workdir=workdir, model_store=model_store)
    assert (workdir / ROUNDS_DIR / "round_000.jsonl").stat().st_mtime_ns == before
    assert sorted(s for s in second.steps if s > 0) == [2, 3]
    pools = [second.steps[s].metrics[M.RFT_POOL] for s in (2, 3)]
    sizes = [len(r) for r in rounds(workdir)]
    assert len(sizes) == 3 and pools == [sum(sizes[:2]), sum(sizes)]  # every round so far


def task_example(task, prompt: str):
    """The held-in example a rendered prompt came from (the arith task's prompts are unique)."""
    import random

    for ex in task.train_prompts(random.Random(0), 500):
        if ex.prompt == prompt or prompt.endswith(ex.prompt):
            return ex
    raise AssertionError(f"no example renders as {prompt!r}")


def test_a_round_that_keeps_nothing_fails_the_run_saying_what_to_change(model_store, tmp_path):
    with pytest.raises(ValueError, match=r"no sampled answer passed kind_params.accept"):
        train_job(config(1, threshold=2.0), MemorySink(), workdir=tmp_path, model_store=model_store)


def test_the_accept_reward_must_be_one_the_run_scores() -> None:
    with pytest.raises(ValidationError) as caught:
        config(1, accept="judge")
    (error,) = caught.value.errors()
    assert error["loc"] == ("kind_params", "accept")
