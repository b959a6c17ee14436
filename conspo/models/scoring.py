"""Scoring texts with a model: the one bounded, batched helper that rewards calling a model share.

    scorers = ModelScorers(store.resolve, device, dtype)
    scorers.load("runs/12/rm", "rewards[1].params.model")      # at set-up: a bad name fails there
    scores = scorers.score("runs/12/rm", prompts, completions,
                           max_tokens=1024, batch_size=8, deadline=time.monotonic() + 60)

A score model is a Hugging Face ``AutoModelForSequenceClassification`` directory with
``num_labels=1``: one scalar read at the last non-pad token (TRL RewardTrainer's format, what
the ``reward_model`` job kind saves). Each is loaded once per run, by name, frozen in eval
mode on the run's device in its dtype, and scores texts ``batch_size`` at a time, each text at
most ``max_tokens`` tokens: a batch holds at most batch_size × max_tokens tokens. Before every
batch and every layer of its forward pass it asks ``stopping.check()`` (a cancel ends the step)
and looks at the deadline (``ScoringTimedOut``): a hung or slow model costs a step at most its
deadline plus one layer.

``ModelScorers`` is what a reward sees as ``RewardContext.models`` (``conspo.rewards.base
.RewardModels``); the trainer builds it at set-up (``load_reward_models``) with the run's model
store. A generative judge's ``generate`` is to join it there, beside ``score``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from conspo import stopping
from conspo.access import Unavailable, hub_offline
from conspo.config import RunConfig
from conspo.rewards.base import field_name, model_fields


class ScoringTimedOut(TimeoutError):
    """Scoring ran past its deadline: the texts of the call are left unscored."""


def conversation_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str, max_tokens: int
) -> list[int]:
    """The token ids a score model reads for (prompt, completion), at most ``max_tokens``.

    With a chat template the pair is the conversation [user: prompt, assistant: completion] in
    the score model's own template: a reward model is trained on conversations in its own
    format (TRL's RewardTrainer applies the template to conversational pairs), which need not
    be the policy's, so the policy's rendering is not what it should read. Without one, the
    prompt followed by the completion, as the tokenizer encodes plain text.

    Over ``max_tokens``, the prompt loses tokens from its left (its start matters least to
    judging the answer, and the template's frame stays whole); a completion that alone is over
    keeps its end, where the score is read."""
    ids = _rendered_ids(tokenizer, prompt, completion)
    over = len(ids) - max_tokens
    if over <= 0:
        return ids
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    kept = str(tokenizer.decode(prompt_ids[over:])) if over < len(prompt_ids) else ""
    # Re-encoding the cut prompt may merge a token differently at the cut: the slice bounds it.
    return _rendered_ids(tokenizer, kept, completion)[-max_tokens:]


def _rendered_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": completion},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        assert isinstance(text, str)
        return list(tokenizer(text, add_special_tokens=False).input_ids)  # the template has them
    return list(tokenizer(prompt + completion).input_ids)


def forward_scores(model: PreTrainedModel, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """The (B,) float32 scores of a score model on token rows (``conversation_ids``), padded on
    the right: HF's sequence classification reads the rightmost token that is not
    ``config.pad_token_id``. With gradients when the caller computes them (a reward model's
    training reads its pairs through this too, so it scores there as the reward does here)."""
    width = max(1, *(len(r) for r in rows))
    ids = torch.full((len(rows), width), int(model.config.pad_token_id), dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
        mask[i, : len(row)] = 1
    device = model.device
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    return out.logits[:, 0].float()


class ModelScorer:
    """One score model, frozen: ``score`` turns (prompt, completion) pairs into its scalars."""

    def __init__(self, name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self._deadline: float | None = None  # while score() runs
        stopping.check_between_layers(model)
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for layer in module:
                    layer.register_forward_pre_hook(self._before_layer)

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        *,
        max_tokens: int,
        batch_size: int,
        deadline: float,
    ) -> list[float]:
        """The model's scalar for each (prompt, completion), as floats (NaN stays NaN: the
        caller decides what an unusable score means), ``batch_size`` texts per forward pass.
        ``ScoringTimedOut`` once ``time.monotonic()`` passes ``deadline``; ``Abandoned`` on a
        cancel."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        self._deadline = deadline
        scores: list[float] = []
        try:
            for start in range(0, len(prompts), batch_size):
                stopping.check()
                self._check_deadline(len(scores), len(prompts))
                pairs = zip(
                    prompts[start : start + batch_size],
                    completions[start : start + batch_size],
                    strict=True,
                )
                rows = [conversation_ids(self.tokenizer, p, c, max_tokens) for p, c in pairs]
                scores += self._forward(rows)
        finally:
            self._deadline = None
        return scores

    def _forward(self, rows: list[list[int]]) -> list[float]:
        with torch.no_grad():
            return forward_scores(self.model, rows).cpu().tolist()

    def _before_layer(self, _module: Any, _args: Any) -> None:
        self._check_deadline()

    def _check_deadline(self, done: int | None = None, total: int | None = None) -> None:
        if self._deadline is None or time.monotonic() <= self._deadline:
            return
        progress = "" if done is None else f" ({done} of {total} texts scored)"
        raise ScoringTimedOut(f"scoring with {self.name!r} ran past its deadline{progress}")


class ModelScorers:
    """The run's score models, each loaded once, by name: what rewards call through
    ``RewardContext.models`` (``conspo.rewards.base.RewardModels``)."""

    def __init__(
        self, resolve: Callable[[str], Path | str], device: torch.device, dtype: torch.dtype
    ) -> None:
        """``resolve``: the run's model store (``ModelStore.resolve``: its sources decide which
        names may load); ``device``, ``dtype``: the run's, where the policy's weights live."""
        self.resolve = resolve
        self.device = device
        self.dtype = dtype
        self.loaded: dict[str, ModelScorer] = {}

    def load(self, name: str, field: str = "model") -> ModelScorer:
        """The score model ``name``, loaded on first use; ``field`` (``rewards[1].params.model``)
        is what an error names: the config's place that asked for it."""
        if name not in self.loaded:
            self.loaded[name] = self._load(name, field)
        return self.loaded[name]

    def score(
        self,
        name: str,
        prompts: Sequence[str],
        completions: Sequence[str],
        *,
        max_tokens: int,
        batch_size: int,
        deadline: float,
    ) -> list[float]:
        """``ModelScorer.score`` with the model ``name`` (loaded now if set-up did not)."""
        return self.load(name).score(
            prompts, completions, max_tokens=max_tokens, batch_size=batch_size, deadline=deadline
        )

    def _load(self, name: str, field: str) -> ModelScorer:
        try:
            path = self.resolve(name)
        except Unavailable as exc:
            raise Unavailable(str(exc).replace("model.name", field, 1)) from None
        local_only = isinstance(path, Path) or hub_offline()
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
            model = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=self.dtype, local_files_only=local_only
            )
        except (OSError, ValueError) as exc:
            raise Unavailable(
                f"{field} {name!r}: could not load it as a score model ({exc})"
            ) from None
        labels = model.config.num_labels
        if labels != 1:
            raise ValueError(
                f"{field} {name!r} is not a reward model: its head gives {labels} scores, a"
                " reward model's one (AutoModelForSequenceClassification, num_labels=1)"
            )
        if tokenizer.pad_token is None:  # many causal LMs ship without one
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:  # batches need it to find each text's last token
            model.config.pad_token_id = tokenizer.pad_token_id
        model = model.to(self.device)
        stopping.check()
        return ModelScorer(name, model, tokenizer)


def load_reward_models(
    cfg: RunConfig, resolve: Callable[[str], Path | str], device: torch.device, dtype: torch.dtype
) -> ModelScorers | None:
    """The score models ``cfg``'s rewards name, loaded (None: they name none), so that a name
    the store refuses, or a model that is no reward model, fails the run at set-up at its
    field (``rewards[1].params.model``), not each step."""
    fields = model_fields(cfg)
    if not fields:
        return None
    scorers = ModelScorers(resolve, device, dtype)
    for loc, name in fields:
        scorers.load(name, field_name(loc))
    return scorers
