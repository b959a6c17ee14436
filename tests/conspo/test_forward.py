"""The forward passes of conspo.generation.forward: shared-prompt prefill and token log-probs.

Every shortcut (a prompt run once per group, only the needed positions through the LM head) is
checked against the plain forward it replaces, in values and in gradients.
"""

import copy

import pytest
import torch

from conspo.config import ModelConfig
from conspo.generation.batch import RolloutBatch
from conspo.generation.forward import prefill, prompt_positions
from conspo.generation.rollout import sample
from conspo.models.loading import prepare_for_training
from conspo.training.logprobs import logprob_mode, shares_prompts, token_logprobs


def test_prefill_runs_each_prompt_once_and_repeats_it_per_rollout(policy, prompts):
    model, _ = policy
    g = 3
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    batch_sizes = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: batch_sizes.append(kwargs["input_ids"].shape[0]),
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            shared = prefill(model, ids, mask, g)
            per_row = prefill(model, ids, mask, 1)
    finally:
        hook.remove()
    assert batch_sizes == [len(ids) // g, len(ids)]
    torch.testing.assert_close(shared.logits, per_row.logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(shared.next_position[:, 0], mask.sum(-1))  # real prompt tokens
    for a, b in zip(shared.cache.layers, per_row.cache.layers, strict=True):
        assert a.keys.shape == b.keys.shape  # one cache row per rollout


def test_shares_prompts_needs_equal_ids_and_padding_in_every_group(prompts):
    ids, mask = (x.repeat_interleave(2, dim=0) for x in prompts)  # (10, P)
    n = len(ids)
    response = torch.ones(n, 1, dtype=torch.long)

    def batch(ids, mask):
        return RolloutBatch(ids, mask, response, response.float(), response[:, 0],
                            torch.zeros(n, dtype=torch.bool))  # fmt: skip

    assert shares_prompts(batch(ids, mask), 2)
    assert shares_prompts(batch(ids, mask), 1)
    assert not shares_prompts(batch(ids, mask), 4)  # 10 rows are not groups of 4
    assert not shares_prompts(batch(ids.roll(1, dims=0), mask.roll(1, dims=0)), 2)
    unpadded = mask.clone()
    unpadded[1] = 1  # same ids, but row 1 attends to the padding of row 0
    assert not shares_prompts(batch(ids, unpadded), 2)


def test_token_logprobs_match_unpadded_forward(policy, prompts):
    model, tok = policy
    ids, mask = prompts
    out = sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, out, temperature=1.0, with_entropy=True)
        for i in range(len(ids)):
            prompt = ids[i][mask[i].bool()].tolist()
            resp = out.response_ids[i, : out.lengths[i]].tolist()
            full = model(torch.tensor([prompt + resp])).logits[0].log_softmax(-1)
            ref = full[len(prompt) - 1 : -1].gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
            torch.testing.assert_close(logprobs[i, : len(resp)], ref, atol=1e-4, rtol=1e-4)
    assert (entropy >= 0).all()


def test_shared_prompt_forward_matches_the_full_forward_in_values_and_gradients(policy, prompts):
    """Groups run their prompt once (KV cache shared by G responses): nothing may change."""
    model, tok = policy
    g = 3
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    out = sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(5))  # fmt: skip
    assert out.response_ids.shape[1] > 1  # the cached path is exercised past the first token

    def value_and_grads(group_size: int):
        model.zero_grad(set_to_none=True)
        logprobs, _ = token_logprobs(model, out, temperature=0.7, group_size=group_size)
        (logprobs * out.response_mask).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return logprobs.detach(), grads

    full, full_grads = value_and_grads(1)
    shared, shared_grads = value_and_grads(g)
    model.zero_grad(set_to_none=True)
    m = out.response_mask.bool()
    torch.testing.assert_close(shared[m], full[m], atol=1e-5, rtol=1e-5)
    assert len(full_grads) == len(shared_grads)
    for a, b in zip(full_grads, shared_grads, strict=True):
        assert_same_gradient(b, a)


def assert_same_gradient(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same gradient up to float32 summation order: relative error of the whole tensor under
    1e-4. Element by element is too strict for it: float32 kernels sum in another order at
    another batch shape (on AVX2-only CPUs a few of 12,800 entries differ by 2-5e-5), while a
    wrong path (a prompt's gradient missing, a token counted twice) is off by its whole size."""
    assert got.shape == want.shape
    error = float((got - want).norm() / want.norm().clamp(min=1e-12))
    assert error < 1e-4, f"gradients differ: relative error {error:.2e}"


def plain_logprobs(model, out, temperature):
    """Log-probs from the model's own full-vocabulary logits: what the chunked path replaces."""
    t = out.response_ids.shape[1]
    ids = torch.cat([out.prompt_ids, out.response_ids], 1)
    attn = torch.cat([out.prompt_mask, out.response_mask.long()], 1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=prompt_positions(attn)).logits
    logits = logits[:, -t - 1 : -1].float() / temperature
    logprobs = logits.log_softmax(-1).gather(-1, out.response_ids[..., None]).squeeze(-1)
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    return logprobs, entropy.detach()


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.parametrize("chunk_tokens", [1, 4, None])
def test_chunked_logprobs_equal_the_full_vocabulary_ones(group_size, chunk_tokens, policy,
                                                         prompts):  # fmt: skip
    model, tok = policy
    ids, mask = (x.repeat_interleave(3, dim=0) for x in prompts)
    out = sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(2))  # fmt: skip
    assert out.response_ids.shape[1] > 2  # a chunk of 1 or 4 is less than a row

    def value_and_grads(fn):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = fn()
        (logprobs * out.response_mask).sum().backward()
        return logprobs.detach(), entropy, [p.grad.clone() for p in model.parameters()]

    want, want_entropy, want_grads = value_and_grads(lambda: plain_logprobs(model, out, 0.7))
    got, got_entropy, got_grads = value_and_grads(
        lambda: token_logprobs(
            model, out, 0.7, with_entropy=True, group_size=group_size, chunk_tokens=chunk_tokens
        )  # fmt: skip
    )
    model.zero_grad(set_to_none=True)
    m = out.response_mask.bool()
    torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_entropy[m], want_entropy[m], atol=1e-5, rtol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_same_gradient(a, b)


def test_logprob_passes_run_without_dropout(policy, prompts):
    """A model whose attention and LoRA dropout are 0.5: every log-prob pass is deterministic,
    with and without gradient checkpointing, while training mode would not be."""
    base, tok = policy
    model = copy.deepcopy(base)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    lora = {"rank": 4, "dropout": 0.5}
    model = prepare_for_training(model, ModelConfig(lora=lora, gradient_checkpointing=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at 0, which would hide the adapters' dropout
    ids, mask = (x.repeat_interleave(2, dim=0) for x in prompts)
    out = sample(base, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(3))  # fmt: skip
    m = out.response_mask.bool()
    model.train()
    noisy = [token_logprobs(model, out, 1.0)[0][m] for _ in range(2)]
    assert not torch.allclose(*noisy)  # the dropout is real
    logprob_mode(model)
    with torch.no_grad():
        first = token_logprobs(model, out, 1.0, group_size=2)[0][m]
    again = token_logprobs(model, out, 1.0, group_size=2)[0][m]  # grad on: checkpointed layers
    assert again.requires_grad
    torch.testing.assert_close(again.detach(), first, atol=1e-5, rtol=1e-5)
    assert torch.equal(token_logprobs(model, out, 1.0)[0][m].detach(), again.detach())


def test_short_sequence_attention_is_eager_under_bf16_on_a_cpu(policy, prompts, monkeypatch):
    """On a CPU, the training forward of a short batch under bfloat16 autocast runs
    transformers' eager attention (faster than the flash kernel there, bench/levers.py): log-probs
    and gradients as near sdpa's as two bf16 roundings are, the model's own attention restored
    afterwards; float32, and a batch over the byte budget, keep sdpa."""
    import contextlib

    import conspo.training.logprobs

    model, tok = policy
    g = 3
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    out = sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(7))  # fmt: skip
    seen = []
    layer = model.model.layers[0].self_attn
    hook = layer.register_forward_hook(lambda *_: seen.append(model.config._attn_implementation))

    def value_and_grads(bf16: bool):
        seen.clear()
        model.zero_grad(set_to_none=True)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            logprobs, _ = token_logprobs(model, out, temperature=1.0, group_size=g)
        (logprobs.float() * out.response_mask).sum().backward()
        assert model.config._attn_implementation == "sdpa"  # restored
        return logprobs.detach().float(), torch.cat([p.grad.flatten() for p in model.parameters()])

    try:
        value_and_grads(bf16=False)
        assert set(seen) == {"sdpa"}
        eager, eager_grads = value_and_grads(bf16=True)
        assert set(seen) == {"eager"}
        monkeypatch.setattr(conspo.training.logprobs, "EAGER_ATTENTION_BYTES", 0)
        flash, flash_grads = value_and_grads(bf16=True)
        assert set(seen) == {"sdpa"}
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
    m = out.response_mask.bool()
    assert (eager[m] - flash[m]).abs().max() < 0.05  # nats: bf16 roundings of one function
    assert (eager_grads - flash_grads).norm() < 0.05 * flash_grads.norm()
