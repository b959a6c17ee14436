import math
from itertools import combinations

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig, TaskConfig
from conspo.evaluation import evaluate, pass_at_k
from conspo.generation.batch import STOP_CHECK_COLUMNS, GenerationStopped
from conspo.generation.rollout import _next_token, finish_responses, sample
from conspo.sink import MemorySink
from conspo.tasks import make_task
from conspo.training.logprobs import token_logprobs
from conspo.training.trainer import train

EOS, PAD = 1, 0


def test_finish_masks_include_eos_and_zero_the_padding():
    response = torch.tensor([[5, 6, EOS, 7, 8], [5, EOS, EOS, 9, 9], [5, 6, 7, 8, 9]])
    prompt_ids, prompt_mask = torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2)
    out = finish_responses(prompt_ids, prompt_mask, response, EOS, PAD)
    assert out.response_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert out.lengths.tolist() == [3, 2, 5]
    assert out.truncated.tolist() == [False, False, True]
    assert out.response_ids.tolist() == [[5, 6, EOS, PAD, PAD], [5, EOS, PAD, PAD, PAD],
                                         [5, 6, 7, 8, 9]]  # fmt: skip


def test_sampled_rollouts_end_at_eos_or_are_truncated(policy, prompts):
    model, tok = policy
    ids, mask = prompts
    gen = torch.Generator().manual_seed(0)
    out = sample(model, ids, mask, max_new_tokens=8, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=gen)  # fmt: skip
    for row, n, cut, m in zip(out.response_ids, out.lengths, out.truncated, out.response_mask,
                              strict=True):  # fmt: skip
        assert m[:n].eq(1).all() and m[n:].eq(0).all()
        assert row[n:].eq(tok.pad_token_id).all()
        assert bool(cut) == (row[n - 1] != tok.eos_token_id)
    short = sample(model, ids, mask, max_new_tokens=1, eos_id=tok.eos_token_id,
                   pad_id=tok.pad_token_id, temperature=0)  # fmt: skip
    # Every answer needs a digit before EOS: one token is always truncated.
    assert short.truncated.all() and short.lengths.eq(1).all()


def test_greedy_sampling_matches_generate(policy, prompts):
    model, tok = policy
    ids, mask = prompts
    ours = sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                  pad_id=tok.pad_token_id, temperature=0)  # fmt: skip
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    ref = ref[:, ids.shape[1] :]
    width = ours.response_ids.shape[1]
    assert torch.equal(ours.response_ids, ref[:, :width].masked_fill(ours.response_mask == 0, PAD))


def test_sampling_is_reproducible_and_tiny_top_p_is_greedy(policy, prompts):
    model, tok = policy
    ids, mask = prompts
    kw = dict(max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    a = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    b = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(a.response_ids, b.response_ids)
    nucleus = sample(model, ids, mask, top_p=1e-6, generator=torch.Generator().manual_seed(1), **kw)
    greedy = sample(model, ids, mask, temperature=0, **kw)
    assert torch.equal(nucleus.response_ids, greedy.response_ids)


def test_sampled_token_frequencies_follow_the_distribution():
    # Inverse-CDF sampling must draw each id with its probability and never an id of mass 0
    # (the top-p mask zeroes the tail): a chi-square test at 40,000 draws per row.
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.2, 0.7], [0.5, 0.0, 0.0, 0.0, 0.5]])
    n = 40_000
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([_next_token(probs.log(), 1.0, 1.0, gen) for _ in range(n)])  # (n, 2)
    for row in range(2):
        counts = torch.bincount(draws[:, row], minlength=5).double()
        expected = probs[row].double() * n
        assert counts[expected == 0].sum() == 0
        chi2 = ((counts - expected)[expected > 0] ** 2 / expected[expected > 0]).sum()
        assert chi2 < 16.3, (row, counts.tolist())  # p = 0.001 at up to 3 degrees of freedom


def test_pass_at_k_is_the_unbiased_estimator():
    def brute(n, c, k):
        outcomes = [1] * c + [0] * (n - c)
        subsets = list(combinations(outcomes, k))
        return sum(any(s) for s in subsets) / len(subsets)

    for n, c, k in [(4, 0, 2), (4, 1, 2), (8, 3, 4), (5, 5, 3), (6, 2, 1)]:
        assert math.isclose(pass_at_k(n, c, k), brute(n, c, k))


def test_evaluate_reports_accuracy_and_pass_at_k(policy):
    model, tok = policy
    task = make_task(TaskConfig(name="arith", params={"digits": 1, "num_operands": 2}))
    examples = task.eval_examples(16)
    out = evaluate(model, tok, task, examples, max_new_tokens=4, pass_k=2, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert set(out) == {M.EVAL_ACCURACY, M.EVAL_PASS_AT_K, M.EVAL_PROBLEMS}
    assert 0 < out["eval/accuracy"] <= 1  # the SFT base gets some right
    assert 0 <= out["eval/pass@k"] <= 1


def test_shared_prefill_samples_what_per_row_prefill_samples(policy, prompts):
    model, tok = policy
    g = 4
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    kw = dict(max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    for temperature in (0, 1.0):
        per_row = sample(model, ids, mask, temperature=temperature,
                         generator=torch.Generator().manual_seed(11), **kw)  # fmt: skip
        shared = sample(model, ids, mask, temperature=temperature, group_size=g,
                        generator=torch.Generator().manual_seed(11), **kw)  # fmt: skip
        assert torch.equal(shared.response_ids, per_row.response_ids)
        assert torch.equal(shared.response_mask, per_row.response_mask)


def test_static_cache_and_sparse_stop_checks_sample_the_same_tokens(policy, prompts):
    """The levers of issue 15 change how the sampler runs, not what it draws (float32, one
    seed): a preallocated cache, and asking "all finished?" every 4 tokens (rows that finished
    decode padding meanwhile, which the result masks)."""
    model, tok = policy
    g = 4
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    kw = dict(max_new_tokens=9, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, group_size=g)
    base = sample(model, ids, mask, generator=torch.Generator().manual_seed(5), **kw)
    for lever in ({"static_cache": True}, {"stop_check_every": 4}):
        out = sample(model, ids, mask, generator=torch.Generator().manual_seed(5), **kw, **lever)
        width = base.response_ids.shape[1]
        assert torch.equal(out.response_ids[:, :width], base.response_ids)
        assert out.response_mask[:, width:].eq(0).all()  # any extra columns are padding
        assert torch.equal(out.lengths, base.lengths) and torch.equal(out.truncated, base.truncated)


def test_bf16_autocast_log_probs_stay_near_float32(policy, prompts):
    """bfloat16 autocast over float32 weights (model.dtype bfloat16 + mixed_precision): the
    sampled tokens' log-probs within 0.05 nats of float32 (bench/levers.py measures ~0.014 max
    on the 9.5M-parameter model)."""
    model, tok = policy
    g = 2
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    batch = sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                   pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(2))  # fmt: skip
    with torch.no_grad():
        fp32, _ = token_logprobs(model, batch, 1.0, group_size=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16, _ = token_logprobs(model, batch, 1.0, group_size=g)
    diff = (bf16.float() - fp32).abs() * batch.response_mask
    assert 0 < diff.max() < 0.05  # not bit-identical (autocast did run), yet close


def test_a_stop_request_ends_generation_within_a_few_dozen_tokens(policy, prompts):
    """``should_stop`` is asked every STOP_CHECK_COLUMNS tokens: a cancel lands inside a long
    generation (GenerationStopped), not after it."""
    model, tok = policy
    ids, mask = prompts
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) >= 2

    with pytest.raises(GenerationStopped, match=f"after {2 * STOP_CHECK_COLUMNS} of 500"):
        # no end token: without the stop the rows would run all 500 tokens
        sample(model, ids, mask, max_new_tokens=500, eos_id=-1, pad_id=tok.pad_token_id,
               generator=torch.Generator().manual_seed(0), should_stop=should_stop)  # fmt: skip
    assert len(asked) == 2


def test_a_cancel_during_a_steps_generation_ends_the_run_before_that_step(model_store, tmp_path):
    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 3,
        "model": {"name": "tiny"},
        "task": {"name": "arith", "eval_size": 2},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 200},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
    })  # fmt: skip
    asked = []

    def should_stop() -> bool:  # the loop asks once before each step; generation every 32
        asked.append(1)
        return len(asked) >= 3

    sink = MemorySink()
    result = train(cfg, sink, should_stop, workdir=tmp_path, model_store=model_store)
    assert (result.status, result.last_step) == ("cancelled", 0)
    assert not sink.steps  # the interrupted step logged nothing
