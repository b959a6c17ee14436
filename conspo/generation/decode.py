"""A decode step for Llama-family decoders, written against the model's own weights.

``conspo.generation.rollout.sample`` prefills the prompts with the model's own forward, then feeds
one token per step. Through transformers' forward, every one of those steps builds a 4-D attention
mask, grows each layer's KV cache by concatenation, and runs the CPU flash-attention kernel for
a single query. ``DecodeLoop`` does the same arithmetic with less around it:

* each layer's keys and values live in one buffer preallocated for every position and written
  in place, and attention reads only the positions written so far (transformers' own
  ``StaticCache`` attends over the whole buffer every token, which is why it did not pay);
* attention is two batched matmuls per layer, with the query heads of a grouped-query layer
  sharing their key/value head without a copy, and the softmax in float32 as transformers'
  eager attention computes it;
* q, k and v are one matmul, and so are the MLP's gate and up projections;
* the rotary tables (from the model's own ``rotary_emb``, so every rope scaling it knows is
  kept) and the padding bias are built once per call, not once per token;
* under autocast, the weights are cast to the compute dtype once per call, not once per matmul
  per token (autocast's weight-cast cache lives for one forward).

The fused matrices are a copy of the decoder's weights in the compute dtype, held while one
``sample`` call runs: 1x the model's bytes at float32 or bfloat16, 0.5x under bfloat16
autocast over float32 weights (``conspo.models.resources`` counts it).

It covers the decoders whose layer is exactly pre-norm RMSNorm, q/k/v/o attention with rotary
positions, RMSNorm, SiLU-gated MLP: Llama, Qwen2 and Mistral, with no sliding window in reach.
``DecodeLoop.supports`` says no to anything else (LoRA-wrapped or quantised projections, query
or key norms, other activations, sharded weights, dropout in training mode), and the sampler
keeps transformers' forward for those. Its logits agree with the model's own forward to float
rounding (tests/conspo/test_decode.py).

Shapes: N rows, P prompt positions, T = max_new_tokens, D head dim, KV key/value heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

# Model types whose decoder layer DecodeLoop reproduces (the module checks in ``supports`` make
# sure a given checkpoint has exactly that layer).
ARCHITECTURES = ("llama", "qwen2", "mistral")
LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj"}


def _plain_linear(module: object) -> bool:
    # exactly nn.Linear: a subclass (LoRA, quantised) computes more than weight @ x + bias
    return type(module) is nn.Linear


def _rms_norm(module: object) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def _sharded(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _norm_params(module: nn.Module) -> tuple[torch.Tensor, float]:
    """(weight, epsilon) of a transformers RMSNorm."""
    return cast(torch.Tensor, module.weight).detach(), float(cast(float, module.variance_epsilon))


@dataclass
class _Layer:
    input_norm: tuple[torch.Tensor, float]  # RMSNorm weight, epsilon
    post_attention_norm: tuple[torch.Tensor, float]
    qkv: tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias) of q, k, v side by side
    out: tuple[torch.Tensor, torch.Tensor | None]
    gate_up: tuple[torch.Tensor, torch.Tensor | None]  # gate, up side by side
    down: tuple[torch.Tensor, torch.Tensor | None]


class DecodeLoop:
    """One token per row per ``step``, after a prefill, for a model ``supports`` accepts."""

    @staticmethod
    def supports(model: nn.Module, total_len: int) -> bool:
        """Whether ``model`` is a decoder this loop reproduces for sequences of ``total_len``."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in ARCHITECTURES:
            return False
        if getattr(config, "hidden_act", None) != "silu":
            return False
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
        if (
            window is not None
            and window < total_len
            and (getattr(config, "use_sliding_window", True) or "sliding_attention" in layer_types)
        ):
            return False
        if model.training and float(getattr(config, "attention_dropout", 0) or 0):
            return False
        decoder = getattr(model, "model", None)
        if not isinstance(model, PreTrainedModel) or decoder is None:
            return False
        if not _plain_linear(model.get_output_embeddings()):
            return False
        if type(getattr(decoder, "embed_tokens", None)) is not nn.Embedding:
            return False
        if not _rms_norm(getattr(decoder, "norm", None)) or not hasattr(decoder, "rotary_emb"):
            return False
        for layer in decoder.layers:
            if set(dict(layer.named_children())) != LAYER_PARTS:
                return False
            attn, mlp = layer.self_attn, layer.mlp
            if set(dict(attn.named_children())) != ATTENTION_PARTS:
                return False
            if not (hasattr(attn, "head_dim") and hasattr(attn, "scaling")):
                return False
            linears = [getattr(attn, name) for name in sorted(ATTENTION_PARTS)]
            linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
            if not all(_plain_linear(m) for m in linears):
                return False
            if type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
                return False
            if not (_rms_norm(layer.input_layernorm) and _rms_norm(layer.post_attention_layernorm)):
                return False
        return not _sharded(model)

    def __init__(
        self,
        model: PreTrainedModel,
        cache: DynamicCache,
        prompt_mask: torch.Tensor,
        first_position: torch.Tensor,
        max_new_tokens: int,
    ) -> None:
        """``cache``: the prompts' keys and values from the prefill, one row per rollout;
        ``prompt_mask`` (N, P); ``first_position`` (N, 1): the position id of response token 0."""
        decoder = model.model
        config = model.config
        device = prompt_mask.device
        autocast = torch.is_autocast_enabled(device.type)
        self.embed = decoder.embed_tokens.weight.detach()
        # Linear layers compute in the autocast dtype, or the weights' own; the residual stream
        # stays in the weights' dtype, as it does through transformers' forward under autocast.
        self.compute = torch.get_autocast_dtype(device.type) if autocast else self.embed.dtype
        n, p = prompt_mask.shape
        self.prompt_len = p
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        attention = decoder.layers[0].self_attn
        self.head_dim: int = attention.head_dim
        self.scaling: float = attention.scaling

        self.layers = [
            _Layer(
                _norm_params(layer.input_layernorm),
                _norm_params(layer.post_attention_layernorm),
                self._fused(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                self._fused(layer.self_attn.o_proj),
                self._fused(layer.mlp.gate_proj, layer.mlp.up_proj),
                self._fused(layer.mlp.down_proj),
            )
            for layer in decoder.layers
        ]
        self.norm = _norm_params(decoder.norm)
        self.head = self._fused(model.get_output_embeddings())

        total = p + max_new_tokens
        shape = (n, self.kv_heads, total, self.head_dim)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for layer_cache in cache.layers:
            keys = torch.empty(shape, dtype=self.compute, device=device)
            values = torch.empty(shape, dtype=self.compute, device=device)
            keys[:, :, :p] = cast(torch.Tensor, getattr(layer_cache, "keys"))  # noqa: B009
            values[:, :, :p] = cast(torch.Tensor, getattr(layer_cache, "values"))  # noqa: B009
            self.keys.append(keys)
            self.values.append(values)
        # Additive bias over every position: padded prompt positions are never attended to.
        self.bias = torch.zeros(n, 1, 1, total, dtype=torch.float32, device=device)
        self.bias[..., :p].masked_fill_(prompt_mask[:, None, None, :] == 0, float("-inf"))
        # Rotary tables of every response position of every row, (N, T, D).
        positions = first_position + torch.arange(max_new_tokens, device=device)
        probe = torch.empty(1, dtype=torch.float32, device=device)
        with torch.autocast(device.type, enabled=False):
            cos, sin = decoder.rotary_emb(probe, positions)
        self.cos, self.sin = cos.to(self.compute), sin.to(self.compute)

    def _fused(self, *linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One matrix (and bias) for ``linears`` side by side, in the compute dtype."""
        weight = torch.cat([m.weight.detach() for m in linears]).to(self.compute)
        if all(m.bias is None for m in linears):
            return weight, None
        biases: list[torch.Tensor] = [
            m.weight.new_zeros(m.out_features) if m.bias is None else m.bias for m in linears
        ]
        return weight, torch.cat(biases).detach().to(self.compute)

    def _norm(self, norm: tuple[torch.Tensor, float], x: torch.Tensor) -> torch.Tensor:
        """transformers' RMSNorm: normalise in float32, back to the input's dtype, times the
        weight; then to the compute dtype for the next matmul."""
        weight, eps = norm
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return (weight * h.to(x.dtype)).to(self.compute)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """(N, V) float32 logits after feeding response token ``t`` (``tokens``, (N,))."""
        n = tokens.shape[0]
        column = self.prompt_len + t  # this token's place in the key/value buffers
        live = column + 1
        cos, sin = self.cos[:, t, None], self.sin[:, t, None]  # (N, 1, D)
        bias = self.bias[..., :live]
        group = self.heads // self.kv_heads
        kv_width = self.kv_heads * self.head_dim
        widths = (self.heads * self.head_dim, kv_width, kv_width)
        x = F.embedding(tokens, self.embed)  # (N, H), the weights' dtype
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            q, k, v = F.linear(self._norm(layer.input_norm, x), *layer.qkv).split(widths, dim=-1)
            k = k.view(n, self.kv_heads, self.head_dim)
            keys[:, :, column] = self._rotate(k, cos, sin)
            values[:, :, column] = v.view(n, self.kv_heads, self.head_dim)
            q = self._rotate(q.view(n, self.heads, self.head_dim), cos, sin)
            q = q.view(n, self.kv_heads, group, self.head_dim)  # heads sharing a k/v head
            # keys @ q rather than q @ keys^T: on a CPU the bfloat16 batched matmul copies a
            # transposed strided operand (the live slice of the buffer) every call
            scores = torch.matmul(keys[:, :, :live], q.transpose(-1, -2)).transpose(-1, -2)
            probs = torch.softmax(scores.float() * self.scaling + bias, dim=-1).to(self.compute)
            attended = torch.matmul(probs, values[:, :, :live]).reshape(n, -1)
            x = x + F.linear(attended, *layer.out)
            gate, up = F.linear(self._norm(layer.post_attention_norm, x), *layer.gate_up).chunk(
                2, -1
            )
            x = x + F.linear(F.silu(gate) * up, *layer.down)
        return F.linear(self._norm(self.norm, x), *self.head).float()
