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
  per token (autocast's weight-cast cache lives for one forward);
* finished rows leave the batch: once a quarter of the rows still in it have ended their answer,
  their keys, values and tables are dropped (``COMPACT_WHEN``), so a step costs about the rows
  still answering, not every row until the longest answer ends. A finished row's logits are
  returned as zeros (the sampler draws padding for it whatever they are).

The fused matrices are a copy of the decoder's weights in the compute dtype, held while one
``sample`` call runs: 1x the model's bytes at float32 or bfloat16, 0.5x under bfloat16
autocast over float32 weights (``conspo.models.resources`` counts it).

It covers the decoders whose layer is exactly pre-norm RMSNorm, q/k/v/o attention with rotary
positions, RMSNorm, SiLU-gated MLP: Llama, Qwen2 and Mistral, with no sliding window in reach.
Projections wrapped by peft's plain LoRA are taken as their merged weight W + Σ s·B·A, computed
once per call (the adapters change every optimiser step, a call samples one step's rollouts);
that is the same function as peft's side path x·Wᵀ + s·(x·Aᵀ)·Bᵀ, to float rounding.
``DecodeLoop.supports`` says no to anything else (LoRA variants such as DoRA, LoRA dropout in
training mode, quantised projections, query or key norms, other activations, sharded weights,
attention dropout in training mode), and the sampler keeps transformers' forward for those. Its
logits agree with the model's own forward to float rounding (tests/conspo/test_decode.py).

Shapes: N rows, P prompt positions, T = max_new_tokens, D head dim, KV key/value heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from conspo import stopping

# Model types whose decoder layer DecodeLoop reproduces (the module checks in ``supports`` make
# sure a given checkpoint has exactly that layer).
ARCHITECTURES = ("llama", "qwen2", "mistral")
LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj"}
# Finished rows are dropped from the buffers once they are this share of the rows still in them:
# a compaction copies every live row's keys and values once, so it waits until it saves that.
COMPACT_WHEN = 0.25


def _plain_linear(module: object) -> bool:
    # exactly nn.Linear: a subclass (quantised, …) computes more than weight @ x + bias
    return type(module) is nn.Linear


def _plain_lora(module: object) -> bool:
    """peft's LoRA ``Linear`` over an exact nn.Linear, whose active adapters are plain LoRA (no
    DoRA or other variant) with no dropout that acts: its output is x·(W + Σ s·B·A)ᵀ + b."""
    if type(module).__module__ != "peft.tuners.lora.layer" or type(module).__name__ != "Linear":
        return False
    lora: Any = module  # peft's layer: its adapter dicts are attributes mypy cannot see
    if not _plain_linear(getattr(lora, "base_layer", None)):
        return False
    active = [a for a in getattr(lora, "active_adapters", []) if a in lora.lora_A]
    if getattr(lora, "lora_variant", {}) and any(a in lora.lora_variant for a in active):
        return False
    for adapter in active:
        dropout = lora.lora_dropout[adapter]
        if lora.training and isinstance(dropout, nn.Dropout) and dropout.p > 0:
            return False
    return True


def _linear(module: object) -> bool:
    """A projection DecodeLoop can take as one weight and bias."""
    return _plain_linear(module) or _plain_lora(module)


def _weight_and_bias(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (out, in) weight and bias that ``module`` (``_linear``) applies, detached; a LoRA
    projection's weight is merged with its active adapters (unless peft has merged them
    already, or they are disabled)."""
    if _plain_linear(module):
        return module.weight.detach(), None if module.bias is None else module.bias.detach()
    base = cast(nn.Linear, module.base_layer)
    weight = base.weight.detach()
    if not (module.merged or module.disable_adapters):
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                delta = module.get_delta_weight(adapter).detach()
                weight = weight + delta.to(weight.dtype)
    return weight, None if base.bias is None else base.bias.detach()


def _unwrapped(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft ``PeftModel`` (its layers hold the adapters)."""
    if type(model).__module__.startswith("peft.") and hasattr(model, "get_base_model"):
        return cast(nn.Module, model.get_base_model())  # type: ignore[operator]
    return model


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
        model = _unwrapped(model)
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
        if not _linear(model.get_output_embeddings()):
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
            if not all(_linear(m) for m in linears):
                return False
            if type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
                return False
            if not (_rms_norm(layer.input_layernorm) and _rms_norm(layer.post_attention_layernorm)):
                return False
        return not _sharded(model)

    def __init__(
        self,
        model: nn.Module,
        cache: DynamicCache,
        prompt_mask: torch.Tensor,
        first_position: torch.Tensor,
        max_new_tokens: int,
        rotary_table: bool = True,
    ) -> None:
        """``cache``: the prompts' keys and values from the prefill, one row per rollout;
        ``prompt_mask`` (N, P); ``first_position`` (N, 1): the position id of response token 0;
        ``max_new_tokens``: the response columns the buffers hold. ``rotary_table``: build the
        rotary tables of every response position up front, for ``step``; a caller that feeds
        its own positions (``step_at``) needs none."""
        model = cast(PreTrainedModel, _unwrapped(model))
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
        self.rotary_emb = decoder.rotary_emb
        # Rotary tables of every response position of every row, (N, T, D).
        width = max_new_tokens if rotary_table else 1
        self.cos, self.sin = self.rotary(first_position + torch.arange(width, device=device))
        self.rows_in_batch = n
        self.rows = torch.arange(n, device=device)  # which row each buffer row is

    def drop_finished(self, done: torch.Tensor) -> None:
        """Drop the rows ``done`` (N,) bool marks from the buffers, once they are at least
        ``COMPACT_WHEN`` of the rows still there (a host sync: call it every few tokens)."""
        keep = (~done[self.rows]).nonzero().squeeze(1)
        kept, held = len(keep), len(self.rows)
        if kept == 0 or held - kept < COMPACT_WHEN * held:
            return
        self.keys = [k.index_select(0, keep) for k in self.keys]
        self.values = [v.index_select(0, keep) for v in self.values]
        self.bias, self.cos, self.sin = (
            x.index_select(0, keep) for x in (self.bias, self.cos, self.sin)
        )
        self.rows = self.rows.index_select(0, keep)

    def _fused(self, *linears: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One matrix (and bias) for ``linears`` side by side, in the compute dtype."""
        stopping.check()  # building a step's fused weights took ~2 s loaded: a cancel lands here
        parts = [_weight_and_bias(m) for m in linears]
        weight = torch.cat([w for w, _ in parts]).to(self.compute)
        if all(b is None for _, b in parts):
            return weight, None
        biases = [w.new_zeros(w.shape[0]) if b is None else b for w, b in parts]
        return weight, torch.cat(biases).to(self.compute)

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

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of the model's own rotary embedding at ``positions`` (R, K): (R, K, D)."""
        probe = torch.empty(1, dtype=torch.float32, device=positions.device)
        with torch.autocast(positions.device.type, enabled=False):
            cos, sin = self.rotary_emb(probe, positions)
        return cos.to(self.compute), sin.to(self.compute)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """(N, V) float32 logits after feeding response token ``t`` (``tokens``, (N,)); zeros
        for the rows ``drop_finished`` has dropped."""
        cos, sin = self.cos[:, t, None], self.sin[:, t, None]  # (N, 1, D)
        return self.step_at(tokens, t, cos, sin)

    @torch.no_grad()
    def step_at(
        self, tokens: torch.Tensor, t: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """``step`` with the rotary (cos, sin) of each row's token given, (R, 1, D) for the R
        rows still in the buffers: for callers whose rows' positions do not advance with the
        column ``t`` (a row waiting for a tool's output leaves its columns empty)."""
        compacted = len(self.rows) < self.rows_in_batch
        if compacted:
            tokens = tokens.index_select(0, self.rows)
        n = tokens.shape[0]
        column = self.prompt_len + t  # this token's place in the key/value buffers
        live = column + 1
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
        logits = F.linear(self._norm(self.norm, x), *self.head).float()
        if not compacted:
            return logits
        every_row = logits.new_zeros(self.rows_in_batch, logits.shape[1])
        return every_row.index_copy_(0, self.rows, logits)
