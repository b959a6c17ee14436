"""A model an environment talks to (``conspo.environments.base.Simulator``): a simulated user, a
judge. Run by the platform's own engine, in this process, bounded in tokens.

    simulator = ModelSimulator(model, tokenizer, max_new_tokens=64)
    simulator.reply([{"role": "system", "content": persona}, {"role": "user", "content": q}])

Each rollout's environment calls it from its own step (on the rollout's call pool, while the
policy writes in other rows). The model is one: one generation runs at a time, and it answers
every reply asked for by then together, as one batch (the asks that come in while it runs wait
for the next), so a step's rows wait on at most one batch besides their own. A reply is
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


class _Ask:
    """One reply asked for: its rendered conversation, then its answer (or the error)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.answer = ""
        self.error: BaseException | None = None
        self.answered = threading.Event()


class ModelSimulator:
    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.engine = NativeEngine()
        self._lock = threading.Lock()  # held by the generation under way
        self._asks_lock = threading.Lock()  # guards the asks not yet taken
        self._asks: list[_Ask] = []

    def reply(self, messages: list[dict[str, str]]) -> str:
        ask = _Ask(self._rendered(messages))
        with self._asks_lock:
            self._asks.append(ask)
        with self._lock:  # one generation at a time; it answers every ask waiting by then
            if not ask.answered.is_set():
                with self._asks_lock:
                    batch, self._asks = self._asks, []
                try:
                    answers = self._generate([a.text for a in batch])
                except BaseException as exc:
                    for a in batch:
                        a.error = exc
                        a.answered.set()
                    raise
                for a, answer in zip(batch, answers, strict=True):
                    a.answer = answer
                    a.answered.set()
        if ask.error is not None:
            raise ask.error
        return ask.answer

    def _generate(self, texts: list[str]) -> list[str]:
        device = next(self.model.parameters()).device
        with torch.no_grad():
            ids, mask = encode_prompts(self.tokenizer, texts, device)
            ids, mask = ids[:, -MAX_PROMPT_TOKENS:], mask[:, -MAX_PROMPT_TOKENS:]
            request = SampleRequest(
                max_new_tokens=self.max_new_tokens,
                eos_id=end_token_ids(self.tokenizer, self.model),
                pad_id=self.tokenizer.pad_token_id,
                temperature=0.0,
            )
            batch = self.engine.sample(self.model, ids, mask, request)
        out = []
        for row, k in zip(batch.response_ids.tolist(), batch.lengths.tolist(), strict=True):
            out.append(str(self.tokenizer.decode(row[:k], skip_special_tokens=True)).strip())
        return out

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
