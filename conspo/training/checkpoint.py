"""Checkpoints: model (Hugging Face format), optimiser, RNG states and counters at a step.

Layout: ``workdir/checkpoints/step_000010/`` with ``config.json`` + ``model.safetensors`` +
tokenizer files (the directory loads with ``from_pretrained``), ``optimizer.pt`` and
``trainer_state.pt``. A LoRA run saves its adapters instead of the model
(``adapter_config.json``, which names the base model, + ``adapter_model.safetensors``: peft's
format); ``conspo.models.export.export_merged`` turns either kind into a plain model directory.
A checkpoint is written into a temp dir and renamed into place, so a crash never leaves a
half-written ``step_*`` directory; only the newest ``keep`` are kept.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from conspo.distributed import collectives as distributed
from conspo.models.lineage import step_checkpoints

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def checkpoint_dir(workdir: str | Path) -> Path:
    return Path(workdir) / "checkpoints"


def list_checkpoints(workdir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    return step_checkpoints(workdir)


def latest_checkpoint(workdir: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(workdir)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    workdir: str | Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    counters: dict[str, Any],
    keep: int,
    model_state: dict[str, Any] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically and prune to the newest ``keep``.

    ``model_state`` / ``optimizer_state``: the whole states when ``model`` holds only a shard
    (``resources.strategy: fsdp``, ``distributed.full_state_dicts``); default the model's and
    optimiser's own. ``extra``: writes what else the run keeps (a critic) into the directory
    being written, before it is marked complete."""
    root = checkpoint_dir(workdir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step:06d}-", dir=root))
    try:
        model.save_pretrained(tmp, state_dict=model_state)
        tokenizer.save_pretrained(tmp)
        torch.save(
            optimizer.state_dict() if optimizer_state is None else optimizer_state,
            tmp / "optimizer.pt",
        )
        if extra is not None:
            extra(tmp)
        # Last: its presence marks the checkpoint complete.
        torch.save(
            {"step": step, "counters": counters, "rng": rng_state()}, tmp / "trainer_state.pt"
        )
        if final.exists():  # a re-run of the same step (e.g. cancelled right after a save)
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for _, old in list_checkpoints(workdir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path, model: PreTrainedModel, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Load weights and optimiser state in place; returns {"step", "counters", "rng"}."""
    device = str(next(model.parameters()).device)
    if distributed.is_sharded(model):  # every rank reads the whole states and keeps its shard
        _load_sharded(path, model, optimizer)
    elif (path / ADAPTER_WEIGHTS).exists():
        _load_adapters(path, model, device)
    else:
        _load_weights(path, model, device)
    if not distributed.is_sharded(model):
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)
    set_rng_state(trainer_state["rng"])
    return trainer_state


def _load_adapters(path: Path, model: PreTrainedModel, device: str) -> None:
    from peft import set_peft_model_state_dict

    if not hasattr(model, "peft_config"):
        raise RuntimeError(f"checkpoint {path} holds LoRA adapters, but this run has none")
    result = set_peft_model_state_dict(model, load_file(path / ADAPTER_WEIGHTS, device=device))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(
            f"checkpoint {path} does not match the adapters: unexpected {sorted(unexpected)}"
        )


def _load_sharded(path: Path, model: PreTrainedModel, optimizer: torch.optim.Optimizer) -> None:
    """A checkpoint written from a sharded (fsdp) run: whole states, optimiser keyed by name."""
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(shard))
    if model.config.tie_word_embeddings:  # saved once; the sharded model names both
        tied = model.get_output_embeddings()
        for name, module in model.named_modules():
            if module is tied and f"{name}.weight" not in state:
                state[f"{name}.weight"] = state[_input_embedding_key(model)]
    optimizer_state = torch.load(path / "optimizer.pt", weights_only=True)
    distributed.load_full_state_dicts(model, optimizer, state, optimizer_state)


def _input_embedding_key(model: PreTrainedModel) -> str:
    embedding = model.get_input_embeddings()
    return next(f"{n}.weight" for n, m in model.named_modules() if m is embedding)


def _load_weights(path: Path, model: PreTrainedModel, device: str) -> None:
    if hasattr(model, "peft_config"):
        raise RuntimeError(f"checkpoint {path} holds a full model, but this run trains LoRA")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(shard, device=device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if model.config.tie_word_embeddings and k.startswith("lm_head.")}
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"checkpoint {path} does not match the model: missing {sorted(set(missing) - tied)},"
            f" unexpected {sorted(unexpected)}"
        )
