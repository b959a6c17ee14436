"""The training log-probs: the sampled tokens' log-probs under a policy, with or without grad.

``token_logprobs`` is the training-time forward over prompts and responses: through the
shared-prompt path of ``conspo.generation.forward`` (each group's prompt once, its KV cache
repeated G times) when the rows allow it, and a plain full forward otherwise. Values and
gradients are those of the full forward, for about 1/G of the prompt compute. It never holds the
(N, T, V) logits: the LM head runs on the decoder's hidden states a chunk of positions at a time
(``LOGIT_CHUNK_BYTES`` of float32 logits), each chunk recomputed in the backward rather than
kept. ``sequence_logprobs`` is the supervised kinds' (SFT, DPO): summed log-probs of labelled
tokens.

Shapes: N rollouts (rows grouped by prompt: G contiguous rows share one), P prompt positions,
T response positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from conspo.generation.batch import RolloutBatch
from conspo.generation.forward import extend_with, last_positions, prefill_with, prompt_positions
from conspo.models.resources import logit_chunk_tokens


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


def token_states(model: PreTrainedModel, batch: RolloutBatch, group_size: int = 1) -> torch.Tensor:
    """(N, T, H) the decoder's final hidden state before each response token (the state s_t
    that token t is chosen in, where a critic reads V(s_t)), through the same forward paths as
    ``token_logprobs``: each group's prompt once where the rows allow it."""
    shared = group_size > 1 and shares_prompts(batch, group_size) and not _drops_cache(model)
    outputs = _shared_prompt_outputs if shared else _full_outputs
    with _short_sequence_attention(model, batch):
        return outputs(model, batch, group_size, logits=False)


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


def _full_outputs(
    model: PreTrainedModel, batch: RolloutBatch, g: int, logits: bool
) -> torch.Tensor:
    """(N, T, ·) logits or hidden states predicting each response token, from one forward over
    prompt+response. Only the last T+1 positions are kept: the prompt's own are never needed."""
    t = batch.response_ids.shape[1]
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (N, P+T)
    attn = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    out = last_positions(model, logits, t + 1, input_ids=input_ids, attention_mask=attn,
               position_ids=prompt_positions(attn), use_cache=False)  # fmt: skip
    return out[:, :-1]  # position P-1+t predicts response token t


def _shared_prompt_outputs(
    model: PreTrainedModel, batch: RolloutBatch, g: int, logits: bool
) -> torch.Tensor:
    """(N, T, ·) logits or hidden states predicting each response token, each group's prompt
    run once."""
    forward = partial(last_positions, model, logits)
    state = prefill_with(forward, model.config, batch.prompt_ids, batch.prompt_mask, g)
    first = state.logits[:, None]  # (N, 1, ·) predicts response token 0
    t = batch.response_ids.shape[1]
    if t == 1:
        return first
    # Token t ≥ 1 is predicted by the forward at token t-1: feed all but the last token.
    attn = torch.cat([batch.prompt_mask, batch.response_mask[:, :-1].long()], dim=1)
    rest = extend_with(forward, state, batch.response_ids[:, :-1], attn, offset=0)  # (N, T-1, ·)
    return torch.cat([first, rest], dim=1)


def sequence_logprobs(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) summed log-probs of the labelled tokens of each row, and (B,) their count.

    ``ids``/``mask``/``labels`` are (B, L) right-padded; labels are -100 where not scored."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    scored = targets != -100
    logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return (logp * scored).sum(-1), scored.sum(-1)
