"""Each evaluation keeps its problems (``AnswerRecord``): the held-out split's greedy answer,
whether it was right, its s_θ and the pass@k draws, and each benchmark's, with the step that
logged them; the same numbers as the evaluation's metrics."""

from __future__ import annotations

import math

import pytest

from conspo.config import RunConfig
from conspo.jobs import train_job
from conspo.sink import HELD_OUT, MemorySink, prompt_key


@pytest.fixture(scope="module")
def evaluated_run(model_store, tmp_path_factory) -> MemorySink:
    config = RunConfig.model_validate({
        "algorithm": "conspo", "steps": 2, "model": {"name": "tiny-arith"},
        "task": {"name": "arith", "eval_size": 6},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "eval": {"every": 2, "pass_k": 3, "at_start": True}, "checkpoint": {"every": 0},
    })  # fmt: skip
    sink = MemorySink()
    result = train_job(
        config, sink, workdir=tmp_path_factory.mktemp("answers"), model_store=model_store
    )
    assert result.status == "succeeded"
    return sink


def test_every_evaluation_logs_its_problems_with_its_step(evaluated_run: MemorySink) -> None:
    steps = evaluated_run.steps
    assert [s for s, r in sorted(steps.items()) if r.answers] == [0, 2]
    assert not steps[1].answers  # a step without an evaluation has none
    for step in (0, 2):
        record = steps[step]
        answers = record.answers
        assert [a.position for a in answers] == list(range(6))
        assert {a.source for a in answers} == {HELD_OUT}
        # the numbers the evaluation's metrics were made of
        accuracy = sum(a.solved for a in answers) / len(answers)
        assert accuracy == pytest.approx(record.metrics["eval/accuracy"])
        pass_k = sum(a.samples_correct > 0 for a in answers) / len(answers)
        assert pass_k == pytest.approx(record.metrics["eval/pass@k"])
        for a in answers:
            assert a.key == prompt_key(a.prompt) and a.samples == 3
            assert 0 <= a.samples_correct <= 3 and a.reference
            assert a.score is not None and math.isfinite(a.score) and a.score <= 0
    # the same problems, in the same order, at every evaluation
    assert [a.key for a in steps[0].answers] == [a.key for a in steps[2].answers]
