"""The memory estimate counts the prompt's columns of the key/value cache that sampling and
evaluation hold (``conspo.generation.decode``'s buffers are prompt + response columns wide).

Issue 49's walk: a SmolLM2 SFT stage with its chat template on gcd (about 80 prompt tokens beside
128-token answers) peaked at 9.6 GiB resident during its final evaluation (200 problems, pass_k
4: 800 rows at once) while the estimate, counting the answers' columns only, said 6.4 GiB on
the worker (float32).
"""

from __future__ import annotations

import math
import random
from typing import Any

from conspo.access import ModelSources
from conspo.config import RunConfig
from conspo.models.resources import (
    CHARS_PER_TOKEN,
    CHAT_FRAME_TOKENS,
    DEFAULT_QUESTION_TOKENS,
    estimate_memory,
    prompt_tokens,
    source_dims,
)
from conspo.tasks import Example

FLOAT32 = 4


class QuestionsOf:
    """A built task whose every question is ``chars`` characters long."""

    name = "questions"

    def __init__(self, chars: int) -> None:
        self.chars = chars

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        return [Example("q" * self.chars, "42") for _ in range(n)]


def smollm2(kind: str = "rl", **extra: Any) -> RunConfig:
    return RunConfig.model_validate({
        "kind": kind, **({"algorithm": "grpo"} if kind == "rl" else {}),
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 16}},
        "sampling": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 128},
        "task": {"eval_size": 200}, "eval": {"pass_k": 4}, **extra,
    })  # fmt: skip


def kv_bytes(dims: Any, rows: int, columns: int) -> int:
    """What a decoder's key/value buffers hold for ``rows`` rows of ``columns`` positions."""
    return 2 * dims.layers * rows * dims.kv_width * columns * FLOAT32


def test_sampling_and_evaluation_count_the_prompt_columns_of_their_cache() -> None:
    dims = source_dims(ModelSources().locate("smollm2-135m-instruct"))
    assert dims is not None
    short, long = QuestionsOf(30), QuestionsOf(3000)
    longer = math.ceil(3000 / CHARS_PER_TOKEN) - math.ceil(30 / CHARS_PER_TOKEN)
    for kind in ("rl", "sft"):
        cfg = smollm2(kind)
        # the worker: measured on its built task
        a, b = (estimate_memory(cfg, dims, FLOAT32, task=t) for t in (short, long))
        assert b.evaluation - a.evaluation >= kv_bytes(dims, 200 * 4, longer), kind
        if kind == "rl":
            assert b.sampling - a.sampling >= kv_bytes(dims, 64, longer)
        # the API: the longest question its task check drew
        a, b = (estimate_memory(cfg, dims, FLOAT32, question_chars=c) for c in (30, 3000))
        assert b.evaluation - a.evaluation >= kv_bytes(dims, 200 * 4, longer), kind
    # never fewer columns than the prompt and the answers: the buffers the decoder allocates
    cfg = smollm2()
    estimate = estimate_memory(cfg, dims, FLOAT32, task=short)
    assert estimate.evaluation >= kv_bytes(dims, 800, prompt_tokens(cfg, short) + 128)
    assert estimate.sampling >= kv_bytes(dims, 64, prompt_tokens(cfg, short) + 128)


def test_a_prompt_is_its_chat_frame_template_and_question() -> None:
    cfg = smollm2()
    assert prompt_tokens(cfg) == CHAT_FRAME_TOKENS + DEFAULT_QUESTION_TOKENS  # not checked
    assert prompt_tokens(cfg, QuestionsOf(300)) == CHAT_FRAME_TOKENS + 100
    with_system = smollm2(prompt={"system": "s" * 299})
    assert prompt_tokens(with_system, QuestionsOf(300)) == CHAT_FRAME_TOKENS + 100 + 100
    framed = smollm2(prompt={"template": "boxed"})
    assert prompt_tokens(framed, QuestionsOf(300)) > prompt_tokens(cfg, QuestionsOf(300)) + 5


def test_the_chat_frame_is_counted_only_where_a_chat_template_applies() -> None:
    question = QuestionsOf(300)
    assert prompt_tokens(smollm2(prompt={"chat_template": "off"}), question) == 100
    tiny = RunConfig.model_validate({"model": {"name": "tiny-arith"}})  # no chat template
    assert prompt_tokens(tiny, question) == 100
    framed = RunConfig.model_validate({"model": {"name": "tiny-arith"},
                                       "prompt": {"chat_template": "on"}})  # fmt: skip
    assert prompt_tokens(framed, question) == CHAT_FRAME_TOKENS + 100
