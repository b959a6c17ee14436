"""Scoring texts with a model: the one bounded, batched helper that rewards calling a model share.

    scorers = ModelScorers(store.resolve, device, dtype)
    scorers.load("runs/12/rm", "rewards[1].params.model")      # at set-up: a bad name fails there
    scores = scorers.score("runs/12/rm", prompts, completions,
                           max_tokens=1024, batch_size=8, deadline=time.monotonic() + 60)
    scorers.load_judge("smollm2-135m-instruct", "rewards[2].params.model")
    texts = scorers.generate("smollm2-135m-instruct", judge_prompts, samples=3, temperature=0.7,
                             max_new_tokens=256, max_prompt_tokens=1024, batch_size=12,
                             deadline=time.monotonic() + 120, seed=0)   # 3 texts per prompt

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
store.

A judge is a causal LM (a catalogue model, a run's checkpoint, a local directory: whatever
``model.name`` may name), loaded the same way, once per run, frozen. ``generate`` samples
``samples`` texts per prompt through this library's own sampler (``conspo.generation``'s
``NativeEngine``) with a generator seeded from ``seed``, so a call's texts are a function of
its prompts and seed. Each prompt is the user's turn in the judge's chat template, at most
``max_prompt_tokens`` (cut from its left: the end holds the answer and what to write), each
text at most ``max_new_tokens``: a batch holds at most batch_size × (max_prompt_tokens +
max_new_tokens) tokens. A cancel is asked at every decode step, the deadline every few
(``STOP_CHECK_COLUMNS``) and before every batch and layer of the prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from conspo import stopping
from conspo.access import Unavailable, hub_offline
from conspo.config import RunConfig
from conspo.generation.batch import GenerationStopped, SampleRequest
from conspo.generation.engines import NativeEngine
from conspo.generation.rollout import encode_prompts, end_token_ids
from conspo.rewards.base import field_name, model_uses


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


class _FrozenModel:
    """A model rewards call, frozen in eval mode: a cancel is asked, and ``_deadline`` (while a
    call runs) looked at, before every layer of its no-grad forward passes."""

    def __init__(self, name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self._deadline: float | None = None  # while a call runs
        stopping.check_between_layers(model)
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for layer in module:
                    layer.register_forward_pre_hook(self._before_layer)

    def _before_layer(self, _module: Any, _args: Any) -> None:
        self._check_deadline()

    def _check_deadline(self, done: int | None = None, total: int | None = None) -> None:
        if self._deadline is None or time.monotonic() <= self._deadline:
            return
        raise ScoringTimedOut(f"{self._doing} with {self.name!r} ran past its deadline"
                              f"{self._progress(done, total)}")  # fmt: skip

    _doing = "scoring"

    def _progress(self, done: int | None, total: int | None) -> str:
        return "" if done is None else f" ({done} of {total} texts scored)"


class ModelScorer(_FrozenModel):
    """One score model, frozen: ``score`` turns (prompt, completion) pairs into its scalars."""

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


class ModelJudge(_FrozenModel):
    """One generative judge (a causal LM), frozen: ``generate`` samples texts for prompts."""

    _doing = "judging"

    def _progress(self, done: int | None, total: int | None) -> str:
        return "" if done is None else f" ({done} of {total} prompts judged)"

    def generate(
        self,
        prompts: Sequence[str],
        *,
        samples: int,
        temperature: float,
        max_new_tokens: int,
        max_prompt_tokens: int,
        batch_size: int,
        deadline: float,
        seed: int,
    ) -> list[list[str]]:
        """``samples`` texts for each prompt (the user's turn, in the judge's chat template),
        sampled at ``temperature`` (0: greedy), each at most ``max_new_tokens`` tokens, about
        ``batch_size`` texts per call of the sampler (whole prompts: at least one prompt's
        ``samples``). ``ScoringTimedOut`` past ``deadline``, ``Abandoned`` on a cancel."""
        per_batch = max(1, batch_size // samples)
        device = self.model.device
        ends = end_token_ids(self.tokenizer, self.model)
        out: list[list[str]] = []
        self._deadline = deadline
        try:
            for start in range(0, len(prompts), per_batch):
                stopping.check()
                self._check_deadline(len(out), len(prompts))
                rendered = [self._rendered(p) for p in prompts[start : start + per_batch]]
                rows = [text for text in rendered for _ in range(samples)]
                ids, mask = encode_prompts(self.tokenizer, rows, device)
                ids, mask = ids[:, -max_prompt_tokens:], mask[:, -max_prompt_tokens:]
                # Seeded per batch: a prompt's texts do not depend on the batches before it.
                generator = torch.Generator(device=device).manual_seed(seed + start)
                request = SampleRequest(
                    max_new_tokens=max_new_tokens,
                    eos_id=ends,
                    pad_id=int(self.tokenizer.pad_token_id),
                    temperature=temperature,
                    generator=generator,
                    group_size=samples,
                    should_stop=lambda: time.monotonic() > deadline,
                )
                try:
                    batch = NativeEngine().sample(self.model, ids, mask, request)
                except GenerationStopped:
                    self._check_deadline(len(out), len(prompts))
                    raise
                texts = [
                    str(self.tokenizer.decode(row[:k], skip_special_tokens=True))
                    for row, k in zip(
                        batch.response_ids.tolist(), batch.lengths.tolist(), strict=True
                    )
                ]
                out += [texts[i : i + samples] for i in range(0, len(texts), samples)]
        finally:
            self._deadline = None
        return out

    def _rendered(self, prompt: str) -> str:
        """The prompt as the judge reads it: the user's turn in its chat template, or the plain
        prompt for a model that has none."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            assert isinstance(text, str)
            return text
        return prompt


class ModelScorers:
    """The run's score models and judges, each loaded once, by name: what rewards call through
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
        self.judges: dict[str, ModelJudge] = {}

    def load(self, name: str, field: str = "model") -> ModelScorer:
        """The score model ``name``, loaded on first use; ``field`` (``rewards[1].params.model``)
        is what an error names: the config's place that asked for it."""
        if name not in self.loaded:
            self.loaded[name] = self._load_scorer(name, field)
        return self.loaded[name]

    def load_judge(self, name: str, field: str = "model") -> ModelJudge:
        """The judge (a causal LM) ``name``, loaded on first use; ``field`` as in ``load``."""
        if name not in self.judges:
            model, tokenizer = self._load(name, field, AutoModelForCausalLM, "a judge (causal LM)")
            self.judges[name] = ModelJudge(name, model, tokenizer)
        return self.judges[name]

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

    def generate(
        self,
        name: str,
        prompts: Sequence[str],
        *,
        samples: int,
        temperature: float,
        max_new_tokens: int,
        max_prompt_tokens: int,
        batch_size: int,
        deadline: float,
        seed: int,
    ) -> list[list[str]]:
        """``ModelJudge.generate`` with the judge ``name`` (loaded now if set-up did not)."""
        return self.load_judge(name).generate(
            prompts,
            samples=samples,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            max_prompt_tokens=max_prompt_tokens,
            batch_size=batch_size,
            deadline=deadline,
            seed=seed,
        )

    def _load_scorer(self, name: str, field: str) -> ModelScorer:
        model, tokenizer = self._load(
            name, field, AutoModelForSequenceClassification, "a score model"
        )
        labels = model.config.num_labels
        if labels != 1:
            raise ValueError(
                f"{field} {name!r} is not a reward model: its head gives {labels} scores, a"
                " reward model's one (AutoModelForSequenceClassification, num_labels=1)"
            )
        if model.config.pad_token_id is None:  # batches need it to find each text's last token
            model.config.pad_token_id = tokenizer.pad_token_id
        return ModelScorer(name, model, tokenizer)

    def _load(
        self, name: str, field: str, auto: Any, what: str
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        try:
            path = self.resolve(name)
        except Unavailable as exc:
            raise Unavailable(str(exc).replace("model.name", field, 1)) from None
        local_only = isinstance(path, Path) or hub_offline()
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
            model = auto.from_pretrained(path, dtype=self.dtype, local_files_only=local_only)
        except (OSError, ValueError) as exc:
            raise Unavailable(f"{field} {name!r}: could not load it as {what} ({exc})") from None
        if tokenizer.pad_token is None:  # many causal LMs ship without one
            tokenizer.pad_token = tokenizer.eos_token
        model = model.to(self.device)
        stopping.check()
        return model, tokenizer


def load_reward_models(
    cfg: RunConfig, resolve: Callable[[str], Path | str], device: torch.device, dtype: torch.dtype
) -> ModelScorers | None:
    """The score models and judges ``cfg``'s rewards name, loaded (None: they name none), so
    that a name the store refuses, or a model that is not what its reward calls, fails the run
    at set-up at its field (``rewards[1].params.model``), not each step."""
    uses = model_uses(cfg)
    if not uses:
        return None
    scorers = ModelScorers(resolve, device, dtype)
    for loc, name, use in uses:
        if use == "generate":
            scorers.load_judge(name, field_name(loc))
        else:
            scorers.load(name, field_name(loc))
    return scorers
