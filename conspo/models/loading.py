"""Loading a policy for training: the device and dtype, the model and tokenizer (refusing
what transformers would fetch from a hub the sources do not admit), attention and LoRA set-up.
``conspo.models.store.load_policy`` resolves a name through the store and loads it here.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from conspo.access import Unavailable, hub_offline
from conspo.config import ModelConfig
from conspo.models.precision import emulated_bfloat16
from conspo.models.resources import ModelDims
from conspo.registry import Head
from conspo.system import host_memory_bytes


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


def describe_device(device: torch.device, dtype: torch.dtype | None = None) -> str:
    """Where a run trains, for people: "cuda:0 (NVIDIA H100 80GB HBM3)" or "cpu"; with the
    ``dtype``, a CPU without native bfloat16 says so ("cpu (bfloat16 is emulated …)"), which the
    run page shows beside the dtype."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if dtype is not None and (warning := emulated_bfloat16(device.type, dtype)):
        return f"{device} ({warning})"
    return str(device)


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
    head: Head = "causal_lm",
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model at ``path`` with its weights in ``dtype`` on ``device``, and its tokenizer.

    ``head`` (the job kind's, ``RegisteredJobKind.head``): "sequence_score" loads the model with
    one scalar output on its last non-pad token (``AutoModelForSequenceClassification``,
    num_labels=1: TRL's reward-model format) in place of the LM head; a causal LM's own head is
    dropped and the score starts random, drawn from ``seed`` alone, a reward model's is kept as
    trained."""
    check_attention(attn_implementation, device)
    local_only = _local_only(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        if tokenizer.pad_token is None:  # many causal LMs ship without one
            tokenizer.pad_token = tokenizer.eos_token
        model: PreTrainedModel
        if head == "sequence_score":
            # Without pad_token_id the head cannot find a row's last token: it would score the
            # padding of every row shorter than the batch's longest.
            cuda = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=cuda):  # leave the process's random streams alone
                torch.manual_seed(seed)
                model = AutoModelForSequenceClassification.from_pretrained(
                    path,
                    num_labels=1,
                    pad_token_id=tokenizer.pad_token_id,
                    dtype=dtype,
                    local_files_only=local_only,
                    attn_implementation=attn_implementation,
                )
        else:
            model = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=dtype,
                local_files_only=local_only,
                attn_implementation=attn_implementation,
            )
    except OSError as exc:
        raise Unavailable(_not_loadable(path, exc)) from None
    tokenizer.padding_side = "left"
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
    model: PreTrainedModel, cfg: ModelConfig, seed: int = 0, head: Head = "causal_lm"
) -> PreTrainedModel:
    """Gradient checkpointing and LoRA adapters (``cfg.lora.rank`` > 0) as ``cfg`` asks.

    With LoRA the result is a peft model whose base weights are frozen: only the adapters
    require grad. Their random initialisation is a function of ``seed`` alone. A
    "sequence_score" head (``load_pretrained``) is trained whole beside the adapters (peft's
    SEQ_CLS task keeps the ``score`` layer in ``modules_to_save``): it starts random.
    """
    if model.device.type == "cuda":
        # cuDNN's SDPA kernel gives NaN gradients for queries that attend to nothing, which the
        # left padding of every batch of prompts has (measured on an H200, torch 2.11: every
        # gradient NaN; the flash, memory-efficient and math kernels give finite ones). The
        # switch is process-wide: a training process trains one model.
        torch.backends.cuda.enable_cudnn_sdp(False)
    # model.config.use_cache is left as it is (it is saved with checkpoints and read by
    # generate): every forward (conspo.generation.forward, conspo.training.logprobs) says
    # whether it wants a KV cache.
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
        task_type=TaskType.SEQ_CLS if head == "sequence_score" else TaskType.CAUSAL_LM,
    )
    try:
        cuda = [model.device] if model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # leave the process's random streams alone
            torch.manual_seed(seed)
            with peft_reading_old_names():
                return get_peft_model(model, lora)  # type: ignore[return-value]
    except ValueError as exc:  # e.g. a target module the model does not have
        raise ValueError(f"model.lora.target_modules: {exc}") from None


@contextmanager
def peft_reading_old_names() -> Iterator[None]:
    """Around making a ``PeftModel`` (``get_peft_model``, ``PeftModel.from_pretrained``).

    peft 0.21's ``PeftModel.__init__`` reads ``model.is_gradient_checkpointing``, a name that
    transformers 5.24 keeps only as a deprecated alias of ``is_activation_checkpointing``: each
    LoRA run printed that FutureWarning into its log (its Logs tab), about a line of peft that
    no caller can change. That warning, raised by that read, is not shown; any other warning
    still is. Drop this when peft reads the new name."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="`is_gradient_checkpointing` is deprecated",
            category=FutureWarning,
            module=r"transformers\.modeling_utils",
        )
        yield
