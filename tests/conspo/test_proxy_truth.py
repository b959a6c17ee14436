"""The proxy-vs-truth view (issue 51 item 5): each step of a run whose shaped reward is not its
truth logs the proxy (what the objective trains on) against the truth, their gap, how the proxy
orders each prompt's right and wrong answers, and Spearman's ρ over the step."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError
from scipy import stats as scipy_stats

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.sink import MemorySink
from conspo.training.stats import best_of_n, proxy_stats, spearman
from conspo.training.trainer import train


def test_pair_agreement_counts_each_groups_pairs_of_differing_truth() -> None:
    # group 0: right answers 0 and 1, wrong 2; the proxy puts 0 above 2 (agrees), 1 level
    # with 2 (a tie: half). group 1: right 3, wrong 4, ranked the wrong way round. group 2:
    # all wrong: no pair. Pairs: (0,2) 1, (1,2) 0.5, (3,4) 0 → 1.5 / 3.
    proxy = [0.9, 0.2, 0.2, -1.0, 3.0, 5.0, 4.0]
    truth = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    groups = [0, 0, 0, 1, 1, 2, 2]
    got = proxy_stats(proxy, truth, groups)
    assert got[M.PROXY_AGREEMENT] == pytest.approx(0.5)
    assert got[M.PROXY_REWARD] == pytest.approx(sum(proxy) / 7)
    assert got[M.PROXY_TRUTH] == pytest.approx(3 / 7)
    assert got[M.PROXY_GAP] == pytest.approx(sum(proxy) / 7 - 3 / 7)
    assert got[M.PROXY_SPEARMAN] == pytest.approx(scipy_stats.spearmanr(proxy, truth)[0])


def test_spearman_matches_scipy_with_ties_and_is_nan_when_a_side_is_constant() -> None:
    rng = random.Random(4)
    for _ in range(50):
        n = rng.randrange(3, 30)
        xs = [float(rng.randrange(5)) for _ in range(n)]  # many ties
        ys = [rng.random() if rng.random() < 0.5 else float(rng.randrange(2)) for _ in range(n)]
        expected = scipy_stats.spearmanr(xs, ys)[0]
        got = spearman(xs, ys)
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)
    assert math.isnan(spearman([1.0, 1.0, 1.0], [0.0, 1.0, 0.0]))
    assert math.isnan(proxy_stats([1.0, 2.0], [1.0, 1.0], [0, 0])[M.PROXY_AGREEMENT])


def base(**overrides) -> dict:
    return {
        "algorithm": "grpo",
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 4},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 6},
        **overrides,
    }


def test_the_truth_must_be_one_of_the_runs_rewards() -> None:
    with pytest.raises(ValidationError) as caught:
        RunConfig.model_validate(base(truth="judge"))
    (error,) = caught.value.errors()
    assert error["loc"] == ("truth",) and "not one of the run's rewards" in error["msg"]
    assert RunConfig.model_validate(base()).proxy_rewards() == []
    shaped = base(rewards=[{"name": "verifier", "weight": 0}, {"name": "format", "weight": 2}])
    assert RunConfig.model_validate(shaped).proxy_rewards() == ["format"]
    # the format reward as the truth: the verifier, with its default weight 1, is the proxy
    named = base(rewards=[{"name": "format", "weight": 0}], truth="format")
    assert RunConfig.model_validate(named).proxy_rewards() == ["verifier"]


def test_a_run_trained_on_a_proxy_logs_it_against_the_truth(model_store, tmp_path) -> None:
    rewards = [{"name": "verifier", "weight": 0.5}, {"name": "format", "weight": 1}]
    cfg = RunConfig.model_validate(base(steps=2, rewards=rewards, eval={"every": 2, "pass_k": 3}))
    sink = MemorySink()
    train(cfg, sink, workdir=tmp_path / "proxy", model_store=model_store)
    trained = [r for step, r in sink.steps.items() if step > 0]  # step 0: the evaluation alone
    assert len(trained) == 2
    for record in trained:
        got = record.metrics
        truth = got[M.reward_key("verifier")]
        assert got[M.PROXY_TRUTH] == pytest.approx(truth)
        shaped = 0.5 * truth + got[M.reward_key("format")]
        assert got[M.PROXY_REWARD] == pytest.approx(shaped, abs=1e-6)
        assert got[M.PROXY_GAP] == pytest.approx(shaped - truth, abs=1e-6)
        assert M.PROXY_SPEARMAN in got and M.PROXY_AGREEMENT in got
    # The held-out pass@k samples (3 per problem, 4 problems) at the evaluation of step 2.
    held_out = sink.steps[2].metrics
    truth, proxy = held_out[M.EVAL_PROXY_TRUTH], held_out[M.EVAL_PROXY_REWARD]
    assert 0 <= truth <= 1 and (truth * 12).is_integer()
    assert 0 <= proxy - 0.5 * truth <= 1  # the format reward's mean, 0 or 1 per sample
    assert M.EVAL_PROXY_AGREEMENT in held_out and M.EVAL_PROXY_SPEARMAN in held_out

    plain = RunConfig.model_validate(base(steps=1, eval={"every": 0}))
    sink = MemorySink()
    train(plain, sink, workdir=tmp_path / "plain", model_store=model_store)
    assert not any(k.startswith("proxy/") for r in sink.steps.values() for k in r.metrics)


def test_best_of_n_picks_each_problems_top_scored_sample() -> None:
    # problem 0: the top score (0.9) is a right answer; problem 1: the top (two tied at 0.7,
    # the first wins) is wrong, though a right one is there
    scores = [0.1, 0.9, 0.3, 0.7, 0.7, 0.2]
    outcomes = [0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    got = best_of_n(scores, outcomes, 3)
    assert got == {M.EVAL_BEST_OF_N: 0.5, M.EVAL_SAMPLE_ACCURACY: 0.5}


def test_best_of_names_a_scored_reward_and_needs_several_samples() -> None:
    cases = [
        (base(eval={"best_of": "judge"}), "not one of the run's rewards"),
        (base(eval={"best_of": "verifier", "pass_k": 1}), "pass_k ≥ 2"),
    ]
    for bad, message in cases:
        with pytest.raises(ValidationError) as caught:
            RunConfig.model_validate(bad)
        (error,) = caught.value.errors()
        assert error["loc"] == ("eval", "best_of") and message in error["msg"]


def test_best_of_n_by_the_verifier_itself_is_pass_at_k(model_store, tmp_path) -> None:
    """The verifier as the picker finds a right sample wherever one exists: best-of-N is then
    exactly pass@k of the same samples, and at least one sample's accuracy."""
    evaluation = {"every": 1, "pass_k": 4, "best_of": "verifier"}
    cfg = RunConfig.model_validate(base(steps=1, eval=evaluation))
    sink = MemorySink()
    train(cfg, sink, workdir=tmp_path, model_store=model_store)
    for got in (record.metrics for record in sink.steps.values()):
        assert got[M.EVAL_BEST_OF_N] == pytest.approx(got[M.EVAL_PASS_AT_K])
        assert got[M.EVAL_SAMPLE_ACCURACY] <= got[M.EVAL_BEST_OF_N]
        assert not any(k.startswith("proxy/") for k in got)  # no proxy: it trains on the truth
