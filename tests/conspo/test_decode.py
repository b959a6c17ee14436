"""conspo.generation.decode.DecodeLoop: the same logits as the model's own forward, token after
token, on each architecture it claims (with left padding, grouped-query heads, q/k/v biases, rope
scaling); refusal of the models it does not reproduce; and the sampler using it."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from conspo.generation.decode import DecodeLoop
from conspo.generation.forward import prefill, prompt_positions
from conspo.generation.rollout import sample

VOCAB = 40
DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            max_position_embeddings=256)  # fmt: skip


def qwen2() -> Qwen2ForCausalLM:  # q/k/v biases, tied head
    return Qwen2ForCausalLM(Qwen2Config(**DIMS, num_attention_heads=4, num_key_value_heads=4,
                                        tie_word_embeddings=True))  # fmt: skip


def llama_gqa() -> LlamaForCausalLM:  # 4 query heads per key/value head, llama3 rope scaling
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}  # fmt: skip
    return LlamaForCausalLM(LlamaConfig(**DIMS, num_attention_heads=8, num_key_value_heads=2,
                                        rope_parameters=rope))  # fmt: skip


def mistral() -> MistralForCausalLM:  # head_dim set apart from hidden / heads
    return MistralForCausalLM(MistralConfig(**DIMS, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=24, sliding_window=None))  # fmt: skip


def prompts(n: int = 6, p: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (n, p), generator=gen)
    mask = torch.ones(n, p, dtype=torch.long)
    for row, pad in enumerate([0, 3, 1, 0, 5, 2][:n]):  # left padding of different widths
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return ids, mask


def reference_logits(model, ids, mask, response) -> torch.Tensor:
    """(N, V) last-position logits of the model's own full forward over prompt + response."""
    full = torch.cat([ids, response], dim=1)
    attn = torch.cat([mask, torch.ones_like(response)], dim=1)
    out = model(input_ids=full, attention_mask=attn, position_ids=prompt_positions(attn))
    return out.logits[:, -1].float()


def loop_logits(model, ids, mask, response) -> list[torch.Tensor]:
    """The loop's logits after each response token."""
    state = prefill(model, ids, mask, 1)
    loop = DecodeLoop(model, state.cache, mask, state.next_position, response.shape[1])
    return [loop.step(response[:, t], t) for t in range(response.shape[1])]


@pytest.mark.parametrize("build", [qwen2, llama_gqa, mistral])
@torch.no_grad()
def test_loop_logits_equal_the_models_own_forward(build):
    torch.manual_seed(0)
    model = build().eval()
    assert DecodeLoop.supports(model, 64)
    ids, mask = prompts()
    response = torch.randint(
        1, VOCAB, (ids.shape[0], 9), generator=torch.Generator().manual_seed(1)
    )
    for t, logits in enumerate(loop_logits(model, ids, mask, response)):
        ref = reference_logits(model, ids, mask, response[:, : t + 1])
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_loop_under_bf16_autocast_stays_near_the_forward_under_autocast():
    """bfloat16 autocast over float32 weights: the loop casts the weights once and keeps the
    residual stream in float32, as transformers' forward does under autocast; both are bf16
    roundings of the same function, so their log-probs agree to bf16 precision."""
    torch.manual_seed(0)
    model = llama_gqa().eval()
    ids, mask = prompts()
    response = torch.randint(
        1, VOCAB, (ids.shape[0], 6), generator=torch.Generator().manual_seed(2)
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = loop_logits(model, ids, mask, response)
        refs = [reference_logits(model, ids, mask, response[:, : t + 1]) for t in range(6)]
    exact = [reference_logits(model, ids, mask, response[:, : t + 1]) for t in range(6)]
    for logits, ref, fp32 in zip(ours, refs, exact, strict=True):
        ours_gap = (logits.log_softmax(-1) - fp32.log_softmax(-1)).abs().max()
        their_gap = (ref.log_softmax(-1) - fp32.log_softmax(-1)).abs().max()
        assert ours_gap < 0.05 and their_gap < 0.05  # both bf16 roundings of the float32 values
        assert (logits.log_softmax(-1) - ref.log_softmax(-1)).abs().max() < 0.05


def test_models_the_loop_does_not_reproduce_are_refused():
    torch.manual_seed(0)
    # query/key norms (Qwen3) are not in the loop's layer
    qwen3 = Qwen3ForCausalLM(Qwen3Config(**DIMS, num_attention_heads=4, num_key_value_heads=4,
                                         head_dim=16)).eval()  # fmt: skip
    assert not DecodeLoop.supports(qwen3, 64)
    # a sliding window the sequence reaches
    windowed = MistralConfig(
        **DIMS, num_attention_heads=4, num_key_value_heads=2, sliding_window=32
    )
    windowed = MistralForCausalLM(windowed)
    assert DecodeLoop.supports(windowed.eval(), 32) and not DecodeLoop.supports(windowed, 33)
    # another activation
    gelu = LlamaForCausalLM(LlamaConfig(**DIMS, num_attention_heads=4, hidden_act="gelu"))
    assert not DecodeLoop.supports(gelu.eval(), 64)
    # LoRA variants (DoRA scales by a magnitude vector) and LoRA dropout while training
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(qwen2(), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert not DecodeLoop.supports(dora.eval(), 64)
    dropping = get_peft_model(qwen2(), LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1))
    assert not DecodeLoop.supports(dropping.train(), 64)
    assert DecodeLoop.supports(dropping.eval(), 64)


def with_lora(model, targets, seed=3):
    """``model`` under peft LoRA (rank 4, α 8) whose B matrices are random: peft starts them at
    zero, where a LoRA model is its base and any merge looks right."""
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    gen = torch.Generator().manual_seed(seed)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            param.data = torch.randn(param.shape, generator=gen) * 0.2
    return lora


LORA_TARGETS = [
    ["q_proj", "v_proj"],
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
]


@pytest.mark.parametrize("targets", LORA_TARGETS)
@pytest.mark.parametrize("build", [qwen2, llama_gqa])
@torch.no_grad()
def test_loop_with_lora_equals_the_peft_models_own_forward(build, targets):
    """Adapters merged into the per-call weights: the logits of peft's forward (base + side path)
    token after token, with left padding; and not those of the base model."""
    torch.manual_seed(0)
    lora = with_lora(build(), targets).eval()
    assert DecodeLoop.supports(lora, 64)
    ids, mask = prompts()
    response = torch.randint(
        1, VOCAB, (ids.shape[0], 7), generator=torch.Generator().manual_seed(1)
    )
    for t, logits in enumerate(loop_logits(lora, ids, mask, response)):
        ref = reference_logits(lora, ids, mask, response[:, : t + 1])
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    with lora.disable_adapter():
        base = reference_logits(lora, ids, mask, response)
    assert (logits - base).abs().max() > 1e-2  # the adapters moved the logits


@torch.no_grad()
def test_sampler_decodes_a_lora_model_through_the_loop(monkeypatch):
    """A LoRA policy samples through the loop (counted) and draws what transformers' path draws."""
    torch.manual_seed(0)
    lora = with_lora(qwen2(), LORA_TARGETS[1]).eval()
    steps = []
    real_step = DecodeLoop.step
    monkeypatch.setattr(DecodeLoop, "step", lambda self, *a: steps.append(1) or real_step(self, *a))
    ids, mask = prompts()
    kw = dict(max_new_tokens=8, eos_id=VOCAB + 5, pad_id=0, temperature=1.0)
    ours = sample(lora, ids, mask, generator=torch.Generator().manual_seed(4), **kw)
    assert len(steps) == 7
    theirs = sample(
        lora, ids, mask, generator=torch.Generator().manual_seed(4), decode_loop=False, **kw
    )
    assert torch.equal(ours.response_ids, theirs.response_ids)


def test_sampler_draws_the_same_tokens_through_the_loop(policy, prompts, monkeypatch):
    """The shipped tiny model is a Qwen2: the sampler decodes it through the loop (counted),
    drawing what the transformers path draws for the same seed, with and without groups."""
    model, tok = policy
    assert DecodeLoop.supports(model, 64)
    steps = []
    real_step = DecodeLoop.step
    monkeypatch.setattr(DecodeLoop, "step", lambda self, *a: steps.append(1) or real_step(self, *a))
    g = 3
    ids, mask = (x.repeat_interleave(g, dim=0) for x in prompts)
    kw = dict(max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, group_size=g)
    for temperature in (0.0, 1.0):
        fast = sample(model, ids, mask, temperature=temperature,
                      generator=torch.Generator().manual_seed(4), **kw)  # fmt: skip
        assert steps, "the loop was not used"
        steps.clear()
        slow = sample(model, ids, mask, temperature=temperature, decode_loop=False,
                      generator=torch.Generator().manual_seed(4), **kw)  # fmt: skip
        assert not steps
        assert torch.equal(fast.response_ids, slow.response_ids)
        assert torch.equal(fast.lengths, slow.lengths)


@torch.no_grad()
def test_finished_rows_leave_the_batch_and_the_tokens_stay_the_same(monkeypatch):
    """Rows that end early are dropped from the loop's buffers once a quarter of the rows have
    ended: later steps run on fewer rows, and every row draws exactly the tokens transformers'
    path draws."""
    torch.manual_seed(0)
    model = llama_gqa().eval()
    ids, mask = (x.repeat(2, 1) for x in prompts())  # 12 rows
    kw = dict(max_new_tokens=40, pad_id=0, temperature=1.0)
    first = sample(model, ids, mask, eos_id=VOCAB + 5, generator=torch.Generator().manual_seed(5),
                   decode_loop=False, **kw)  # fmt: skip
    eos = int(first.response_ids.flatten().mode().values)  # the token drawn most often
    rows_per_step = []
    real_step = DecodeLoop.step
    monkeypatch.setattr(
        DecodeLoop,
        "step",
        lambda self, *a: rows_per_step.append(len(self.rows)) or real_step(self, *a),
    )
    ours = sample(model, ids, mask, eos_id=eos, generator=torch.Generator().manual_seed(6), **kw)
    theirs = sample(model, ids, mask, eos_id=eos, generator=torch.Generator().manual_seed(6),
                    decode_loop=False, **kw)  # fmt: skip
    assert torch.equal(ours.response_ids, theirs.response_ids)
    assert torch.equal(ours.response_mask, theirs.response_mask)
    ended = (~ours.truncated).sum().item()
    assert ended >= 6, "the test needs rows that end early"
    assert rows_per_step[0] == 12 and min(rows_per_step) < 12 - ended // 2
    assert rows_per_step == sorted(rows_per_step, reverse=True)


def prompts_with_a_shared_prefix(k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts whose first ``k`` real tokens are the same (a system prompt), each
    row's rest of its own length and first token."""
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(1, VOCAB, (k,), generator=gen)
    rests = [3, 5, 1, 6, 4, 2]
    width = k + max(rests)
    ids = torch.zeros(len(rests), width, dtype=torch.long)
    mask = torch.zeros(len(rests), width, dtype=torch.long)
    for row, n in enumerate(rests):
        rest = torch.randint(1, VOCAB, (n,), generator=gen)
        rest[0] = 1 + (prefix[0] + 1 + row) % (VOCAB - 1)  # differs from row to row
        ids[row, width - k - n :] = torch.cat([prefix, rest])
        mask[row, width - k - n :] = 1
    return ids, mask


@pytest.mark.parametrize("build", [qwen2, llama_gqa])
@torch.no_grad()
def test_a_shared_prefix_runs_once_and_the_logits_stay_the_models_own(build, monkeypatch):
    """Prompts sharing their first tokens (a chat template's system prompt): the prefix runs
    once, on one row, and every logit after it, prefill and decode, is the model's own."""
    from conspo.generation import forward

    torch.manual_seed(0)
    model = build().eval()
    ids, mask = prompts_with_a_shared_prefix(10)
    assert forward.shared_prefix_len(ids, mask) == 10
    widths = []
    real_run = forward.last_positions
    monkeypatch.setattr(
        forward, "last_positions", lambda m, lg, keep, **kw: widths.append(kw["input_ids"].shape) or
        real_run(m, lg, keep, **kw),
    )  # fmt: skip
    state = prefill(model, ids, mask, 1, share_prefix=True)
    assert widths == [(1, 10), (6, ids.shape[1] - 10)]  # the prefix once, then each rest
    torch.testing.assert_close(
        state.logits.float(), reference_logits(model, ids, mask, ids[:, :0]), rtol=1e-5, atol=1e-5
    )
    response = torch.randint(1, VOCAB, (6, 7), generator=torch.Generator().manual_seed(3))
    loop = DecodeLoop(model, state.cache, state.mask, state.next_position, response.shape[1])
    for t in range(response.shape[1]):
        ref = reference_logits(model, ids, mask, response[:, : t + 1])
        torch.testing.assert_close(loop.step(response[:, t], t), ref, rtol=1e-5, atol=1e-5)
    # Prompts that share less than MIN_SHARED_PREFIX tokens run whole, as before.
    assert forward.shared_prefix_len(*prompts()) == 0


@pytest.mark.parametrize("decode_loop", [True, False])
def test_sampler_draws_the_same_tokens_with_a_shared_prefix(decode_loop, monkeypatch):
    from conspo.generation import forward

    torch.manual_seed(0)
    model = llama_gqa().eval()
    ids, mask = (x.repeat_interleave(2, dim=0) for x in prompts_with_a_shared_prefix(12))
    kw = dict(max_new_tokens=10, eos_id=VOCAB + 5, pad_id=0, temperature=1.0, group_size=2,
              decode_loop=decode_loop)  # fmt: skip
    shared = sample(model, ids, mask, generator=torch.Generator().manual_seed(7), **kw)
    monkeypatch.setattr(forward, "MIN_SHARED_PREFIX", 10**6)  # every prompt run whole
    whole = sample(model, ids, mask, generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(shared.response_ids, whole.response_ids)
    assert torch.equal(shared.prompt_mask, mask)  # the rollouts keep the prompts' own layout
