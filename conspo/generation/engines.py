"""Generation engines: what samples rollouts (``sampling.engine``), behind one interface.

    engine = make_engine(cfg.sampling, model_path, dtype)
    batch = engine.sample(model, prompt_ids, prompt_mask, SampleRequest(max_new_tokens=..., ...))
    ...                      # the optimiser updates the model
    engine.sync(model)       # once per step, after the update

* ``native``: ``conspo.generation.rollout.sample``, this library's KV-cache sampler (shared-prompt
prefill).
* ``hf``: transformers' ``model.generate``.
* ``vllm``: vLLM in a process of its own (``conspo.generation.vllm_engine``), started on first
  use from the model's directory, the policy's weights pushed into it after every update.

Every engine returns the same ``RolloutBatch`` (response after the first EOS masked, lengths,
truncated), so the rest of the training loop and evaluation do not know which one ran. Each draws
its randomness from ``generator``, so a step's rollouts are a function of the step's seed.
Temperature 0 is greedy decoding in all three.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from conspo import stopping
from conspo.config import SamplingConfig
from conspo.generation.batch import Engine, RolloutBatch, SampleRequest
from conspo.generation.rollout import draw_seed, finish_responses, sample
from conspo.generation.tool_rollout import ToolUse, generate_with_tools, sample_with_tools
from conspo.generation.vllm_engine import VllmEngine
from conspo.generation.vllm_interpreter import vllm_available


class NativeEngine:
    """``conspo.generation.rollout.sample``: it reads the model's weights directly, so nothing to
    sync."""

    def sample(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
    ) -> RolloutBatch:
        return sample(
            model,
            prompt_ids,
            prompt_mask,
            max_new_tokens=request.max_new_tokens,
            eos_id=request.eos_id,
            pad_id=request.pad_id,
            temperature=request.temperature,
            top_p=request.top_p,
            generator=request.generator,
            group_size=request.group_size,
            should_stop=request.should_stop,
        )

    def sample_with_tools(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        use: ToolUse,
    ) -> RolloutBatch:
        """Rollouts that may call tools, the KV cache extended by their output
        (``conspo.generation.tool_rollout.sample_with_tools``)."""
        return sample_with_tools(model, prompt_ids, prompt_mask, request, use)

    def sync(self, model: PreTrainedModel) -> None:
        pass

    def close(self) -> None:
        pass


class HfEngine:
    """transformers' ``generate``: slower per token than ``native`` on small models, but any
    model (and any cache implementation) that ``generate`` supports works. ``group_size`` is
    not used: ``generate`` prefills every row's prompt."""

    def sample(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
    ) -> RolloutBatch:
        response = self._generate(model, prompt_ids, prompt_mask, request)
        return finish_responses(prompt_ids, prompt_mask, response, request.eos_id, request.pad_id)

    def sample_with_tools(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        use: ToolUse,
    ) -> RolloutBatch:
        """Rollouts that may call tools: one ``generate`` per turn over each row's prefix
        (``conspo.generation.tool_rollout.generate_with_tools``)."""

        def turn(
            ids: torch.Tensor, mask: torch.Tensor, room: int, stop_strings: list[str]
        ) -> torch.Tensor:
            asked = replace(request, max_new_tokens=room)
            return self._generate(model, ids, mask, asked, stop_strings, use.tokenizer)

        return generate_with_tools(model, prompt_ids, prompt_mask, request, use, turn)

    @staticmethod
    def _generate(
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        stop_strings: list[str] | None = None,
        tokenizer: Any = None,
    ) -> torch.Tensor:
        """(N, T') new tokens, pad_id after a row's end (an EOS, or one of ``stop_strings``)."""
        # A fresh generation config, not the checkpoint's generation_config.json: its top_k,
        # repetition penalty or preset temperature would sample from another distribution than
        # the policy π_θ at `temperature` whose log-probs the objective uses.
        greedy = request.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else request.temperature,
            top_p=None if greedy else request.top_p,
            top_k=None,
            max_new_tokens=request.max_new_tokens,
            pad_token_id=request.pad_id,
            eos_token_id=request.eos_id,
            stop_strings=stop_strings or None,
        )
        device = prompt_ids.device
        # generate draws from the global RNG; fork it so the draw is reproducible from the step's
        # seed and leaves the caller's random state untouched.
        devices = [device.index or torch.cuda.current_device()] if device.type == "cuda" else []
        extra = {"tokenizer": tokenizer} if stop_strings else {}
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(draw_seed(request.generator))
            # PreTrainedModel does not declare generate (GenerationMixin, or peft, provides it):
            # mypy resolves the name through nn.Module.__getattr__.
            out = model.generate(  # type: ignore[operator]
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                generation_config=config,
                stopping_criteria=StoppingCriteriaList([_AbandonCheck()]),
                **extra,
            )
        return out[:, prompt_ids.shape[1] :]  # (N, T'), pad_id after a row's EOS

    def sync(self, model: PreTrainedModel) -> None:
        pass

    def close(self) -> None:
        pass


EngineFactory = Callable[[SamplingConfig, Path | str, torch.dtype], Engine]

ENGINES: dict[str, EngineFactory] = {
    "native": lambda sampling, path, dtype: NativeEngine(),
    "hf": lambda sampling, path, dtype: HfEngine(),
    "vllm": VllmEngine,
}


def make_engine(sampling: SamplingConfig, model_path: Path | str, dtype: torch.dtype) -> Engine:
    """The engine ``sampling.engine`` names, for the model at ``model_path`` in ``dtype``."""
    if sampling.engine == "vllm" and not vllm_available():
        raise RuntimeError(
            "sampling.engine is 'vllm' but vllm is not installed here: run `make vllm`"
            " (.venv-vllm) or set CONSPO_VLLM_PYTHON"
        )
    return ENGINES[sampling.engine](sampling, model_path, dtype)


class _AbandonCheck(StoppingCriteria):
    """Asks ``conspo.stopping.check`` after every token of Hugging Face's generate (which raises
    out of it when the run is abandoned); never stops a row itself."""

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        stopping.check()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
