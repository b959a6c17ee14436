"""The `tiny` family: a small Qwen2-architecture model (``Qwen2ForCausalLM``) with a
character-level tokenizer, both in the standard Hugging Face format (``save_pretrained`` /
``from_pretrained``), so TRL and anything else that reads HF checkpoints can use them. What each
built-in name is and its recipe are in conspo/models/catalog.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from conspo.models.catalog import (
    BOS,
    CHARSET,
    EOS,
    MAX_POSITIONS,
    PAD,
    SPECIAL_TOKENS,
    TINY_CONFIG,
    UNK,
)


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
