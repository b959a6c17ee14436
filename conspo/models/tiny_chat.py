"""The `tiny-chat` built-ins: a small Qwen2 with a real byte-level BPE tokenizer and chat template.

Where `tiny` has one token per character and no chat format, `tiny-chat` has what a released
checkpoint (Qwen2.5, DeepSeek-R1-Distill-Qwen) has, at toy scale: a byte-level BPE tokenizer
trained here with the `tokenizers` library on a fixed corpus (the math fixtures of
conspo.tasks.math_fixtures, the prompt templates, the chat roles), Qwen's special tokens and a
Qwen-style chat template, so prompt rendering, chat special tokens and \\boxed{} answers run
through the same code paths as with a real model. `tiny-chat-math` is `tiny-chat` after a short
SFT warm start on the easy word problems, answering "\\boxed{n}" in the chat format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from conspo.config import PROMPT_TEMPLATES, PromptConfig
from conspo.models.catalog import (
    CHAT_CONFIG,
    CHAT_MAX_POSITIONS,
    CHAT_SPECIAL_TOKENS,
    CHAT_TEMPLATE,
    CHAT_VOCAB_SIZE,
    ENDOFTEXT,
    IM_END,
    IM_START,
)
from conspo.models.tiny import build_tiny_model
from conspo.tasks.math_fixtures import fixture_sets
from conspo.templates import render

# The warm start: the prompt format tiny-chat-math is trained on (and expects in RL).
WARM_START_PROMPT = PromptConfig(template="boxed", chat_template="on")


def tokenizer_corpus() -> list[str]:
    """The fixed text the BPE merges are learned from."""
    rows = [" ".join(map(str, row.values())) for rows in fixture_sets().values() for row in rows]
    templates = [render(t, {"question": ""}) for t in PROMPT_TEMPLATES.values()]
    return rows + templates + ["system user assistant\n"] * 20


def build_chat_tokenizer() -> Qwen2Tokenizer:
    """Byte-level BPE with Qwen2's normaliser and pre-tokeniser, so that AutoTokenizer, which
    rebuilds a ``qwen2`` checkpoint's tokenizer from its vocab and merges alone (see
    conspo.models.tiny.build_char_tokenizer), gets exactly the pipeline the merges were learned
    in."""
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CHAT_VOCAB_SIZE,
        special_tokens=CHAT_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes
        show_progress=False,
    )
    bpe.train_from_iterator(tokenizer_corpus(), trainer)
    learned = json.loads(bpe.to_str())["model"]
    # Pairs, as tokenizers' BPE takes them (Qwen2Tokenizer's annotation says list[str]).
    merges: Any = [tuple(m) for m in learned["merges"]]
    return Qwen2Tokenizer(
        vocab=learned["vocab"],
        merges=merges,
        eos_token=IM_END,  # generation stops at the end of the assistant's turn
        pad_token=ENDOFTEXT,
        unk_token=None,  # type: ignore[arg-type]  # byte-level BPE: every byte has a token
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=CHAT_MAX_POSITIONS,
    )


def build_chat_model(tokenizer: Qwen2Tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    return build_tiny_model(tokenizer, seed, CHAT_CONFIG)


def save_tiny_chat(out: Path, seed: int = 0) -> None:
    tokenizer = build_chat_tokenizer()
    build_chat_model(tokenizer, seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
