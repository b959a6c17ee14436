"""A model an environment talks to (``conspo.environments.base.Simulator``): a simulated user, a
judge. Run by the platform's own engine, in this process, bounded in tokens.

    simulator = ModelSimulator(model, tokenizer, max_new_tokens=64)
    simulator.reply([{"role": "system", "content": persona}, {"role": "user", "content": q}])

Each rollout's environment calls it from its own step (on the rollout's call pool, while the
policy writes in other rows); the model is one, so replies take turns (a lock). A reply is
greedy, at most ``max_new_tokens`` tokens, its special tokens dropped. The step that calls it is
bounded in time by the runner (``environment.timeout_s``): a reply that takes longer fails that
episode, and the abandoned reply ends at its token bound.
"""

from __future__ import annotations

import threading

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from conspo.generation.batch import SampleRequest
from conspo.generation.engines import NativeEngine
from conspo.generation.rollout import encode_prompts, end_token_ids

# What a reply may hold of its prompt, at most (tokens, the conversation's most recent kept):
# a long conversation must not make one reply's prefill unbounded.
MAX_PROMPT_TOKENS = 2048


class ModelSimulator:
    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.engine = NativeEngine()
        self._lock = threading.Lock()

    def reply(self, messages: list[dict[str, str]]) -> str:
        text = self._rendered(messages)
        device = next(self.model.parameters()).device
        with self._lock, torch.no_grad():
            ids, mask = encode_prompts(self.tokenizer, [text], device)
            ids, mask = ids[:, -MAX_PROMPT_TOKENS:], mask[:, -MAX_PROMPT_TOKENS:]
            request = SampleRequest(
                max_new_tokens=self.max_new_tokens,
                eos_id=end_token_ids(self.tokenizer, self.model),
                pad_id=self.tokenizer.pad_token_id,
                temperature=0.0,
            )
            batch = self.engine.sample(self.model, ids, mask, request)
        k = int(batch.lengths[0])
        out = self.tokenizer.decode(batch.response_ids[0, :k].tolist(), skip_special_tokens=True)
        return str(out).strip()

    def _rendered(self, messages: list[dict[str, str]]) -> str:
        """The conversation as the model reads it: its chat template, or "Role: text" lines
        for a model that has none."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            assert isinstance(text, str)
            return text
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
        return "\n".join([*lines, "Assistant:"])
