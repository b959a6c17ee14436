"""Rollouts: batched sampling with a KV cache (the ``native`` engine).

The sampling loop is written out instead of calling ``model.generate``, for two reasons:

* each group's prompt is prefilled once and its KV cache repeated G times
  (``conspo.generation.forward.prefill``): most of the edge at long prompts (bench/throughput.py,
  shape c);
* on Llama, Qwen2 and Mistral decoders every later token goes through ``conspo.generation.decode``'s
  ``DecodeLoop`` (keys and values in place, attention over the written positions only, fused
  projections, weights cast once under autocast) rather than transformers' forward: the edge at
  short prompts and long answers (bench/levers.py measures it per token). Other models extend
  transformers' KV cache one forward per token.

The preallocated transformers cache (``static_cache``) and sparser stop checks
(``stop_check_every``) did not pay on CPU (bench/levers.py) and are off by default; they are
there for accelerators, where host syncs and reallocation cost more.

It is the ``native`` generation engine; ``conspo.generation.engines`` puts it beside ``generate``
(``hf``) and vLLM behind one interface (``conspo.generation.batch.Engine``), and evaluation
(``conspo.evaluation``) samples through whichever ``sampling.engine`` names.

Shapes: N rollouts, P prompt positions (left-padded), T = max_new_tokens response positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from conspo import stopping
from conspo.generation.batch import STOP_CHECK_COLUMNS, GenerationStopped, RolloutBatch
from conspo.generation.decode import DecodeLoop
from conspo.generation.forward import extend, prefill

# How often (tokens) the sampler asks whether finished rows should leave the decode batch: a
# host sync, cheap on a CPU and a stall on a GPU, so not every token.
COMPACT_CHECK_EVERY = 8


def end_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """Every token that ends an answer: the tokenizer's EOS and each ``eos_token_id`` of the
    model's generation config (an id or a list: Qwen2.5-Instruct declares <|im_end|> and
    <|endoftext|>, Llama 3 three ids; SmolLM2 ends a turn with <|im_end|>, its EOS). The first
    is the tokenizer's, the one an SFT target ends with."""
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [tokenizer.eos_token_id, *(declared if isinstance(declared, list) else [declared])]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def _stop_tensor(eos_id: int | Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=device)


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, (N, P) each. No special tokens are added."""
    enc = tokenizer(
        prompts,
        padding=True,
        padding_side="left",
        add_special_tokens=False,
        return_tensors="pt",
    )
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def _next_token(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N, V) logits → (N,) token ids. temperature 0 means greedy. ``uniforms`` (N,) float64 in
    [0, 1): each row's draw, instead of fresh ones from ``generator`` (a caller whose rows do not
    sample in step with each other gives each row its own stream)."""
    return _draw(logits, temperature, top_p, generator, uniforms)[0]


def _draw(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``_next_token``'s ids and (N,) the log-probability each was drawn with, under the
    distribution sampled (temperature, and top-p renormalised); None when greedy. What the
    trainer's π_old is compared with (``RolloutBatch.sampled_logprobs``)."""
    if temperature == 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        # Nucleus: keep the smallest prefix of the sorted distribution with mass >= top_p.
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    ids = _inverse_cdf_sample(probs, generator, uniforms)
    chosen = probs.gather(-1, ids[:, None]).squeeze(-1)
    if top_p < 1.0:
        chosen = chosen / probs.sum(-1)
    return ids, chosen.log()


def _inverse_cdf_sample(
    probs: torch.Tensor,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N, V) probabilities → (N,) ids drawn from each row, by inverting its CDF at one uniform.

    The same distribution as ``torch.multinomial(probs, 1)``, ~10× faster on a CPU at a 152k
    vocabulary (multinomial costs ~4 ms per row there; a cumsum and a binary search ~0.3 ms).
    The CDF is summed in float64, so rounding shifts no id's probability by more than ~1e-12.
    """
    cdf = probs.double().cumsum(-1)  # (N, V)
    if uniforms is not None:
        u = uniforms.to(cdf.dtype)[:, None]
    else:
        u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)
    # right=True: the first id whose CDF exceeds u, so ids of probability 0 are never drawn
    ids = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return ids.clamp(max=probs.shape[-1] - 1).squeeze(-1)


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    group_size: int = 1,
    static_cache: bool = False,
    stop_check_every: int = 1,
    decode_loop: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> RolloutBatch:
    """Sample one response per row of ``prompt_ids`` (N, P), stopping at EOS or max_new_tokens.

    ``eos_id``: the token, or every token (``end_token_ids``), that ends a response. Rows that
    have ended draw ``pad_id``, which may equal an EOS (SmolLM2's pad is its <|im_end|>): the
    result's mask comes from where the first EOS was drawn, never from the pad id.

    With ``group_size`` G > 1, rows come in runs of G copies of one prompt: the prompt is
    prefilled once and its KV cache repeated G times (the decode steps are per row anyway).
    ``static_cache``: the KV cache is preallocated for P + max_new_tokens positions and written
    in place (``conspo.generation.forward.prefill``) instead of growing by concatenation every
    token. ``stop_check_every``: whether every row has finished is asked of the device (a host sync)
    every that many tokens; finished rows decode padding in between, which the result masks.
    The tokens drawn do not depend on either setting. ``decode_loop``: decode through
    ``conspo.generation.decode.DecodeLoop`` where it supports the model (not with ``static_cache``);
    its logits equal transformers' to float rounding, so a near-tie may rarely draw differently.
    ``should_stop``: asked every ``STOP_CHECK_COLUMNS`` tokens; True raises ``GenerationStopped``.
    """
    n, p = prompt_ids.shape
    device = prompt_ids.device
    stops = _stop_tensor(eos_id, device)
    # The full attention mask, sliced as the sequence grows; response positions are all real
    # (finished rows keep decoding pad tokens that are masked out of the result below). Its
    # prompt columns are the prefill's mask, set below.
    attn = torch.ones(n, p + max_new_tokens, dtype=prompt_mask.dtype, device=device)
    g = group_size if group_size > 1 and n % group_size == 0 else 1
    loop = (
        decode_loop
        and not static_cache
        and max_new_tokens > 1  # one token is the prefill's alone
        and DecodeLoop.supports(model, p + max_new_tokens)
    )
    state = prefill(
        model,
        prompt_ids,
        prompt_mask,
        g,
        p + max_new_tokens if static_cache else None,
        share_prefix=True,
    )
    attn[:, :p] = state.mask  # the prompt columns as the cache holds them (a shared prefix first)
    logits = state.logits  # (N, V)
    if loop:
        assert isinstance(state.cache, DynamicCache)  # static_cache is off on this path
        decoder = DecodeLoop(model, state.cache, state.mask, state.next_position, max_new_tokens)
        del state  # the loop holds the keys and values now
    done = torch.zeros(n, dtype=torch.bool, device=device)
    tokens = []
    drawn_with: list[torch.Tensor] = []  # (N,) log-prob of each drawn token (temperature > 0)
    for t in range(max_new_tokens):
        tok, logprob = _draw(logits, temperature, top_p, generator)
        tok = torch.where(done, pad_id, tok)
        tokens.append(tok)
        if logprob is not None:
            drawn_with.append(logprob)
        done = done | torch.isin(tok, stops)
        if t == max_new_tokens - 1:
            break
        if (t + 1) % stop_check_every == 0 and bool(done.all()):  # the host sync
            break
        # An abandoned run, in evaluation as in sampling: asked at every token (a thread-local
        # flag; a decode step over thousands of rows can take a second).
        stopping.check()
        if should_stop is not None and (t + 1) % STOP_CHECK_COLUMNS == 0 and should_stop():
            raise GenerationStopped(f"stopped after {t + 1} of {max_new_tokens} tokens")
        if loop:
            if (t + 1) % COMPACT_CHECK_EVERY == 0:
                decoder.drop_finished(done)
            logits = decoder.step(tok, t)
            continue
        mask = attn if static_cache else attn[:, : p + t + 1]
        logits = extend(model, state, tok[:, None], mask, offset=t)[:, -1]
    response = torch.stack(tokens, dim=1)  # (N, T')
    batch = finish_responses(prompt_ids, prompt_mask, response, eos_id, pad_id)
    if drawn_with:
        batch.sampled_logprobs = torch.stack(drawn_with, dim=1) * batch.response_mask
    return batch


def draw_seed(generator: torch.Generator | None) -> int:
    """A seed drawn from ``generator`` (advancing it), so engines that seed their own random
    state stay a function of the step's seed; None: a fresh random seed."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(2**62, (1,), generator=generator, device=device).item())


def finish_responses(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response: torch.Tensor,
    eos_id: int | Sequence[int],
    pad_id: int,
) -> RolloutBatch:
    """Mask everything after the first EOS (any of ``eos_id``); rows without one are truncated.
    The mask keeps the EOS itself, also where the pad id is an EOS id."""
    is_eos = torch.isin(response, _stop_tensor(eos_id, response.device))  # (N, T')
    # A position is kept when no EOS came strictly before it.
    eos_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    mask = (~eos_before).float()
    lengths = mask.sum(-1).long()
    truncated = ~is_eos.any(-1)
    response = response.masked_fill(eos_before, pad_id)
    return RolloutBatch(prompt_ids, prompt_mask, response, mask, lengths, truncated)


def decode_responses(tokenizer: PreTrainedTokenizerBase, batch: RolloutBatch) -> list[str]:
    """Response text without EOS or padding."""
    return tokenizer.batch_decode(batch.response_ids.cpu().tolist(), skip_special_tokens=True)
