"""Tiny reward models for the tests: a built-in model with a one-label sequence-classification
head (TRL RewardTrainer's format, what a ``reward_model`` reward loads), saved into a directory."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


def build_reward_model(
    base: Path, out: Path, *, seed: int = 0, nan_text: str | None = None
) -> Path:
    """A reward model at ``out`` from the causal LM at ``base``: its body, a fresh score head
    drawn from ``seed``. ``nan_text``: that text's tokens embed to NaN, so every text holding it
    scores NaN (a causal model carries it to the last token) and the others score as before."""
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # scores spread enough to tell rollouts apart
        if nan_text is not None:
            ids = tokenizer(nan_text, add_special_tokens=False).input_ids
            model.get_input_embeddings().weight[ids] = float("nan")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
