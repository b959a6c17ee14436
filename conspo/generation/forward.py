"""Forward passes over prompts and responses: shared-prompt prefill and token log-probs.

Rollouts of one group share their prompt, so both sampling and the training forward run each
group's prompt once and repeat its KV cache G times (``prefill``); the responses then extend the
repeated cache (``extend``). ``token_logprobs`` is the training-time forward: the sampled tokens'
log-probs under a policy, through that shared path when the rows allow it, and a plain full
forward otherwise. Values and gradients are those of the full forward, for about 1/G of the
prompt compute. It never holds the (N, T, V) logits: the LM head runs on the decoder's hidden
states a chunk of positions at a time (``LOGIT_CHUNK_BYTES`` of float32 logits), each chunk
recomputed in the backward rather than kept.

Positions: prompts are left-padded, so a row's position ids count its real tokens only; response
token t (0-based) sits at position (real prompt tokens) + t in every path.

Shapes: N rollouts (rows grouped by prompt: G contiguous rows share one), P prompt positions,
T response positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel, StaticCache
from transformers.modeling_layers import GradientCheckpointingLayer

from conspo.models.resources import logit_chunk_tokens

if TYPE_CHECKING:  # rollout imports this module for sampling; only the type is needed here
    from conspo.generation.rollout import RolloutBatch


@dataclass
class Prefill:
    """The prompts' KV cache, one row per rollout, and what the first response token needs."""

    cache: DynamicCache | StaticCache  # (N, ...) after the G-fold repeat
    # (N, V) at the last prompt position: they predict response token 0 (the training forward's
    # prefill holds the (N, H) hidden states there instead)
    logits: torch.Tensor
    next_position: torch.Tensor  # (N, 1) long, position id of response token 0
    # (N, P) the attention mask of the cache's P prompt columns: the prompt mask, or with a
    # shared prefix (``prefill``'s share_prefix) the prefix's columns first, then each row's
    # left-padded rest. Later tokens' masks start with it.
    mask: torch.Tensor


def prompt_positions(prompt_mask: torch.Tensor) -> torch.Tensor:
    """(N, P) position ids of left-padded prompts: real tokens count from 0, padding sits at 0."""
    return (prompt_mask.cumsum(-1) - 1).clamp(min=0)


# The fewest leading tokens all prompts must share for ``prefill`` to run them once: below it
# the extra forward costs more than it saves.
MIN_SHARED_PREFIX = 8


def prefill(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    group_size: int,
    static_len: int | None = None,
    share_prefix: bool = False,
) -> Prefill:
    """Run each group's prompt once and repeat its KV cache ``group_size`` (G) times.

    prompt_ids, prompt_mask: (N, P) with N a multiple of G and every run of G contiguous rows one
    prompt (the caller's promise; ``shares_prompts`` checks it). G = 1 runs every row. Only the
    last position goes through the LM head. Gradients, when enabled, flow through the repeat back
    to the one prompt forward.

    ``static_len``: hold the cache in a ``StaticCache`` preallocated for that many positions
    (P + max_new_tokens), written in place as tokens come, instead of a ``DynamicCache`` that
    concatenates every layer's keys and values once per token (no gradients through it: for
    sampling). ``extend`` then takes the attention mask of all ``static_len`` positions.

    ``share_prefix`` (no gradients: for sampling): the leading tokens every prompt shares (a chat
    template's system prompt and the task's instruction, at least ``MIN_SHARED_PREFIX``) run once
    for the whole batch, and each prompt's rest after them (``_shared_prefix_prefill``).
    """
    forward = partial(_run, model, True)
    state = _prefill(forward, model.config, prompt_ids, prompt_mask, group_size, share_prefix)
    if static_len is not None:
        state.cache = _to_static(state.cache, model.config, static_len)
    return state


def _to_static(
    cache: DynamicCache | StaticCache, config: PretrainedConfig, length: int
) -> StaticCache:
    """The keys and values of ``cache`` copied into a ``StaticCache`` of ``length`` positions."""
    static = StaticCache(config=config, max_cache_len=length)
    layers: list[Any] = list(static.layers)  # attention layers: keys, values, update()
    for mine, theirs in zip(layers, list[Any](cache.layers), strict=True):
        mine.update(theirs.keys, theirs.values)  # allocates (N, heads, length, dim), writes 0..P-1
    return static


def extend(
    model: PreTrainedModel,
    state: Prefill,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    offset: int,
) -> torch.Tensor:
    """(N, k, V) logits after feeding ``input_ids`` (N, k), response tokens offset..offset+k-1.

    The tokens are appended to ``state.cache`` (which grows by k). attention_mask: (N, P +
    offset + k), the prompt mask followed by the response positions seen so far and these k
    (a static cache: all of its positions; those not written yet are masked as the future).
    """
    return _extend(partial(_run, model, True), state, input_ids, attention_mask, offset)


# forward(keep, **inputs): the last ``keep`` positions' logits or hidden states (see _run).
Forward = Callable[..., torch.Tensor]


def _prefill(
    forward: Forward,
    config: PretrainedConfig,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    g: int,
    share_prefix: bool = False,
) -> Prefill:
    cache = DynamicCache(config=config)
    ids, mask = prompt_ids[::g], prompt_mask[::g]  # (N/G, P): one row per prompt
    k = shared_prefix_len(ids, mask) if share_prefix else 0
    if k:
        last, mask = _shared_prefix_prefill(forward, cache, ids, mask, k)
    else:
        last = forward(
            1,
            input_ids=ids,
            attention_mask=mask,
            position_ids=prompt_positions(mask),
            cache=cache,
            use_cache=True,
        )[:, -1]  # (N/G, ·)
    if g > 1:
        cache.batch_repeat_interleave(g)  # (N/G, ...) → (N, ...)
        last = last.repeat_interleave(g, dim=0)
        mask = mask.repeat_interleave(g, dim=0)
    next_position = prompt_mask.sum(-1, keepdim=True)  # (N, 1) = last prompt position + 1
    return Prefill(cache, last, next_position, mask)


def shared_prefix_len(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """How many leading real tokens every row of left-padded ``ids`` (R, P) shares, when that is
    at least ``MIN_SHARED_PREFIX`` and there are two rows or more; else 0. Every row keeps one
    token of its own after it (its last position's logits predict the first response token)."""
    rows, width = ids.shape
    lengths = mask.sum(-1)
    shortest = int(lengths.min()) - 1
    if rows < 2 or shortest < MIN_SHARED_PREFIX:
        return 0
    starts = width - lengths  # (R,) the column of each row's first real token
    columns = starts[:, None] + torch.arange(shortest, device=ids.device)  # (R, shortest)
    leading = ids.gather(1, columns)
    same = (leading == leading[:1]).all(0)  # (shortest,) whether every row has row 0's token
    k = int(same.long().cumprod(0).sum())
    return k if k >= MIN_SHARED_PREFIX else 0


def _shared_prefix_prefill(
    forward: Forward,
    cache: DynamicCache,
    ids: torch.Tensor,
    mask: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill left-padded ``ids`` (R, P) whose rows share their first ``k`` real tokens: the
    prefix runs once (one row), its keys and values are repeated R times, and each row's rest
    runs after it. Returns the last position's (R, ·) outputs and the (R, P) attention mask of
    the cache's layout: the k prefix columns, then each row's rest left-padded to P - k.

    Attention does not care where in the cache a key sits, only about its rotary position
    (applied before caching) and the mask: a row's rest keeps the positions it has in the
    plain layout (k, k + 1, ...), so every logit is the plain prefill's, to float rounding."""
    rows, width = ids.shape
    start = width - int(mask[0].sum())  # row 0's first real token
    prefix = ids[:1, start : start + k]
    forward(
        1,
        input_ids=prefix,
        attention_mask=torch.ones_like(prefix),
        position_ids=torch.arange(k, device=ids.device)[None],
        cache=cache,
        use_cache=True,
    )
    cache.batch_repeat_interleave(rows)
    # Row r's rest is its last (length_r - k) columns; in the P - k columns from k on, what lies
    # left of it (prefix tokens, padding) is masked out exactly where the plain mask's first
    # P - k columns are 0.
    rest_mask = mask[:, : width - k]
    rest_ids = ids[:, k:]
    layout = torch.cat([torch.ones_like(mask[:, :k]), rest_mask], dim=1)  # (R, P)
    positions = (k + rest_mask.cumsum(-1) - 1).clamp(min=0)
    last = forward(
        1,
        input_ids=rest_ids,
        attention_mask=layout,
        position_ids=positions,
        cache=cache,
        use_cache=True,
    )[:, -1]
    return last, layout


def _extend(
    forward: Forward,
    state: Prefill,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    offset: int,
) -> torch.Tensor:
    k = input_ids.shape[1]
    position_ids = state.next_position + offset  # (N, 1)
    if k > 1:
        position_ids = position_ids + torch.arange(k, device=position_ids.device)  # (N, k)
    return forward(
        k,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=state.cache,
        use_cache=True,
    )


def shares_prompts(batch: RolloutBatch, group_size: int) -> bool:
    """True when every run of ``group_size`` contiguous rows has one prompt (ids and padding)."""
    n, p = batch.prompt_ids.shape
    g = group_size
    if n % g:
        return False
    ids, mask = batch.prompt_ids.view(n // g, g, p), batch.prompt_mask.view(n // g, g, p)
    return bool((ids == ids[:, :1]).all() and (mask == mask[:, :1]).all())


def logprob_mode(model: nn.Module) -> None:
    """Put ``model`` in the mode of a log-prob pass: no dropout anywhere (nn.Dropout modules,
    attention dropout and LoRA dropout read ``training``), so π_θ is the policy that sampled.

    Decoder layers that checkpoint stay in training mode alone: transformers' checkpointing
    wrapper only recomputes a layer whose own ``training`` is set, and no layer reads it for
    anything else (its attention and MLP submodules stay in eval mode).
    """
    model.eval()
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) and isinstance(
            module, GradientCheckpointingLayer
        ):
            module.training = True


def token_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float,
    with_entropy: bool = False,
    group_size: int = 1,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, T) log π(o_t | q, o_<t) of the sampled tokens at the sampling temperature.

    With ``with_entropy``, also the (N, T) entropy of that distribution (no grad). With
    ``group_size`` G > 1 and rows grouped by prompt, each prompt runs once (``prefill``);
    otherwise one full forward. Padded response positions hold finite values the caller masks.

    The LM head runs on ``chunk_tokens`` positions at a time (default: about LOGIT_CHUNK_BYTES of
    float32 logits, ``conspo.models.resources.logit_chunk_tokens``), each chunk under activation
    checkpointing when gradients are on, so only one chunk's logits are ever alive. A model whose
    head post-processes the logits (``HEAD_POST_PROCESSING``: Gemma 2's soft-capping, Cohere's
    logit scale, Granite's logits scaling) takes the plain path: full logits from its forward.
    """
    head_is_plain = not any(getattr(model.config, key, None) for key in HEAD_POST_PROCESSING)
    shared = group_size > 1 and shares_prompts(batch, group_size) and not _drops_cache(model)
    outputs = _shared_prompt_outputs if shared else _full_outputs
    with _short_sequence_attention(model, batch):
        if not head_is_plain:
            states = outputs(model, batch, group_size, logits=True)
            head: Callable[[torch.Tensor], torch.Tensor] = nn.Identity()
            chunk_tokens = chunk_tokens or logit_chunk_tokens(states.shape[-1])
        else:
            states = outputs(model, batch, group_size, logits=False)
            head = model.get_output_embeddings()
            chunk_tokens = chunk_tokens or logit_chunk_tokens(model.config.vocab_size)
    n, t = batch.response_ids.shape
    flat, targets = states.reshape(n * t, -1), batch.response_ids.reshape(n * t)
    logprobs, entropy = [], []
    for start in range(0, n * t, chunk_tokens):
        part = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled() and flat.requires_grad:
            # Each chunk's logits are recomputed in the backward instead of kept: one alive.
            lp, ent = checkpoint(
                _chunk_logprobs, head, flat[part], targets[part], temperature, with_entropy,
                use_reentrant=False,
            )  # fmt: skip
        else:
            lp, ent = _chunk_logprobs(head, flat[part], targets[part], temperature, with_entropy)
        logprobs.append(lp)
        entropy.append(ent)
    out = torch.cat(logprobs).view(n, t)
    return out, torch.cat(entropy).view(n, t) if with_entropy else None


# Eager attention (explicit matmuls and a softmax) beats the CPU flash-attention kernel of
# ``sdpa`` on short sequences in half precision: bench/levers.py measured the training forward +
# backward at shape (b) (64 rows x ~138 positions, ~10M parameters) 13% faster under bfloat16
# autocast, and 5% slower in float32 (which keeps sdpa). It keeps every layer's (rows, heads,
# T, T) attention probabilities for the backward (~8 bytes an entry: the float32 softmax and
# its cast), so it is used on a CPU only while all layers' stay under this many bytes (shape b:
# ~220 MB).
EAGER_ATTENTION_BYTES = 256 * 2**20


@contextmanager
def _short_sequence_attention(model: nn.Module, batch: RolloutBatch) -> Iterator[None]:
    """Run the enclosed forward with eager attention where that is faster (half precision on a
    CPU, see EAGER_ATTENTION_BYTES), then restore ``sdpa``. Models on another attention, on an
    accelerator, in float32, or recomputing checkpointed layers in the backward (which must
    replay the forward's own attention) keep theirs."""
    config = getattr(model, "config", None)
    switch = getattr(model, "set_attn_implementation", None)
    if config is None or switch is None or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    n, length = batch.prompt_ids.shape[0], batch.prompt_ids.shape[1] + batch.response_ids.shape[1]
    heads = getattr(config, "num_attention_heads", 0)
    layers = getattr(config, "num_hidden_layers", 0)
    probabilities = n * heads * length * length * 8 * layers
    weights = next(model.parameters())
    on_cpu = weights.device.type == "cpu"
    half = torch.is_autocast_enabled("cpu") or weights.dtype in (torch.bfloat16, torch.float16)
    if not (on_cpu and half) or probabilities > EAGER_ATTENTION_BYTES or _drops_cache(model):
        yield
        return
    switch("eager")
    try:
        yield
    finally:
        switch("sdpa")


# Config attributes of heads whose logits are more than lm_head(hidden): such models take the
# plain path of token_logprobs.
HEAD_POST_PROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _chunk_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    states: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k,) log-probs of ``targets`` (k,) and (k,) entropy (empty unless ``with_entropy``; no
    grad) from (k, H) hidden states (or (k, V) logits with an identity head), in float32."""
    logits = head(states).float() / temperature
    logz = logits.logsumexp(-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
    if not with_entropy:
        return logprobs, logits.new_empty(0)
    with torch.no_grad():
        entropy = logz - (logits.softmax(-1) * logits).sum(-1)
    return logprobs, entropy


def _drops_cache(model: nn.Module) -> bool:
    """Whether this forward would run checkpointed layers, which transformers runs without a
    KV cache: the shared-prompt path needs one, so such a pass takes the full forward."""
    return torch.is_grad_enabled() and _checkpoints_layers(model)


def _checkpoints_layers(model: nn.Module) -> bool:
    """Whether any decoder layer recomputes its forward in the backward."""
    return any(
        module.training and getattr(module, "gradient_checkpointing", False)
        for module in model.modules()
        if isinstance(module, GradientCheckpointingLayer)
    )


def _run(model: PreTrainedModel, logits: bool, keep: int, **inputs: Any) -> torch.Tensor:
    """The last ``keep`` positions' logits (N, keep, V), or the decoder's final hidden states
    (N, keep, H) there (``logits=False``: no LM head)."""
    if logits:
        return model(**inputs, logits_to_keep=keep).logits
    hidden = model.get_decoder()(**inputs).last_hidden_state
    return hidden[:, -keep:]


def _full_outputs(
    model: PreTrainedModel, batch: RolloutBatch, g: int, logits: bool
) -> torch.Tensor:
    """(N, T, ·) logits or hidden states predicting each response token, from one forward over
    prompt+response. Only the last T+1 positions are kept: the prompt's own are never needed."""
    t = batch.response_ids.shape[1]
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (N, P+T)
    attn = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    out = _run(model, logits, t + 1, input_ids=input_ids, attention_mask=attn,
               position_ids=prompt_positions(attn), use_cache=False)  # fmt: skip
    return out[:, :-1]  # position P-1+t predicts response token t


def _shared_prompt_outputs(
    model: PreTrainedModel, batch: RolloutBatch, g: int, logits: bool
) -> torch.Tensor:
    """(N, T, ·) logits or hidden states predicting each response token, each group's prompt
    run once."""
    forward = partial(_run, model, logits)
    state = _prefill(forward, model.config, batch.prompt_ids, batch.prompt_mask, g)
    first = state.logits[:, None]  # (N, 1, ·) predicts response token 0
    t = batch.response_ids.shape[1]
    if t == 1:
        return first
    # Token t ≥ 1 is predicted by the forward at token t-1: feed all but the last token.
    attn = torch.cat([batch.prompt_mask, batch.response_mask[:, :-1].long()], dim=1)
    rest = _extend(forward, state, batch.response_ids[:, :-1], attn, offset=0)  # (N, T-1, ·)
    return torch.cat([first, rest], dim=1)
