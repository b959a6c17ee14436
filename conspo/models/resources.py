"""How much memory a run's config asks for, estimated from the config and the model's dimensions.

A worker refuses a config whose estimate exceeds its limit before it loads any weights, and the
platform's API does the same at submit time, so a config that cannot fit fails at once, with the
estimate in the message, instead of mid-run when an allocation fails or the machine swaps.
Torch-free: the API process imports it.

    dims = ModelDims.from_hf_config(json.loads(Path("my-model/config.json").read_text()))
    estimate = estimate_memory(cfg, dims, dtype_bytes=2)
    check_memory(estimate, limit=80 * 2**30)          # MemoryRefused: "needs about 275 GiB ..."
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conspo.access import ModelSource
from conspo.config import RunConfig
from conspo.models.catalog import BUILTIN_MODELS, builtin_hf_config
from conspo.registry import OBJECTIVES
from conspo.templates import render
from conspo.tools.base import tool_columns

Loc = tuple[str, ...]
MAX_CONFIG_JSON_BYTES = 2**20
FLOAT32 = 4
INT64 = 8
# Float32 logits the training forward holds at once (conspo.training.logprobs.token_logprobs
# applies the LM head to this many bytes' worth of positions at a time): 256 MiB, 441 positions of a
# 151,936 vocabulary.
LOGIT_CHUNK_BYTES = 2**28
# The process a run trains in, before any weights or step: the Python interpreter with torch,
# transformers and conspo's training modules imported and the tokenizer loaded. Measured as the
# resident memory of a fresh process on the development machine (CPU, GiB): python 0.01,
# + torch 0.22, + transformers 0.25, + conspo.training and the job kinds 0.38, + SmolLM2's
# tokenizer 0.42. The estimate counts it because a run's peak (``system/peak_rss_gib``) does:
# left out, a small run read 0.4 GiB low (issue 49's walk: 2.1-2.4x under on SmolLM2). On CUDA
# it stands for the CUDA context and kernels the device holds instead (not measured here).
PROCESS_BYTES = 430 * 2**20
# A supervised row's tokens from its text (``supervised_row_tokens``): a chat template's system
# message and role markers (SmolLM2's default frame is 30 tokens), and text at 3 characters a
# token (SmolLM2's tokenizer: 3.3 on reasoning_gym's gcd questions, 2.7 on basic_arithmetic, 2.5
# on their answers; digits are a token each, but short next to the frame), and the EOS.
CHAT_FRAME_TOKENS = 32
CHARS_PER_TOKEN = 3
# An sft row's prompt when the task's problems were not drawn to measure it (the API, which
# builds no task on a request thread): a question of 48 tokens (gcd's are up to 49, arith's 4).
DEFAULT_QUESTION_TOKENS = 48
DEFAULT_ANSWER_TOKENS = 8  # a final answer (gcd's are up to 8 tokens)
ROWS_MEASURED = 16  # problems drawn to measure a task's rows (the longest counts)


def logit_chunk_tokens(vocab: int) -> int:
    """Positions per LM-head chunk of the training forward for a ``vocab``-sized vocabulary."""
    return max(1, LOGIT_CHUNK_BYTES // (vocab * FLOAT32))


@dataclass(frozen=True)
class ModelDims:
    """What the estimate needs of a decoder-only transformer (Llama / Qwen2 / Mistral family)."""

    params: int  # parameter count
    layers: int  # L
    hidden: int  # H
    intermediate: int  # I, the MLP width
    kv_width: int  # K: key-value heads × head dim, the width of K (and of V) per token and layer
    vocab: int  # V

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelDims | None:
        """From a Hugging Face config.json; None when a dimension is missing or malformed."""
        try:
            layers, hidden, heads, vocab = (
                _positive(config, key)
                for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
            )
            head_dim = _positive(config, "head_dim", hidden // heads)
            kv_width = _positive(config, "num_key_value_heads", heads) * head_dim
            intermediate = _positive(config, "intermediate_size", 4 * hidden)
        except (KeyError, TypeError, ValueError):
            return None
        q_width = heads * head_dim
        # q, k, v, o projections, the gated MLP's three matrices, two RMSNorms
        per_layer = 2 * hidden * (q_width + kv_width) + 3 * hidden * intermediate + 2 * hidden
        if config.get("model_type") == "qwen2" or config.get("attention_bias"):
            per_layer += q_width + 2 * kv_width  # q, k, v biases
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
        params = embeddings + layers * per_layer + hidden  # + the final norm
        return cls(params, layers, hidden, intermediate, kv_width, vocab)


def _positive(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        return default
    if isinstance(value, bool) or int(value) != value or value <= 0:
        raise ValueError(key)
    return int(value)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part of a training step's peak (``estimate_memory`` says what each counts).

    The model state is held all run; the three transients happen one after another.
    """

    state: int
    sampling: int
    evaluation: int
    update: int
    micro_batch_tokens: int = 0  # the gradient pass's split the update assumes (0: none)
    process: int = PROCESS_BYTES  # the interpreter and its libraries, held all run
    # Asynchronous generation (sampling.max_staleness): the next steps' sampling runs while the
    # update does, so their transients add up (an evaluation still runs alone).
    overlapped: bool = False

    @property
    def total(self) -> int:
        step = self.sampling + self.update if self.overlapped else max(self.sampling, self.update)
        return self.process + self.state + max(step, self.evaluation)

    def describe(self) -> str:
        parts = {
            "process": self.process,
            "model state": self.state,
            "sampling": self.sampling,
            "evaluation": self.evaluation,
            "update": self.update,
        }
        listed = ", ".join(f"{part} {_size(n)}" for part, n in parts.items())
        if self.micro_batch_tokens:
            listed += f" in micro-batches of {self.micro_batch_tokens:,} tokens"
        return f"about {_size(self.total)} ({listed})"

    def culprit(self, limit: int) -> Loc:
        """The config field most to blame for exceeding ``limit``."""
        if self.process + self.state > limit:
            return ("model", "name")
        if self.evaluation > max(self.sampling, self.update):
            return ("eval",)
        return ("sampling",)


def _layer_activations(dims: ModelDims) -> int:
    """Elements per token that a decoder layer keeps for the backward pass: the input norm's input
    and output (2H), q, k, v (H+2K), the rotary q and k (H+K) and their rotate_half copies (H+K),
    the attention output and o_proj's contiguous input (2H), the residual sum (H), the
    post-attention norm (2H), and the gated MLP's gate, up, activation and product (4I). SDPA keeps
    no attention matrix."""
    return 10 * dims.hidden + 4 * dims.kv_width + 4 * dims.intermediate


def estimate_memory(
    cfg: RunConfig,
    dims: ModelDims,
    dtype_bytes: int,
    limit: int | None = None,
    task: Any = None,
    question_chars: int | None = None,
) -> MemoryEstimate:
    """Peak memory of a run of ``cfg`` on the device that trains it, in bytes: the process, the
    model state and a step's largest transient, its gradient pass split as
    ``planned_micro_batch_tokens`` (with ``limit``) splits it. ``task``: the run's task when
    built (a ``conspo.tasks.Task``, prompts not yet rendered), from which an sft step's rows are
    measured (``supervised_row_tokens``); else ``question_chars``, the longest question a check
    of the task drew (the API's task check), when known."""
    prompt = prompt_tokens(cfg, task, question_chars)
    planned = planned_micro_batch_tokens(cfg, dims, dtype_bytes, limit, prompt)
    rows = supervised_row_tokens(cfg, task, question_chars)
    return _estimate(cfg, dims, dtype_bytes, planned, rows, prompt)


# The gradient pass the automatic memory budget (optim.memory_budget 0) allows whatever sampling
# takes: splitting below it would cost passes (smaller forwards, and for an objective not linear
# on policy a no-grad forward over the mini-batch first, conspo.training.update.backward) to
# save memory no step needs. At SmolLM2-135M's shapes against TRL (bench/throughput.py) it gave
# peaks below TRL's at a step as fast as the unsplit one.
AUTO_GRAPH_BYTES = 2**30
GIB = 2**30


def _trains_critic(cfg: RunConfig) -> bool:
    """Whether the run's objective loads and trains a critic (``RegisteredObjective.critic``)."""
    name = cfg.algorithm
    return name is not None and name in OBJECTIVES.names() and OBJECTIVES.get(name).critic


def planned_micro_batch_tokens(
    cfg: RunConfig, dims: ModelDims, dtype_bytes: int, limit: int | None = None, prompt: int = 0
) -> int:
    """optim.micro_batch_tokens as a step of ``cfg`` runs it: the configured value when set;
    otherwise 0 (one gradient pass over the mini-batch) when that keeps the update within its
    allowance, else the largest token budget that does (at least max_new_tokens: one answer).

    The allowance: with optim.memory_budget, the budget less the process and the model state;
    automatic (0), the larger of sampling's and evaluation's transients and ``AUTO_GRAPH_BYTES``,
    and no more than ``limit`` (bytes a run may use here, when known) less those two. A budget
    no split meets gives the smallest split; ``check_memory`` / ``check_budget`` then refuse
    the config. The plan counts response tokens only, as the estimate does;
    ``conspo.training.microbatch`` counts prompt positions too, so its micro-batches hold fewer
    rows than planned, not more.
    """
    optim = cfg.optim
    if supervised_rows(cfg) is not None:
        return 0  # its step is one forward over its rows, never split
    if optim.micro_batch_tokens:
        return optim.micro_batch_tokens
    whole = _estimate(cfg, dims, dtype_bytes, 0, prompt=prompt)
    held = whole.process + whole.state
    if optim.memory_budget:
        allowed = int(optim.memory_budget * GIB) - held
    else:
        allowed = max(whole.sampling, whole.evaluation, AUTO_GRAPH_BYTES)
        if limit:
            allowed = min(allowed, limit - held)
    if whole.update <= allowed:
        return 0
    t = cfg.sampling.max_new_tokens
    rows = math.ceil(cfg.sampling.prompts_per_step * cfg.sampling.group_size / optim.mini_batches)
    low, high = t, rows * t  # the update grows with the budget: the largest one that fits
    if _estimate(cfg, dims, dtype_bytes, low).update > allowed:
        return low
    while high - low > 1:
        mid = (low + high) // 2
        if _estimate(cfg, dims, dtype_bytes, mid).update <= allowed:
            low = mid
        else:
            high = mid
    return low


def _estimate(
    cfg: RunConfig,
    dims: ModelDims,
    dtype_bytes: int,
    budget: int,
    row_tokens: int = 0,
    prompt: int = 0,
) -> MemoryEstimate:
    """Peak memory of a training step of ``cfg`` with micro-batches of ``budget`` tokens (0:
    one gradient pass), in bytes.

    b = ``dtype_bytes``, the compute dtype's (4 for float32, 2 for bfloat16 / float16); w, the
    weights' bytes: 4 under mixed precision (model.mixed_precision, always for float16), else b.
    P = ``dims.params``; A = the LoRA adapters' parameters (model.lora: r × (in + out) per adapted
    matrix); N = prompts_per_step × group_size rollouts, T = max_new_tokens, P = ``prompt``,
    the longest prompt's tokens (``prompt_tokens``), M =
    optim.mini_batches, B = ⌈N/M⌉; L, H, I, K, V as in ``ModelDims``. The training forward's
    tokens: B·T, or with micro-batches of m = ``budget`` > 0 tokens a micro-batch's, min(B·T,
    max(m, T));
    its logits: one chunk of C = min(tokens, ``logit_chunk_tokens(V)``) positions. Counted:

    * model state, held all run: full fine-tuning, the weights, their gradients and AdamW's two
      moments (4·P·w) and a frozen reference copy (P·w) when the objective's β > 0; LoRA, the
      frozen weights (P·w, also the reference: adapters off) and the adapters' float32 weights,
      gradients and moments (16·A); with resources.strategy fsdp over W = gpus × nodes > 1
      processes (conspo.distributed.collectives), the gathered weights every forward uses (P·w) and
      each process's shard of the weights, gradients and moments (4·P·w/W), plus the whole reference
      (P·w) when β > 0: it is not sharded; an objective with a critic (PPO) holds a second
      copy of the backbone trained the same way (LoRA: P·w + 16·A; else 4·P·w), counted at the
      policy's size whatever params.critic_model names; asynchronous generation
      (sampling.max_staleness k) holds k + 2 copies of the trainable weights (LoRA: 4·A each,
      else P·w) and k rollout batches (16·N·T each), and its sampling's transient adds to the
      update's instead of following it;
    * sampling a step's rollouts: the KV cache 2·(L+1)·N·K·(P+T)·b (one layer's cache is copied
      while it grows; ``conspo.generation.decode``'s preallocated one holds the prompt's P
      columns and T response columns, 2·L·N·K·(P+T)·b; rollouts that call tools hold
      ``conspo.tools.base.tool_columns(T)`` response columns),
      ``conspo.generation.decode``'s copy of the weights in the compute dtype (P·b), a step's logits
      and softmax N·V·(b+12), and the sampler's int64 attention mask, token ids and end-of-sequence
      masks (48·N·T);
    * evaluation: the same for eval_size × pass_k rollouts;
    * the update: the rollout batch 16·N·T (twice that when refilling groups), then the larger of
      - with M > 1, the no-grad forward that freezes π_old over all N rows (micro-batch by
        micro-batch): its KV cache and one layer's transients per token, (2LK+4I+4H)·b, one
        chunk of logits C·V·(b+8), and its log-probs and entropy 8·N·T;
      - the gradient pass over a micro-batch's tokens: the activations kept for backward, per
        token L·a·b with a = 10H+4K+4I (plus, with LoRA, each adapted projection's two
        output-wide tensors, the adapter's output and its scaled copy), or with gradient
        checkpointing each layer's input L·H·b plus one layer's recomputed activations and
        their gradients 2·a·b; the final hidden states H·b; one chunk of
        logits with its float32 copies C·V·(b+12); under mixed precision, full fine-tuning's
        half-precision copies of the weights autocast keeps (P·b); with micro-batches, the
        mini-batch's log-probs, entropy and their gradient 16·B·T; the reference model's
        no-grad forward over the same tokens when β > 0; and with fsdp the gathered gradient
        the backwards accumulate before one reduce-scatter per update (P·w).

    Counted apart (``MemoryEstimate.process``): the process itself, ``PROCESS_BYTES``.

    Not counted: prompt tokens in the update (T counts the response only there), allocator
    slack, and attention score matrices (SDPA kernels do not keep them; a CPU's short
    training forwards run eager attention, which keeps up to
    ``conspo.training.logprobs.EAGER_ATTENTION_BYTES``). So it is near the real peak of a step
    whose answers all run to ``max_new_tokens``: a config refused by it does not fit. A step of
    shorter answers peaks lower (the gradient pass runs on length buckets,
    ``conspo.training.microbatch.length_buckets``). tests/conspo/test_resources.py compares a
    step's part with the measured growth of a CPU run, bench/memory_estimate.py the whole with
    the peak RSS of SmolLM2 runs of each kind.
    """
    b, s, m = dtype_bytes, cfg.sampling, cfg.model
    mixed = b < FLOAT32 and (m.mixed_precision or m.dtype == "float16")
    w = FLOAT32 if mixed else b
    supervised = supervised_rows(cfg)
    if supervised is not None:
        rows, reference = supervised
        tokens = rows * (row_tokens or cfg.sampling.max_new_tokens)
        return _supervised_estimate(cfg, dims, b, w, mixed, tokens, reference, prompt)
    params = cfg.objective_params()
    beta = float(getattr(params, "beta", 0.0))
    kl_in_reward = float(getattr(params, "kl_in_reward", 0.0))
    # A frozen copy of the weights (full fine-tuning): the KL's reference, or RRPO's anchors'
    # (they read the reference's hidden states).
    name = cfg.algorithm
    anchored = name is not None and name in OBJECTIVES.names() and OBJECTIVES.get(name).anchors
    reference = beta > 0 or kl_in_reward > 0 or anchored
    refill = bool(getattr(params, "refill_groups", False))
    n, t = s.prompts_per_step * s.group_size, s.max_new_tokens
    rows = math.ceil(n / cfg.optim.mini_batches)
    tokens = min(rows * t, max(budget, t)) if budget else rows * t
    world = cfg.resources.world_size
    sharded = cfg.resources.strategy == "fsdp" and world > 1 and not m.lora.rank
    if m.lora.rank:
        adapters = lora_params(dims, m.lora.rank, m.lora.target_modules)
        state = dims.params * w + 4 * FLOAT32 * adapters
    elif sharded:
        state = dims.params * w * (1 + (1 if reference else 0)) + math.ceil(
            4 * dims.params * w / world
        )
    else:
        state = dims.params * w * (5 if reference else 4)
    if _trains_critic(cfg):
        # its own copy of the backbone, trained as the policy is (LoRA or whole); its gradient
        # pass runs after the policy's, so the update's transient is the larger of the two,
        # which the policy's (with the LM head's logits) is
        state += dims.params * w + (4 * FLOAT32 * adapters if m.lora.rank else 3 * dims.params * w)
    k = s.max_staleness
    if k:
        # conspo.training.pipeline: the generating copy's trainable tensors and up to k + 1
        # published versions of them, and the k batches generated ahead
        trainable = 4 * adapters if m.lora.rank else dims.params * w
        state += (k + 2) * trainable + k * 16 * n * t
    # Rollouts that call tools hold more columns while they sample: room for the ones a row
    # leaves empty while its call runs (conspo.generation.tool_rollout).
    columns = prompt + (tool_columns(t) if cfg.tools.names else t)
    evaluation = _sampling(dims, cfg.task.eval_size * cfg.eval.pass_k, columns, b)
    batch = 16 * n * t * (2 if refill else 1)
    freeze_old = 0
    # π_old frozen before the first update; the KL in the reward reads it (and π_ref) first too
    if cfg.optim.mini_batches * cfg.optim.epochs > 1 or kl_in_reward > 0:
        freeze_old = _no_grad_forward(dims, min(n * t, budget or n * t), b) + 2 * n * t * FLOAT32
    layer = _layer_activations(dims)
    if m.lora.rank:
        layer += 2 * _adapted_widths(dims, m.lora.target_modules)[1]
    if m.gradient_checkpointing:
        kept = dims.layers * dims.hidden + 2 * layer
    else:
        kept = dims.layers * layer
    chunk = min(tokens, logit_chunk_tokens(dims.vocab))
    grad_pass = tokens * (kept + dims.hidden) * b + chunk * dims.vocab * (b + 3 * FLOAT32)
    if mixed and not m.lora.rank:
        grad_pass += dims.params * b
    if tokens < rows * t:
        grad_pass += 4 * rows * t * FLOAT32
    if beta > 0:
        grad_pass += _no_grad_forward(dims, tokens, b)
    if sharded:
        grad_pass += dims.params * w
    update = batch + max(freeze_old, grad_pass)
    sampling = _sampling(dims, n, columns, b)
    return MemoryEstimate(state, sampling, evaluation, update, budget, overlapped=k > 0)


def supervised_rows(cfg: RunConfig) -> tuple[int, bool] | None:
    """For a kind that trains on given text rather than on rollouts it samples: the rows one
    step's forward holds and whether a reference forward scores them too; None for the others
    (rl, distill: their step samples, as ``_estimate`` counts). sft: kind_params.batch_size
    examples; dpo: a chosen and a rejected answer per pair, scored by the reference too; kto:
    batch_size completions, scored by the reference too (its mismatched pairs' forwards, no
    grad, end before the update's begins)."""
    if cfg.kind not in SUPERVISED_KINDS:
        return None
    batch = int(getattr(cfg.job_params(), "batch_size", 1))
    return {"dpo": (2 * batch, True), "kto": (batch, True)}.get(cfg.kind, (batch, False))


SUPERVISED_KINDS = ("sft", "dpo", "kto")


def prompt_tokens(cfg: RunConfig, task: Any = None, question_chars: int | None = None) -> int:
    """Tokens of the longest prompt a run of ``cfg`` renders: the chat template's frame, its
    prompt template and the question. Sampling and evaluation hold a key and value for each of
    them beside every answer's (``conspo.generation.decode``'s buffers are prompt + response
    columns wide): issue 49's walk, SmolLM2 with its chat template on gcd, had 80-token prompts
    beside 128-token answers, and an evaluation estimated without them peaked 1.5x above it.

    With ``task`` (built: the worker) the longest of ``ROWS_MEASURED`` training problems drawn
    as the probe draws them is measured, in characters turned to tokens (``CHARS_PER_TOKEN``;
    no tokenizer is loaded before the estimate); without (the API) the longest question its
    task check drew (``question_chars``) or, not checked, one of ``DEFAULT_QUESTION_TOKENS``."""
    frame = chat_frame_tokens(cfg)
    if task is None:
        if question_chars is None:
            return frame + DEFAULT_QUESTION_TOKENS
        template = len(render(cfg.prompt.text(), {"question": ""}))
        return frame + math.ceil((template + question_chars) / CHARS_PER_TOKEN)
    drawn = task.train_prompts(random.Random(0), ROWS_MEASURED)
    longest = max((len(render(cfg.prompt.text(), {"question": ex.prompt})) for ex in drawn),
                  default=0)  # fmt: skip
    return frame + math.ceil(longest / CHARS_PER_TOKEN)


def chat_frame_tokens(cfg: RunConfig) -> int:
    """The chat template's frame around a prompt (its system message and role markers): none
    with prompt.chat_template off, or auto on a built-in tiny model (a character tokenizer
    without a chat template); else ``CHAT_FRAME_TOKENS`` and the system message's tokens."""
    chat = cfg.prompt.chat_template
    builtin = BUILTIN_MODELS.get(cfg.model.name)
    if chat == "off" or (chat == "auto" and builtin is not None and builtin.family == "tiny"):
        return 0
    return CHAT_FRAME_TOKENS + (len(cfg.prompt.system or "") + 1) // CHARS_PER_TOKEN


def supervised_row_tokens(
    cfg: RunConfig, task: Any = None, question_chars: int | None = None
) -> int:
    """Tokens of the longest row of a supervised step of ``cfg``; 0 where rows are not sized
    here (an RL kind, or rows read from kind_params.path or built as tool traces: the estimate
    takes sampling.max_new_tokens for them, which a config sets near their length).

    An sft step on the task's own problems trains on the prompt as the run renders it (its
    prompt template, the chat template's frame) and the target (kind_params.target holding the
    reference answer), then EOS. With ``task`` (built: the worker) the longest of
    ``ROWS_MEASURED`` training problems drawn as the probe draws them is measured, in characters
    turned to tokens (``CHARS_PER_TOKEN``); without (the API) the prompt as ``prompt_tokens``
    takes it and an answer of ``DEFAULT_ANSWER_TOKENS``.
    Never sampling.max_new_tokens: it bounds what evaluation writes, not these rows (issue 49:
    a default of 16 sized a 76-token row)."""
    if cfg.kind != "sft":
        return 0
    params = cfg.job_params()
    if getattr(params, "path", None) is not None or getattr(params, "tool", None) is not None:
        return 0
    target = str(getattr(params, "target", "{answer}"))
    if task is None:
        wrapper = math.ceil(len(target.replace("{answer}", "")) / CHARS_PER_TOKEN)
        return prompt_tokens(cfg, None, question_chars) + wrapper + DEFAULT_ANSWER_TOKENS + 1
    frame = CHAT_FRAME_TOKENS + (len(cfg.prompt.system or "") + 1) // CHARS_PER_TOKEN
    drawn = task.train_prompts(random.Random(0), ROWS_MEASURED)
    longest = max(
        (
            len(render(cfg.prompt.text(), {"question": ex.prompt}))
            + len(render(target, {"answer": str(ex.answer)}))
            for ex in drawn
        ),
        default=0,
    )
    return frame + math.ceil(longest / CHARS_PER_TOKEN) + 1


def _supervised_estimate(
    cfg: RunConfig,
    dims: ModelDims,
    b: int,
    w: int,
    mixed: bool,
    tokens: int,
    reference: bool,
    prompt: int = 0,
) -> MemoryEstimate:
    """Peak memory of a step of a kind that trains on given rows (``supervised_rows``), in
    bytes: ``tokens`` = R rows × T tokens each, T the longest row (``supervised_row_tokens``, or
    where rows come from a file, sampling.max_new_tokens: set it near the rows' length), other
    symbols as in ``_estimate``. Counted:

    * model state as for RL without a reference (4·P·w, or LoRA's P·w + 16·A), plus a frozen
      copy of the weights (P·w) when the kind scores a reference without LoRA (dpo);
    * no sampling: the step samples nothing (tool traces' calls run in the sandbox's processes);
    * evaluation as for RL;
    * the update: one forward with gradients over all R·T tokens, its activations as in
      ``_estimate`` and its logits whole (``conspo.training.sft.answer_loss`` and
      ``conspo.training.logprobs.sequence_logprobs`` take the log-softmax of every position at
      once: no chunks), R·T·V·(b+12); the mixed-precision weight copies (P·b); and with a
      reference, its no-grad forward over the same tokens, logits whole, held beside the graph.
    """
    m = cfg.model
    if m.lora.rank:
        state = dims.params * w + 4 * FLOAT32 * lora_params(
            dims, m.lora.rank, m.lora.target_modules
        )
    else:
        state = dims.params * w * (5 if reference else 4)
    columns = prompt + (
        tool_columns(cfg.sampling.max_new_tokens)
        if cfg.tools.names
        else cfg.sampling.max_new_tokens
    )
    evaluation = _sampling(dims, cfg.task.eval_size * cfg.eval.pass_k, columns, b)
    layer = _layer_activations(dims)
    if m.lora.rank:
        layer += 2 * _adapted_widths(dims, m.lora.target_modules)[1]
    kept = (
        dims.layers * dims.hidden + 2 * layer if m.gradient_checkpointing else dims.layers * layer
    )
    update = tokens * (kept + dims.hidden) * b + tokens * dims.vocab * (b + 3 * FLOAT32)
    if mixed and not m.lora.rank:
        update += dims.params * b
    if reference:
        per_token = 2 * dims.layers * dims.kv_width + 4 * (dims.intermediate + dims.hidden)
        update += tokens * per_token * b + tokens * dims.vocab * (b + 2 * FLOAT32)
    return MemoryEstimate(state, 0, evaluation, update, 0)


def lora_params(dims: ModelDims, rank: int, targets: list[str]) -> int:
    """Parameters of rank-``rank`` adapters on ``targets`` (["all-linear"] or module names)."""
    return rank * _adapted_widths(dims, targets)[0] * dims.layers


def _adapted_widths(dims: ModelDims, targets: list[str]) -> tuple[int, int]:
    """(Σ in + out, Σ out) over a layer's projections that get adapters. A name outside the
    Llama/Qwen2 family's counts as every projection: an upper bound."""
    h, k, i = dims.hidden, dims.kv_width, dims.intermediate
    shapes = {  # (in, out); q and o are taken as H wide
        "q_proj": (h, h), "k_proj": (h, k), "v_proj": (h, k), "o_proj": (h, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }  # fmt: skip
    names = set(shapes) if any(name not in shapes for name in targets) else set(targets)
    return (
        sum(shapes[n][0] + shapes[n][1] for n in names),
        sum(shapes[n][1] for n in names),
    )


def _no_grad_forward(dims: ModelDims, tokens: int, b: int) -> int:
    """A forward without gradients over ``tokens`` tokens: the KV cache it fills, one layer's
    MLP and attention transients, and one chunk of logits with its float32 copies."""
    per_token = 2 * dims.layers * dims.kv_width + 4 * (dims.intermediate + dims.hidden)
    chunk = min(tokens, logit_chunk_tokens(dims.vocab))
    return tokens * per_token * b + chunk * dims.vocab * (b + 2 * FLOAT32)


def _sampling(dims: ModelDims, n: int, t: int, b: int) -> int:
    kv_cache = 2 * (dims.layers + 1) * n * dims.kv_width * t * b
    decode_weights = dims.params * b  # conspo.generation.decode.DecodeLoop's fused copy
    logits = n * dims.vocab * (b + 3 * FLOAT32)
    bookkeeping = 6 * INT64 * n * t
    return kv_cache + decode_weights + logits + bookkeeping


class MemoryRefused(ValueError):
    """A config whose estimated memory exceeds the limit; ``loc`` is the field to change."""

    def __init__(self, message: str, loc: Loc) -> None:
        super().__init__(message)
        self.loc = loc


def check_memory(estimate: MemoryEstimate, limit: int) -> None:
    """Raise ``MemoryRefused`` when ``estimate`` exceeds ``limit`` bytes."""
    if estimate.total <= limit:
        return
    raise MemoryRefused(
        f"this config needs {estimate.describe()} of memory, over the {_size(limit)} a run may"
        " use here: lower sampling.prompts_per_step, sampling.group_size or"
        " sampling.max_new_tokens, raise optim.mini_batches, set optim.memory_budget or"
        " optim.micro_batch_tokens,"
        " model.gradient_checkpointing or model.lora.rank, or pick a smaller model",
        estimate.culprit(limit),
    )


def check_budget(estimate: MemoryEstimate, cfg: RunConfig) -> None:
    """Raise ``MemoryRefused`` at optim.memory_budget when ``estimate`` (of ``cfg``, split as
    planned) exceeds it: no split of the gradient pass fits, or another phase does not."""
    budget = cfg.optim.memory_budget * GIB  # a float: 1e-12 GiB is a budget too, not "none"
    if not cfg.optim.memory_budget or estimate.total <= budget:
        return
    raise MemoryRefused(
        f"this config needs {estimate.describe()} of memory even with the gradient pass in"
        f" micro-batches of {cfg.sampling.max_new_tokens} tokens, over optim.memory_budget's"
        f" {_size(int(budget))}: raise it, or lower sampling.prompts_per_step,"
        " sampling.group_size or sampling.max_new_tokens, turn on"
        " model.gradient_checkpointing or model.lora.rank, or pick a smaller model",
        ("optim", "memory_budget"),
    )


class OutOfMemory(RuntimeError):
    """A training step ran out of device memory (the trainer raises it from the allocator's
    error); the message says what the run was estimated to need and what to change."""


def out_of_memory_message(
    estimate: MemoryEstimate | None, capacity: int, cfg: RunConfig, cause: str = ""
) -> str:
    """One line: the allocator's own words (``cause``), the estimate, and each setting that
    lowers the peak with its current value."""
    needs = "was not estimated" if estimate is None else f"needs {estimate.describe()}"
    m, s = cfg.model, cfg.sampling
    said = f" ({cause})" if cause else ""
    return (
        f"out of device memory{said}: the device has {_size(capacity)}, this config {needs}."
        " Lower it"
        f" with optim.memory_budget (now {_budget(cfg)}),"
        f" optim.micro_batch_tokens (now {cfg.optim.micro_batch_tokens}; 0 is off),"
        f" model.gradient_checkpointing (now {str(m.gradient_checkpointing).lower()}),"
        f" model.lora.rank (now {m.lora.rank}; 0 trains every weight), optim.mini_batches (now"
        f" {cfg.optim.mini_batches}) or sampling.prompts_per_step / group_size / max_new_tokens"
        f" (now {s.prompts_per_step} / {s.group_size} / {s.max_new_tokens})"
    )


def _budget(cfg: RunConfig) -> str:
    budget = cfg.optim.memory_budget
    return f"{budget:g} GiB" if budget else "0: automatic"


def dtype_bytes(dtype: str, device: str) -> int:
    """Bytes per parameter of ``model.dtype`` on ``device`` ("auto" follows conspo.models.store.
    pick_device: float32 on CPU, bfloat16 on CUDA; an undecided device counts the smaller)."""
    if dtype == "float32" or (dtype == "auto" and device == "cpu"):
        return 4
    return 2


# --------------------------------------------------------------------------------------------
# Dimensions of a model without loading it
# --------------------------------------------------------------------------------------------


def read_hf_config(directory: Path) -> dict[str, Any] | None:
    """``directory``/config.json, read with a bound; None when missing or not a JSON object."""
    try:
        with (directory / "config.json").open("rb") as f:
            data = f.read(MAX_CONFIG_JSON_BYTES + 1)
        config = json.loads(data) if len(data) <= MAX_CONFIG_JSON_BYTES else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def source_dims(source: ModelSource) -> ModelDims | None:
    """Dimensions of a model from its config.json alone: a built-in's from the catalogue, a local
    directory's from its file, a hub id's from the local Hugging Face cache (None if not there)."""
    if source.kind == "builtin":
        config: dict[str, Any] | None = builtin_hf_config(source.name)
    elif source.path is not None:
        config = read_hf_config(source.path)
    else:
        config = _cached_hub_config(source.name)
    return ModelDims.from_hf_config(config) if config else None


def _cached_hub_config(hub_id: str) -> dict[str, Any] | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(hub_id, "config.json")
    return read_hf_config(Path(found).parent) if isinstance(found, str) else None


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"
