"""Prompt rendering (conspo.tasks.prompts) and the tiny-chat tokenizer it runs through."""

import random

import pytest
from transformers import AutoTokenizer

from conspo.config import PromptConfig, TaskConfig
from conspo.models.catalog import CHAT_SPECIAL_TOKENS, IM_END
from conspo.tasks import make_task
from conspo.tasks.prompts import PromptedTask, PromptRenderer, with_prompts


@pytest.fixture(scope="module")
def chat_tokenizer(model_store):
    return AutoTokenizer.from_pretrained(model_store.resolve("tiny-chat"))


@pytest.fixture(scope="module")
def char_tokenizer(model_store):
    return AutoTokenizer.from_pretrained(model_store.resolve("tiny"))


def test_tiny_chat_tokenizer_round_trips_through_autotokenizer(chat_tokenizer):
    from conspo.models.tiny_chat import build_chat_tokenizer

    built = build_chat_tokenizer()
    assert type(chat_tokenizer).__name__ == "Qwen2Tokenizer"
    assert chat_tokenizer.get_vocab() == built.get_vocab()
    assert chat_tokenizer.eos_token == IM_END and chat_tokenizer.chat_template
    text = "Ava has 7 pens.\n  Then: \\boxed{\\frac{1}{2}} — naïve 😀 <|im_end|>"
    ids = chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == built(text, add_special_tokens=False)["input_ids"]
    assert chat_tokenizer.decode(ids) == text
    assert 300 < len(chat_tokenizer) <= 2048


def test_chat_special_tokens_encode_as_single_tokens(chat_tokenizer):
    render = PromptRenderer(PromptConfig(chat_template="on", system="Be brief."), chat_tokenizer)
    text = render("What is 2+3?")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = chat_tokenizer(text, add_special_tokens=False)["input_ids"]  # as encode_prompts does
    specials = {chat_tokenizer.convert_tokens_to_ids(t) for t in CHAT_SPECIAL_TOKENS}
    assert sum(i in specials for i in ids) == 5  # three turns opened, two closed
    assert not any("<" in t for t in chat_tokenizer.convert_ids_to_tokens(ids) if len(t) < 5)
    assert ids.count(chat_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(chat_tokenizer.eos_token_id) == 2


def test_templates_plain_boxed_and_custom(char_tokenizer):
    plain = PromptRenderer(PromptConfig(), char_tokenizer)
    assert plain("12+7=") == "12+7=" and plain.is_identity
    boxed = PromptRenderer(PromptConfig(template="boxed"), char_tokenizer)
    assert boxed("Q?") == (
        "Q?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    custom = PromptRenderer(PromptConfig(template="Problem: {question}\n{{A}}:"), char_tokenizer)
    assert custom("Q?") == "Problem: Q?\n{A}:"
    with pytest.raises(ValueError, match="question"):
        PromptConfig(template="no placeholder")


def test_chat_template_on_off_auto(chat_tokenizer, char_tokenizer):
    assert PromptRenderer(PromptConfig(chat_template="auto"), chat_tokenizer)("Q").startswith(
        "<|im_start|>user\nQ"
    )
    assert PromptRenderer(PromptConfig(chat_template="off"), chat_tokenizer)("Q") == "Q"
    assert PromptRenderer(PromptConfig(chat_template="auto"), char_tokenizer)("Q") == "Q"
    with pytest.raises(ValueError, match="prompt.chat_template is 'on'.*no chat template"):
        PromptRenderer(PromptConfig(chat_template="on"), char_tokenizer)


def test_a_prompted_task_renders_prompts_and_verifies_on_the_original(chat_tokenizer):
    task = make_task(TaskConfig(name="arith"))
    render = PromptRenderer(PromptConfig(template="boxed"), chat_tokenizer)
    wrapped = with_prompts(task, render)
    assert isinstance(wrapped, PromptedTask)
    [ex] = wrapped.train_prompts(random.Random(0), 1)
    [raw] = task.train_prompts(random.Random(0), 1)
    assert ex.prompt == render(raw.prompt) and ex.answer == raw.answer
    assert wrapped.verify(raw.answer, ex) == 1.0
    assert wrapped.eval_examples(3) == [wrapped.rendered(e) for e in task.eval_examples(3)]
    off = PromptRenderer(PromptConfig(chat_template="off"), chat_tokenizer)
    assert with_prompts(task, off) is task  # the procedural tasks' runs are unchanged
