"""Forward passes over prompts: the shared-prompt prefill and the cache it extends.

Rollouts of one group share their prompt, so both sampling and the training forward run each
group's prompt once and repeat its KV cache G times (``prefill``); the responses then extend the
repeated cache (``extend``). ``prefill_with`` and ``extend_with`` take the forward to run
(``last_positions``: logits, or the decoder's hidden states without the LM head), which is how
the training log-probs (``conspo.training.logprobs``) share this path.

Positions: prompts are left-padded, so a row's position ids count its real tokens only; response
token t (0-based) sits at position (real prompt tokens) + t in every path.

Shapes: N rollouts (rows grouped by prompt: G contiguous rows share one), P prompt positions,
T response positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel, StaticCache


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
    forward = partial(last_positions, model, True)
    state = prefill_with(forward, model.config, prompt_ids, prompt_mask, group_size, share_prefix)
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
    return extend_with(
        partial(last_positions, model, True), state, input_ids, attention_mask, offset
    )


# forward(keep, **inputs): the last ``keep`` positions' logits or hidden states (last_positions).
Forward = Callable[..., torch.Tensor]


def prefill_with(
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


def extend_with(
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


def last_positions(model: PreTrainedModel, logits: bool, keep: int, **inputs: Any) -> torch.Tensor:
    """The last ``keep`` positions' logits (N, keep, V), or the decoder's final hidden states
    (N, keep, H) there (``logits=False``: no LM head)."""
    if logits:
        return model(**inputs, logits_to_keep=keep).logits
    hidden = model.get_decoder()(**inputs).last_hidden_state
    return hidden[:, -keep:]
