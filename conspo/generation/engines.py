"""Generation engines: what samples rollouts (``sampling.engine``), behind one interface.

    engine = make_engine(cfg.sampling, model_path, dtype)
    batch = engine.sample(model, prompt_ids, prompt_mask, SampleRequest(max_new_tokens=..., ...))
    ...                      # the optimiser updates the model
    engine.sync(model)       # once per step, after the update

* ``native``: ``conspo.generation.rollout.sample``, this library's KV-cache sampler (shared-prompt
prefill).
* ``hf``: transformers' ``model.generate``.
* ``vllm``: a vLLM engine colocated on the training GPU, built on first use from the model's
  directory, its weights replaced by the policy's after every update.

Every engine returns the same ``RolloutBatch`` (response after the first EOS masked, lengths,
truncated), so the rest of the training loop and evaluation do not know which one ran. Each draws
its randomness from ``generator``, so a step's rollouts are a function of the step's seed.
Temperature 0 is greedy decoding in all three.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from conspo.config import SamplingConfig
from conspo.generation.batch import Engine, RolloutBatch, SampleRequest
from conspo.generation.rollout import finish_responses, sample
from conspo.generation.tool_rollout import ToolUse, generate_with_tools, sample_with_tools


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


def _draw_seed(generator: torch.Generator | None) -> int:
    """A seed drawn from ``generator`` (advancing it), so engines that seed their own random
    state stay a function of the step's seed; None: a fresh random seed."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(2**62, (1,), generator=generator, device=device).item())


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
            torch.manual_seed(_draw_seed(request.generator))
            # PreTrainedModel does not declare generate (GenerationMixin, or peft, provides it):
            # mypy resolves the name through nn.Module.__getattr__.
            out = model.generate(  # type: ignore[operator]
                input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config, **extra
            )
        return out[:, prompt_ids.shape[1] :]  # (N, T'), pad_id after a row's EOS

    def sync(self, model: PreTrainedModel) -> None:
        pass


class VllmEngine:
    """vLLM on the training GPU (colocated), taking ``sampling.vllm_memory_fraction`` of its
    memory. Built on the first ``sample`` from the model's directory and dtype; ``sync`` pushes
    the policy's weights into it (LoRA adapters merged for the copy, then unmerged).

    The in-process engine (``distributed_executor_backend="external_launcher"``, as TRL's
    colocate mode) is what makes its model reachable for ``load_weights``.
    """

    def __init__(self, sampling: SamplingConfig, model_path: Path | str, dtype: torch.dtype):
        self.memory_fraction = sampling.vllm_memory_fraction
        self.model_path = str(model_path)
        self.dtype = dtype
        self._llm: Any = None
        # The policy's weights differ from vLLM's copy: true at first too, since a resumed run's
        # policy comes from a checkpoint, not from model_path.
        self._stale = True

    def _engine(self) -> Any:
        if self._llm is None:
            from vllm import LLM

            # external_launcher reads the torch.distributed variables of a one-process group.
            for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
                os.environ.setdefault(name, value)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            self._llm = LLM(
                model=self.model_path,
                dtype=str(self.dtype).removeprefix("torch."),
                gpu_memory_utilization=self.memory_fraction,
                distributed_executor_backend="external_launcher",
                seed=0,
            )
        return self._llm

    def sample(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
    ) -> RolloutBatch:
        from vllm import SamplingParams

        n = prompt_ids.shape[0]
        llm = self._engine()
        if self._stale:
            self._push_weights(model)
        g = request.group_size if request.group_size > 1 and n % request.group_size == 0 else 1
        # One request per prompt asking for its G samples; each request seeded from `generator`.
        requests = [
            {"prompt_token_ids": ids[mask.bool()].tolist()}
            for ids, mask in zip(prompt_ids[::g].cpu(), prompt_mask[::g].cpu(), strict=True)
        ]
        params = [
            SamplingParams(
                n=g,
                temperature=request.temperature,
                top_p=request.top_p,
                max_tokens=request.max_new_tokens,
                stop_token_ids=request.stop_ids,
                ignore_eos=False,
                seed=_draw_seed(request.generator),
            )
            for _ in requests
        ]
        outputs = llm.generate(requests, sampling_params=params, use_tqdm=False)
        rows = [list(done.token_ids) for out in outputs for done in out.outputs]
        response = _right_padded(rows, request.pad_id, prompt_ids.device)
        return finish_responses(prompt_ids, prompt_mask, response, request.eos_id, request.pad_id)

    def sample_with_tools(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        use: ToolUse,
    ) -> RolloutBatch:
        raise NotImplementedError("the vllm engine does not pause at tool calls here")

    def sync(self, model: PreTrainedModel) -> None:
        # Pushed by the next sample: a run that stops after this update never needs them.
        self._stale = True

    def _push_weights(self, model: PreTrainedModel) -> None:
        runner = self._llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights(_merged_weights(model))
        self._llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        self._stale = False


def _merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the policy's weights under the checkpoint's names; a peft model's
    adapters are merged into its base weights for the copy and unmerged after."""
    if not hasattr(model, "merge_adapter"):
        for name, param in model.named_parameters():
            yield name, param.data
        return
    model.merge_adapter()
    try:
        for name, param in model.named_parameters():
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if model.prefix in name or "original_module" in name:  # adapters: merged already
                continue
            yield name.replace("modules_to_save.default.", ""), param.data
    finally:
        model.unmerge_adapter()


def _right_padded(rows: list[list[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


EngineFactory = Callable[[SamplingConfig, Path | str, torch.dtype], Engine]

ENGINES: dict[str, EngineFactory] = {
    "native": lambda sampling, path, dtype: NativeEngine(),
    "hf": lambda sampling, path, dtype: HfEngine(),
    "vllm": VllmEngine,
}


def make_engine(sampling: SamplingConfig, model_path: Path | str, dtype: torch.dtype) -> Engine:
    """The engine ``sampling.engine`` names, for the model at ``model_path`` in ``dtype``."""
    if sampling.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise RuntimeError("sampling.engine is 'vllm' but the vllm package is not installed here")
    return ENGINES[sampling.engine](sampling, model_path, dtype)
