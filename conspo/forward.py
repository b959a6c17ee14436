"""Forward passes over prompts and responses: shared-prompt prefill and token log-probs.

Rollouts of one group share their prompt, so both sampling and the training forward run each
group's prompt once and repeat its KV cache G times (``prefill``); the responses then extend the
repeated cache (``extend``). ``token_logprobs`` is the training-time forward: the sampled tokens'
log-probs under a policy, through that shared path when the rows allow it, and a plain full
forward otherwise. Values and gradients are those of the full forward, for about 1/G of the
prompt compute.

Positions: prompts are left-padded, so a row's position ids count its real tokens only; response
token t (0-based) sits at position (real prompt tokens) + t in every path.

Shapes: N rollouts (rows grouped by prompt: G contiguous rows share one), P prompt positions,
T response positions, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, PreTrainedModel

if TYPE_CHECKING:  # rollout imports this module for sampling; only the type is needed here
    from conspo.rollout import RolloutBatch


@dataclass
class Prefill:
    """The prompts' KV cache, one row per rollout, and what the first response token needs."""

    cache: DynamicCache  # (N, ...) after the G-fold repeat
    logits: torch.Tensor  # (N, V) at the last prompt position: they predict response token 0
    next_position: torch.Tensor  # (N, 1) long, position id of response token 0


def prompt_positions(prompt_mask: torch.Tensor) -> torch.Tensor:
    """(N, P) position ids of left-padded prompts: real tokens count from 0, padding sits at 0."""
    return (prompt_mask.cumsum(-1) - 1).clamp(min=0)


def prefill(
    model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int
) -> Prefill:
    """Run each group's prompt once and repeat its KV cache ``group_size`` (G) times.

    prompt_ids, prompt_mask: (N, P) with N a multiple of G and every run of G contiguous rows one
    prompt (the caller's promise; ``shares_prompts`` checks it). G = 1 runs every row. Only the
    last position goes through the LM head. Gradients, when enabled, flow through the repeat back
    to the one prompt forward.
    """
    g = group_size
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=prompt_ids[::g],  # (N/G, P)
        attention_mask=prompt_mask[::g],
        position_ids=prompt_positions(prompt_mask[::g]),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1]  # (N/G, V)
    if g > 1:
        cache.batch_repeat_interleave(g)  # (N/G, ...) → (N, ...)
        logits = logits.repeat_interleave(g, dim=0)
    next_position = prompt_mask.sum(-1, keepdim=True)  # (N, 1) = last prompt position + 1
    return Prefill(cache, logits, next_position)


def extend(
    model: PreTrainedModel,
    state: Prefill,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    offset: int,
) -> torch.Tensor:
    """(N, k, V) logits after feeding ``input_ids`` (N, k), response tokens offset..offset+k-1.

    The tokens are appended to ``state.cache`` (which grows by k). attention_mask: (N, P +
    offset + k), the prompt mask followed by the response positions seen so far and these k.
    """
    k = input_ids.shape[1]
    position_ids = state.next_position + offset  # (N, 1)
    if k > 1:
        position_ids = position_ids + torch.arange(k, device=position_ids.device)  # (N, k)
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=state.cache,
        use_cache=True,
    ).logits


def shares_prompts(batch: RolloutBatch, group_size: int) -> bool:
    """True when every run of ``group_size`` contiguous rows has one prompt (ids and padding)."""
    n, p = batch.prompt_ids.shape
    g = group_size
    if n % g:
        return False
    ids, mask = batch.prompt_ids.view(n // g, g, p), batch.prompt_mask.view(n // g, g, p)
    return bool((ids == ids[:, :1]).all() and (mask == mask[:, :1]).all())


def token_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float,
    with_entropy: bool = False,
    group_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, T) log π(o_t | q, o_<t) of the sampled tokens at the sampling temperature.

    With ``with_entropy``, also the (N, T) entropy of that distribution (no grad). With
    ``group_size`` G > 1 and rows grouped by prompt, each prompt runs once (``prefill``);
    otherwise one full forward. Padded response positions hold finite values the caller masks.
    """
    if group_size > 1 and shares_prompts(batch, group_size):
        logits = _shared_prompt_logits(model, batch, group_size)
    else:
        logits = _full_logits(model, batch)
    logits = logits.float() / temperature
    logz = logits.logsumexp(-1)  # (N, T)
    logprobs = logits.gather(-1, batch.response_ids[..., None]).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = logz - (logits.softmax(-1) * logits).sum(-1)
    return logprobs, entropy


def _full_logits(model: PreTrainedModel, batch: RolloutBatch) -> torch.Tensor:
    """(N, T, V) logits predicting each response token, from one forward over prompt+response.

    Only the last T+1 positions go through the LM head: the prompt's own logits are never needed.
    """
    t = batch.response_ids.shape[1]
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (N, P+T)
    attn = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attn,
        position_ids=prompt_positions(attn),
        logits_to_keep=t + 1,
    ).logits
    return logits[:, :-1]  # position P-1+t predicts response token t


def _shared_prompt_logits(model: PreTrainedModel, batch: RolloutBatch, g: int) -> torch.Tensor:
    """(N, T, V) logits predicting each response token, each group's prompt run once."""
    state = prefill(model, batch.prompt_ids, batch.prompt_mask, g)
    first = state.logits[:, None]  # (N, 1, V) predicts response token 0
    if batch.response_ids.shape[1] == 1:
        return first
    # Token t ≥ 1 is predicted by the forward at token t-1: feed all but the last token.
    attn = torch.cat([batch.prompt_mask, batch.response_mask[:, :-1].long()], dim=1)
    rest = extend(model, state, batch.response_ids[:, :-1], attn, offset=0)  # (N, T-1, V)
    return torch.cat([first, rest], dim=1)
