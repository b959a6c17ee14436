"""Policies and where they come from: the built-in `tiny` family and a local model store.

`tiny` is a small Qwen2-architecture model (``Qwen2ForCausalLM``) with a character-level
tokenizer, both in the standard Hugging Face format (``save_pretrained`` / ``from_pretrained``),
so TRL and anything else that reads HF checkpoints can use them.
The warm-started ones (`tiny-arith`, ...) are `tiny` after a short SFT warm start on a task
(conspo/training/sft.py), so RL starts from a policy that is right part of the time. What each
built-in name is and its recipe are in conspo/models/catalog.py.

    store = ModelStore()                      # $CONSPO_MODEL_STORE or ~/.cache/conspo/models
    path = store.resolve("tiny-arith")        # built once, then reused by every run
    model, tokenizer, device, dtype = load_policy(cfg.model, store)

Other names load from a local directory or the hub; a store made with
``ModelStore(root, ModelSources(roots=..., hub_allow=...))`` admits only those its sources allow
(conspo.access: a worker passes its operator's), and refuses any other before transformers runs.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from conspo.access import ModelSources, Unavailable, hub_offline
from conspo.config import ModelConfig, TaskConfig
from conspo.models.catalog import (
    BOS,
    BUILTIN_MODELS,
    CHARSET,
    EOS,
    MAX_POSITIONS,
    PAD,
    SPECIAL_TOKENS,
    TINY_CONFIG,
    UNK,
)
from conspo.models.resources import ModelDims, host_memory_bytes

# Bumped whenever what the store builds changes (architecture, tokenizer, SFT recipe): a store
# directory built under another version is rebuilt on its next resolve(). 2: Qwen2, byte-level
# character tokenizer, SFT lr 1e-3 (1: Qwen3, WordLevel tokenizer, SFT lr 5e-3).
STORE_VERSION = 2
MARKER = "BUILT_BY_CONSPO"

# --------------------------------------------------------------------------------------------
# The tiny family
# --------------------------------------------------------------------------------------------


def build_char_tokenizer() -> Qwen2Tokenizer:
    """A character tokenizer: one token per character of CHARSET, plus <pad> <eos> <bos> <unk>.

    It is a Qwen2Tokenizer (byte-level BPE) whose vocabulary is the byte-level image of CHARSET
    and which has no merges, so every character, spaces and newlines included, is its own token.
    Why this form: for a ``model_type: qwen2`` checkpoint, transformers 5 ``AutoTokenizer``
    always instantiates ``Qwen2Tokenizer`` (``qwen2`` is in
    ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``, transformers/models/auto/tokenization_auto.py,
    which overrides any ``tokenizer_class`` in tokenizer_config.json), and ``Qwen2Tokenizer``
    rebuilds its pipeline (NFC, Qwen2 split regex, ByteLevel, BPE without unk) from the vocab and
    merges of tokenizer.json alone. A WordLevel tokenizer with a plain " " / "\\n" vocab loses
    those characters on reload; a vocab written in byte-level form survives it exactly.

    No BOS/EOS is added on encode (prompts are plain text such as "12+7="); the trainer appends
    EOS to SFT targets and stops sampling at EOS. Padding is on the left for generation.
    Characters outside CHARSET have no token and are dropped (no task produces them).
    """
    byte_char = bytes_to_unicode()
    tokens = SPECIAL_TOKENS + [byte_char[ord(c)] for c in CHARSET]
    return Qwen2Tokenizer(
        vocab={tok: i for i, tok in enumerate(tokens)},
        merges=[],
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=MAX_POSITIONS,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, seed: int = 0, dims: dict[str, Any] | None = None
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 decoder for ``tokenizer``, of ``dims`` (Qwen2Config fields;
    default TINY_CONFIG, ~0.6M parameters) sized for CPU experiments."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **(TINY_CONFIG if dims is None else dims),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny(out: Path, seed: int = 0) -> None:
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed).save_pretrained(out)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------------------------
# The model store
# --------------------------------------------------------------------------------------------


class ModelStore:
    """A directory of built models, one sub-directory per name, each built at most once.

    Builds run under an exclusive file lock and land in a temp dir that is renamed into place,
    so two worker processes resolving the same name never build it twice or see half a model.
    """

    def __init__(self, root: str | Path | None = None, sources: ModelSources | None = None) -> None:
        """``sources``: where other models may load from (default: any directory, any hub id)."""
        root = root or os.environ.get("CONSPO_MODEL_STORE") or "~/.cache/conspo/models"
        self.root = Path(root).expanduser()
        self.sources = sources or ModelSources()

    def builtin_names(self) -> list[str]:
        return list(BUILTIN_MODELS)

    def resolve(self, name: str) -> Path | str:
        """Local path of a built-in or local model; a hub id is returned as is (cached or not).

        A name ``sources`` does not admit raises ``Unavailable`` here, before transformers sees it.
        """
        source = self.sources.locate(name)
        if source.kind == "builtin":
            return self._builtin(name)
        return source.path or name  # a hub id: from_pretrained decides whether it is cached

    def _builtin(self, name: str) -> Path:
        entry = BUILTIN_MODELS[name]
        if entry.family == "tiny-chat":
            return self._builtin_chat(name)
        if entry.base is None:
            return self._build_once(name, lambda out: save_tiny(out))
        base = self._builtin(entry.base)
        tasks = [TaskConfig.model_validate(t) for t in entry.warm_start]
        return self._build_once(name, lambda out: _warm_start(base, tasks, entry.sft_steps, out))

    def _builtin_chat(self, name: str) -> Path:
        from conspo.models.tiny_chat import save_tiny_chat, warm_start_chat

        entry = BUILTIN_MODELS[name]
        if entry.base is None:
            return self._build_once(name, lambda out: save_tiny_chat(out))
        base = self._builtin(entry.base)
        return self._build_once(name, lambda out: warm_start_chat(base, out, steps=entry.sft_steps))

    def _build_once(self, name: str, build: Callable[[Path], None]) -> Path:
        final = self.root / name
        if _is_current(final):
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.root / f".{name}.lock"):
            if _is_current(final):  # another process built it while we waited
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
            stale = None
            try:
                build(tmp)
                (tmp / MARKER).write_text(f"{name}\nversion {STORE_VERSION}\n")
                if final.exists():  # built by another STORE_VERSION: move it aside, then swap
                    stale = Path(tempfile.mkdtemp(prefix=f".{name}-stale-", dir=self.root))
                    os.replace(final, stale / name)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                if stale is not None:
                    shutil.rmtree(stale, ignore_errors=True)
        return final


def _is_current(path: Path) -> bool:
    """A complete build of this STORE_VERSION (older builds lack the version line)."""
    marker = path / MARKER
    if not (path / "config.json").exists() or not marker.exists():
        return False
    return f"version {STORE_VERSION}" in marker.read_text().splitlines()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _warm_start(base: Path, tasks: list[TaskConfig], steps: int, out: Path) -> None:
    from conspo.training.sft import sft

    sft(base, tasks, out, steps=steps)


# --------------------------------------------------------------------------------------------
# Loading a policy for training
# --------------------------------------------------------------------------------------------


def pick_device(cfg: ModelConfig) -> tuple[torch.device, torch.dtype]:
    """auto: CUDA in bfloat16 when present, else CPU in float32."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but no CUDA device is available")
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    if cfg.dtype == "auto":
        dtype = torch.bfloat16 if use_cuda else torch.float32
    else:
        dtype = getattr(torch, cfg.dtype)
    return device, dtype


def device_memory(device: torch.device) -> int:
    """Total memory of ``device``: the GPU's, or this machine's RAM (cgroup-limited) for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return host_memory_bytes()


def model_dims(path: Path | str) -> ModelDims | None:
    """The dimensions of the model at ``path`` (a directory or a hub id) from its config alone."""
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=_local_only(path))
    except (OSError, ValueError) as exc:
        raise Unavailable(_not_loadable(path, exc)) from None
    return ModelDims.from_hf_config(config.to_dict())


def _local_only(path: Path | str) -> bool:
    return isinstance(path, Path) or hub_offline()


def _not_loadable(path: Path | str, exc: Exception) -> str:
    if isinstance(path, str) and hub_offline():
        return (
            f"model.name {path!r}: this hub model is not in this machine's Hugging Face cache"
            " (HF_HOME), and HF_HUB_OFFLINE=1 forbids downloading it; pre-fill the cache"
        )
    return f"could not load model {str(path)!r} ({exc})"


def load_pretrained(
    path: Path | str,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model at ``path`` with its weights in ``dtype`` on ``device``, and its tokenizer."""
    check_attention(attn_implementation, device)
    local_only = _local_only(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=local_only, attn_implementation=attn_implementation
        )
    except OSError as exc:
        raise Unavailable(_not_loadable(path, exc)) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # many causal LMs ship without one
        tokenizer.pad_token = tokenizer.eos_token
    # PreTrainedModel.to is declared with @functools.wraps(nn.Module.to), whose typeshed type
    # takes the unbound signature (self first), so mypy rejects a device as the first argument.
    model = model.to(device)  # type: ignore[arg-type]
    return model, tokenizer


def check_attention(attn_implementation: str, device: torch.device) -> None:
    """Refuse flash_attention_2 where it cannot run, before any weight loads."""
    if attn_implementation != "flash_attention_2":
        return
    if device.type != "cuda":
        raise ValueError(
            "model.attn_implementation: flash_attention_2 needs a CUDA device (this run trains"
            f" on {device.type}); use sdpa"
        )
    if importlib.util.find_spec("flash_attn") is None:
        raise ValueError(
            "model.attn_implementation: flash_attention_2 needs the flash-attn package, which"
            " is not installed here; use sdpa"
        )


def prepare_for_training(
    model: PreTrainedModel, cfg: ModelConfig, seed: int = 0
) -> PreTrainedModel:
    """Gradient checkpointing and LoRA adapters (``cfg.lora.rank`` > 0) as ``cfg`` asks.

    With LoRA the result is a peft model whose base weights are frozen: only the adapters
    require grad. Their random initialisation is a function of ``seed`` alone.
    """
    if model.device.type == "cuda":
        # cuDNN's SDPA kernel gives NaN gradients for queries that attend to nothing, which the
        # left padding of every batch of prompts has (measured on an H200, torch 2.11: every
        # gradient NaN; the flash, memory-efficient and math kernels give finite ones). The
        # switch is process-wide: a training process trains one model.
        torch.backends.cuda.enable_cudnn_sdp(False)
    # model.config.use_cache is left as it is (it is saved with checkpoints and read by
    # generate): every forward of conspo.generation.forward says whether it wants a KV cache.
    if cfg.gradient_checkpointing:
        # Non-reentrant: it needs no input that requires grad (a frozen LoRA base has none).
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    if cfg.lora.rank == 0:
        return model
    from peft import LoraConfig, TaskType, get_peft_model

    targets = cfg.lora.target_modules
    lora = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,  # type: ignore[arg-type]  # peft says int; α / r takes any
        lora_dropout=cfg.lora.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        task_type=TaskType.CAUSAL_LM,
    )
    try:
        cuda = [model.device] if model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # leave the process's random streams alone
            torch.manual_seed(seed)
            return get_peft_model(model, lora)  # type: ignore[return-value]
    except ValueError as exc:  # e.g. a target module the model does not have
        raise ValueError(f"model.lora.target_modules: {exc}") from None


def load_policy(
    cfg: ModelConfig, store: ModelStore | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, torch.device, torch.dtype]:
    """Resolve ``cfg.name`` through the store and load it on the auto-selected device."""
    store = store or ModelStore()
    device, dtype = pick_device(cfg)
    model, tokenizer = load_pretrained(store.resolve(cfg.name), device, dtype)
    return model, tokenizer, device, dtype
