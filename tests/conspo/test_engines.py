"""Generation engines (conspo.generation.engines): native and hf give the same kind of RolloutBatch,
agree when greedy, are reproducible from the step's seed, and hf trains through train(). The vllm
engine has tests of its own (test_vllm_engine.py); here, its refusal where vLLM is missing."""

import math

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig, SamplingConfig
from conspo.generation.batch import SampleRequest
from conspo.generation.engines import ENGINES, HfEngine, NativeEngine, make_engine
from conspo.sink import MemorySink
from conspo.training.trainer import train


def _sample(engine, policy, prompts, **kw):
    model, tok = policy
    ids, mask = prompts
    request = SampleRequest(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                            **{"max_new_tokens": 8, **kw})  # fmt: skip
    return engine.sample(model, ids, mask, request)


def _assert_valid(batch, tok, n, max_new_tokens):
    assert batch.response_ids.shape == batch.response_mask.shape
    assert batch.response_ids.shape[0] == n and batch.response_ids.shape[1] <= max_new_tokens
    assert batch.lengths.shape == batch.truncated.shape == (n,)
    for row, length, cut, m in zip(batch.response_ids, batch.lengths, batch.truncated,
                                   batch.response_mask, strict=True):  # fmt: skip
        assert m[:length].eq(1).all() and m[length:].eq(0).all()
        assert row[length:].eq(tok.pad_token_id).all()
        assert (row[:length] == tok.eos_token_id).sum() == (0 if cut else 1)
        assert bool(cut) == (row[length - 1] != tok.eos_token_id)


@pytest.mark.parametrize("engine", [NativeEngine(), HfEngine()], ids=["native", "hf"])
def test_engines_give_valid_rollout_batches(engine, policy, prompts):
    _, tok = policy
    ids, mask = prompts
    grouped_ids, grouped_mask = ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
    request = SampleRequest(max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                            generator=torch.Generator().manual_seed(0), group_size=3)  # fmt: skip
    batch = engine.sample(policy[0], grouped_ids, grouped_mask, request)
    _assert_valid(batch, tok, len(grouped_ids), 8)
    assert torch.equal(batch.prompt_ids, grouped_ids)
    assert torch.equal(batch.prompt_mask, grouped_mask)
    # One token is never an answer (a digit comes before EOS): all rows truncated at length 1.
    short = _sample(engine, policy, prompts, max_new_tokens=1, temperature=0)
    assert short.response_ids.shape == (len(ids), 1)
    assert short.truncated.all() and short.lengths.eq(1).all()


def test_greedy_native_and_hf_agree(policy, prompts):
    native = _sample(NativeEngine(), policy, prompts, temperature=0)
    hf = _sample(HfEngine(), policy, prompts, temperature=0)
    assert torch.equal(native.response_ids, hf.response_ids)
    assert torch.equal(native.lengths, hf.lengths) and torch.equal(native.truncated, hf.truncated)


def test_hf_sampling_follows_the_generator_and_leaves_global_rng_alone(policy, prompts):
    def run(seed):
        return _sample(HfEngine(), policy, prompts, temperature=1.5,
                       generator=torch.Generator().manual_seed(seed))  # fmt: skip

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = run(3), run(3)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(a.response_ids, b.response_ids)
    others = [run(seed).response_ids for seed in range(4, 8)]
    assert any(not torch.equal(a.response_ids, o) for o in others)


def test_hf_top_p_near_zero_is_greedy(policy, prompts):
    nucleus = _sample(HfEngine(), policy, prompts, top_p=1e-6,
                      generator=torch.Generator().manual_seed(1))  # fmt: skip
    greedy = _sample(NativeEngine(), policy, prompts, temperature=0)
    assert torch.equal(nucleus.response_ids, greedy.response_ids)


def test_hf_engine_trains_through_train(model_store, tmp_path):
    cfg = RunConfig.model_validate({
        "steps": 3,
        "task": {"name": "arith", "params": {"digits": 1}, "eval_size": 8},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, "engine": "hf"},
        "eval": {"every": 2, "pass_k": 2},
        "checkpoint": {"every": 0},
    })  # fmt: skip
    sink = MemorySink()
    result = train(cfg, sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded" and result.last_step == 3
    assert sorted(sink.steps) == [0, 1, 2, 3]  # step 0: the starting policy's evaluation
    last = sink.steps[3].metrics
    assert 0 <= last[M.EVAL_ACCURACY] <= 1 and math.isfinite(last[M.LOSS])
    assert all(0 < r.length <= 6 for s in sink.steps.values() for r in s.rollouts)
    assert sink.steps[1].rollouts


def test_every_configurable_engine_is_registered():
    names = SamplingConfig.model_json_schema()["properties"]["engine"]["enum"]
    assert sorted(names) == sorted(ENGINES)


def test_vllm_without_vllm_is_refused_by_name(tmp_path):
    # tests/conftest.py: CONSPO_VLLM_PYTHON=none, a machine without vLLM
    with pytest.raises(RuntimeError, match="sampling.engine is 'vllm'.*not installed.*make vllm"):
        make_engine(SamplingConfig(engine="vllm"), tmp_path, torch.float32)
