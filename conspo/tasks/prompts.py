"""Prompts: how a task's question becomes the text the policy continues (``PromptConfig``).

    render = PromptRenderer(cfg.prompt, tokenizer)     # raises if chat_template "on" can't be
    text = render("What is 2+3?")

The question goes into the template text (``plain``: as is; ``boxed``: the paper's "reason step
by step ... \\boxed{}"; or your own text), then, when the chat template is on (or "auto" and the
tokenizer has one), into the tokenizer's chat template as the user message after an optional
system message, with the assistant turn opened. ``PromptedTask`` wraps a task so that its
training and held-out prompts are rendered while its verifier sees the original example.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from conspo.config import PromptConfig
from conspo.tasks.base import Example, Task, prefetch
from conspo.templates import render

if TYPE_CHECKING:  # the tasks package is imported by the API, which never loads transformers
    from transformers import PreTrainedTokenizerBase


class PromptRenderer:
    def __init__(self, cfg: PromptConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if cfg.chat_template == "on" and not has_template:
            raise ValueError(
                "prompt.chat_template is 'on' but this model's tokenizer has no chat template;"
                " use 'auto' or 'off'"
            )
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.chat = has_template and cfg.chat_template != "off"

    def __call__(self, question: str) -> str:
        text = render(self.cfg.text(), {"question": question})
        if not self.chat:
            return text
        messages = [{"role": "user", "content": text}]
        if self.cfg.system:
            messages.insert(0, {"role": "system", "content": self.cfg.system})
        rendered = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert isinstance(rendered, str)
        return rendered

    @property
    def is_identity(self) -> bool:
        """Whether rendering leaves every question as it is (plain template, no chat)."""
        return not self.chat and self.cfg.text() == "{question}"


class PromptedTask:
    """``task`` with its prompts rendered; ``verify`` gets the example as the task made it."""

    def __init__(self, task: Task, render: PromptRenderer) -> None:
        self.task = task
        self.render = render
        self.name = task.name

    def train_prompts(self, rng: random.Random, n: int) -> list[Example]:
        return [self.rendered(ex) for ex in self.task.train_prompts(rng, n)]

    def eval_examples(self, n: int) -> list[Example]:
        return [self.rendered(ex) for ex in self.task.eval_examples(n)]

    def verify(self, completion: str, example: Example) -> float:
        return self.task.verify(completion, example.data["_original"])

    def prefetch(self, completions: Sequence[str], examples: Sequence[Example]) -> None:
        """The wrapped task's batch hook (``conspo.tasks.base.prefetch``), on its own examples."""
        prefetch(self.task, completions, [ex.data["_original"] for ex in examples])

    def process_reward(self, completion: str, example: Example) -> float:
        """The wrapped task's process signal (conspo.rewards); the config lets only a task that
        has one be given the ``process`` reward."""
        return float(self.task.process_reward(completion, example.data["_original"]))  # type: ignore[attr-defined]

    def tool_solution(self, example: Example) -> str | None:
        """The wrapped task's tool solution (the ``sft`` kind's tool traces); the config lets
        only a task that has one ask for them."""
        return self.task.tool_solution(example.data["_original"])  # type: ignore[attr-defined]

    def rendered(self, example: Example) -> Example:
        data = {**example.data, "_original": example}
        return replace(example, prompt=self.render(example.prompt), data=data)


def with_prompts(task: Task, render: PromptRenderer) -> Task:
    """``task`` itself when rendering changes nothing (the procedural tasks' plain prompts, so
    their runs are unchanged), else the task wrapped in ``PromptedTask``."""
    return task if render.is_identity else PromptedTask(task, render)
