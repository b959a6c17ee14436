"""Paper-style evaluation (conspo.evaluation): avg@k / pass@k on benchmarks, the step-0
evaluation, the best checkpoint, and a short run of tiny-chat-math on the math fixtures."""

import json
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.evaluation import Benchmark, score_benchmark
from conspo.models.loading import load_pretrained
from conspo.sink import MemorySink
from conspo.tasks import Example
from conspo.training.trainer import train

FIXTURES = Path(__file__).parents[2] / "examples" / "data" / "math"


class FirstCCorrect:
    """Problem i's first c_i samples are correct (generate_and_verify verifies in order)."""

    def __init__(self, correct_per_problem: dict[str, int]) -> None:
        self.left = dict(correct_per_problem)

    def verify(self, completion: str, example: Example) -> float:
        hit = self.left[example.prompt] > 0
        self.left[example.prompt] -= 1
        return float(hit)


def test_avg_at_k_and_pass_at_k_on_a_controlled_case(policy):
    model, tok = policy
    counts = {"1+1=": 0, "2+2=": 1, "3+3=": 2, "4+4=": 4}
    bench = Benchmark("ctl", 4, [Example(p, "") for p in counts])
    out = score_benchmark(model, tok, bench, max_new_tokens=2, temperature=1.0, top_p=0.95,
                          generator=torch.Generator().manual_seed(0),
                          verifier=FirstCCorrect(counts))  # fmt: skip
    assert out["eval/ctl/avg@4"] == pytest.approx(7 / 16)
    assert out["eval/ctl/pass@4"] == pytest.approx(3 / 4)  # pass@k with n = k: any correct


def arith_run(**overrides) -> RunConfig:
    data = {
        "steps": 3,
        "task": {"name": "arith", "params": {"digits": 1}, "eval_size": 16},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "eval": {
            "every": 1,
            "pass_k": 2,
            "best_metric": M.EVAL_ACCURACY,
            "benchmarks": [
                {"name": "bench", "path": str(FIXTURES / "benchmark.jsonl"), "k": 2, "limit": 3}
            ],  # fmt: skip
        },
        "checkpoint": {"every": 1, "keep": 1},
    }
    data.update(overrides)
    return RunConfig.model_validate(data)


def test_step_zero_eval_best_checkpoint_and_no_repeat_on_resume(model_store, arith_base,
                                                                tmp_path):  # fmt: skip
    sink = MemorySink()
    train(arith_run(steps=2), sink, workdir=tmp_path, model_store=model_store)
    assert sorted(sink.steps) == [0, 1, 2]
    eval_keys = {
        M.EVAL_ACCURACY,
        M.EVAL_PASS_AT_K,
        M.EVAL_PROBLEMS,
        M.TIME_EVAL_S,
        "eval/bench/avg@2",
        "eval/bench/pass@2",
    }
    assert set(sink.steps[0].metrics) == eval_keys and sink.steps[0].rollouts == []
    accuracy = {s: r.metrics[M.EVAL_ACCURACY] for s, r in sink.steps.items()}
    best_step = max(accuracy, key=lambda s: (accuracy[s], -s))  # the first of equal bests
    best = json.loads((tmp_path / "checkpoints" / "best" / "best.json").read_text())
    assert best == {"step": best_step, "metric": M.EVAL_ACCURACY, "value": accuracy[best_step]}
    bests = [data for kind, data in sink.events if kind == "best"]
    assert bests[0]["step"] == 0 and bests[-1]["step"] == best_step
    load_pretrained(tmp_path / "checkpoints" / "best", torch.device("cpu"), torch.float32)

    resumed = MemorySink()
    train(arith_run(steps=3), resumed, workdir=tmp_path, model_store=model_store)
    assert sorted(resumed.steps) == [3]  # no second step-0 evaluation
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "step_000003"]


def test_a_best_metric_no_evaluation_logs_is_refused_by_the_config():
    with pytest.raises(ValidationError, match="eval.best_metric 'eval/bench/avg@16' is not"):
        arith_run(eval={"best_metric": "eval/bench/avg@16"})  # no such benchmark
    benchmark = {"name": "bench", "path": "b.jsonl", "k": 2}
    with pytest.raises(ValidationError, match="use one of .*eval/bench/avg@2"):
        arith_run(eval={"benchmarks": [benchmark], "best_metric": "eval/bench/avg@4"})
    arith_run(eval={"benchmarks": [benchmark], "best_metric": "eval/bench/pass@2"})
    arith_run(eval={"best_metric": "eval/pass@k"})


def test_benchmark_keys_are_described_by_a_catalogue_pattern():
    for key in M.benchmark_keys("math500", 16):
        entry = M.pattern(key)
        assert entry is not None and entry.better == "higher" and entry.help
    assert M.pattern("eval/accuracy") is None
    assert [p.pattern for p in M.catalogue().patterns if not p.pattern.startswith("system/")] == [
        "eval/<benchmark>/avg@<k>",
        "eval/<benchmark>/pass@<k>",
        "reward/<name>",
    ]


def test_tiny_chat_math_trains_on_the_math_fixtures_with_a_benchmark(model_store, tmp_path):
    cfg = RunConfig.model_validate({
        "steps": 2,
        "task": {"name": "math", "params": {"path": str(FIXTURES / "easy.jsonl")},
                 "eval_size": 8},
        "model": {"name": "tiny-chat-math"},
        "prompt": {"template": "boxed", "chat_template": "on"},
        "sampling": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 8},
        "eval": {"every": 0, "at_start": False, "pass_k": 2, "temperature": 0.6, "top_p": 0.95,
                 "benchmarks": [{"name": "easy", "path": str(FIXTURES / "easy.jsonl"), "k": 4,
                                 "limit": 8}]},
    })  # fmt: skip
    sink = MemorySink()
    assert train(cfg, sink, workdir=tmp_path, model_store=model_store).status == "succeeded"
    last = sink.steps[2].metrics
    assert 0 < last["eval/easy/avg@4"] <= last["eval/easy/pass@4"] <= 1
    valid = sum(r.metrics[M.BATCH_VALID_GROUPS] for r in sink.steps.values())
    assert valid > 0  # some groups mixed: the warm start is right part of the time
    assert math.isfinite(last[M.SEP_GAP])  # separation statistics over the mixed groups


class Faulty:
    """A user's verifier that raises on one problem and returns no number on another."""

    name = "faulty"

    def verify(self, completion: str, example: Example) -> float:
        if example.prompt == "1+2=":
            raise KeyError("no such answer")
        if example.prompt == "9=":
            return None  # type: ignore[return-value]
        return 1.0


def test_a_verifier_that_fails_on_a_held_out_answer_scores_it_zero(policy, caplog) -> None:
    from conspo.evaluation import generate_and_verify

    model, tok = policy
    examples = [Example(p, "", {}) for p in ("1+2=", "7-3+5=", "9=", "12+34=")]
    _, rewards = generate_and_verify(
        model, tok, Faulty(), examples, max_new_tokens=4, temperature=0.0
    )
    assert rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert "verify failed on 2 of 4 held-out answers" in caplog.text
    assert "KeyError" in caplog.text
