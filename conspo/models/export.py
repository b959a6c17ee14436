"""A checkpoint as a plain Hugging Face model directory, for serving or evaluation elsewhere.

    export_merged("out/checkpoints/step_000100", None, "exported")   # base from the checkpoint
    python -m conspo export out/checkpoints/step_000100 --out exported

A LoRA checkpoint's adapters are merged into its base model (peft's ``merge_and_unload``), in
float32, and saved in the base's own dtype; a full fine-tuning checkpoint already is such a
directory and is copied without its optimiser and trainer state. Either result loads with
``AutoModelForCausalLM.from_pretrained``, or, a reward model's (the ``reward_model`` job kind:
peft's SEQ_CLS adapters and score head; a full checkpoint whose config's architectures name a
``…ForSequenceClassification``), with ``AutoModelForSequenceClassification.from_pretrained``,
one label read at the last non-pad token.

``conspo.models.model_tar.ModelTar`` streams such a directory as one tar archive (a download).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from conspo.models.lineage import ADAPTER_CONFIG, TRAINING_FILES
from conspo.models.loading import peft_reading_old_names


def recorded_base(checkpoint_dir: str | Path) -> str:
    """The base model a LoRA checkpoint's adapters were trained on, as the run loaded it."""
    config = json.loads((Path(checkpoint_dir) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{checkpoint_dir}/{ADAPTER_CONFIG} does not name its base model")
    return str(base)


def export_merged(
    checkpoint_dir: str | Path, base_model_path: str | Path | None, out_dir: str | Path
) -> Path:
    """Write ``checkpoint_dir`` as a plain model directory ``out_dir``; returns it.

    ``base_model_path``: a LoRA checkpoint's base (default: the one it records).
    """
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if not (checkpoint_dir / ADAPTER_CONFIG).exists():
        shutil.copytree(checkpoint_dir, out_dir, ignore=shutil.ignore_patterns(*TRAINING_FILES))
        return out_dir
    from peft import PeftModel

    base_path = base_model_path or recorded_base(checkpoint_dir)
    saved_dtype = AutoConfig.from_pretrained(base_path).dtype or torch.float32  # as shipped
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    base = _base_with_head(checkpoint_dir, base_path, tokenizer)
    with peft_reading_old_names():
        merged = PeftModel.from_pretrained(base, checkpoint_dir).merge_and_unload()
    merged.to(saved_dtype).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _base_with_head(checkpoint_dir: Path, base_path: str | Path, tokenizer: Any) -> Any:
    """The base model in float32 with the head the adapters were trained on: the causal LM's,
    or for a reward model's (peft's task_type SEQ_CLS) the one-label score head, whose trained
    weights the adapters carry (modules_to_save), reading the last token that is not the
    tokenizer's pad, as the run did (``conspo.models.loading.load_pretrained``)."""
    task_type = json.loads((checkpoint_dir / ADAPTER_CONFIG).read_text()).get("task_type")
    if task_type == "SEQ_CLS":
        return AutoModelForSequenceClassification.from_pretrained(
            base_path, dtype=torch.float32, num_labels=1, pad_token_id=tokenizer.pad_token_id
        )
    return AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
