"""The built-in models: each name, what it is, and the recipe the model store builds it from.

Torch-free on purpose: the config model (``model.name``'s help text), the REST presets and the web
form read this catalogue in the API process, which must not need torch. ``conspo.models`` builds
the entries (``ModelStore.resolve``). A changed recipe needs ``conspo.models.STORE_VERSION``
bumped, so stores built from the old one are rebuilt.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

# The tiny family's architecture and tokenizer, here rather than in conspo.models so that the API
# can read a built-in model's dimensions (its memory estimate, conspo.resources) without torch.
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, BOS, UNK]
# Every character a tiny-model prompt or answer can contain. Order fixes the token ids.
CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n"
MAX_POSITIONS = 256
TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=4,  # head_dim 32
    num_key_value_heads=4,
    max_position_embeddings=MAX_POSITIONS,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
)


def tiny_hf_config() -> dict[str, Any]:
    """The config.json every built-in model has (the warm-started ones are `tiny` fine-tuned)."""
    return {**TINY_CONFIG, "model_type": "qwen2", "vocab_size": len(SPECIAL_TOKENS) + len(CHARSET)}


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    about: str  # one line: what it is for
    base: str | None = None  # the built-in it is fine-tuned from; None: built from scratch
    warm_start: tuple[dict[str, Any], ...] = ()  # SFT task mix, each a TaskConfig's data
    sft_steps: int = 0

    @property
    def description(self) -> str:
        if self.base is None:
            return self.about
        tasks = ", ".join(dict.fromkeys(t["name"] for t in self.warm_start))
        return f"{self.base} after a {self.sft_steps}-step SFT warm start on {tasks}: {self.about}"


# The arith base is right (greedy, 256 held-out problems) on about 70% of 1-digit a±b, 55% of
# 1-digit a±b±c and 6% of 2-digit sums: RL has room on every setting (see examples/run.yaml).
# Build: ~21 s on one CPU thread. A sharper base is worse for RL, not better: 600 SFT steps
# (94% / 77% / 5%) lost accuracy on a±b±c under both GRPO and ConSPO at every lr tried (1e-4,
# 5e-5, 3e-5), while this base gains at the default lr 3e-5 (+6..+9 points in 80 steps, about
# +16 in 300).
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            "tiny",
            "Tiny Qwen2 model (~0.65M parameters, character tokenizer), random init; builds in a"
            " second.",
        ),
        BuiltinModel(
            "tiny-arith",
            "answers 1-digit a±b±c right about half the time, a base with room for RL.",
            base="tiny",
            warm_start=(
                {"name": "arith", "params": {"digits": 1, "num_operands": 2}},
                {"name": "arith", "params": {"digits": 1, "num_operands": 3}},
                {"name": "arith", "params": {"digits": 2, "num_operands": 2}},
            ),
            sft_steps=400,
        ),
        BuiltinModel(
            "tiny-countdown",
            "answers in the countdown format, a base for RL on countdown.",
            base="tiny",
            warm_start=({"name": "countdown", "params": {"digits": 1, "num_operands": 3}},),
            sft_steps=400,
        ),
    )
}
