"""What generation hands the rest of the library: the ``RolloutBatch`` every engine returns, the
``SampleRequest`` it is asked with, and the ``Engine`` protocol itself.

    request = SampleRequest(max_new_tokens=64, eos_id=end_ids, pad_id=pad, temperature=1.0,
                            generator=g, group_size=8)
    batch = engine.sample(model, prompt_ids, prompt_mask, request)

Types only, no behaviour beyond selecting rows: the sampler (``rollout``), the engines
(``engines``), the forward passes (``forward``) and the trainer all import from here, so none of
them imports another for a type.

Shapes: N rollouts, P prompt positions (left-padded), T = max_new_tokens response positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel


@dataclass(frozen=True)
class CallRecord:
    """One tool call a rollout made: which tool, how it ended, how long it took and how many
    observation tokens it added (``conspo.generation.tool_rollout``)."""

    tool: str
    status: str  # ok / error / timeout (conspo.tools.base.Status)
    seconds: float
    observation_tokens: int


@dataclass
class RolloutBatch:
    prompt_ids: torch.Tensor  # (N, P) left-padded with pad_id
    prompt_mask: torch.Tensor  # (N, P) long, 1 on prompt tokens
    response_ids: torch.Tensor  # (N, T') right-padded with pad_id, T' <= T
    response_mask: torch.Tensor  # (N, T') float, 1 on response tokens incl. EOS, 0 on padding
    lengths: torch.Tensor  # (N,) long, response tokens incl. EOS
    truncated: torch.Tensor  # (N,) bool, hit max_new_tokens without EOS
    # Rollouts with tools: (N, T') float, 1 on the tokens a tool's output put there (the
    # interpreter's), which the model did not write; None: every response token is the model's.
    observation_mask: torch.Tensor | None = None
    # Rollouts with tools: each row's calls, in order (None: a run without tools).
    tool_calls: list[list[CallRecord]] | None = None
    tool_seconds: float = 0.0  # wall time generation waited for tools
    # (N, T') float: the log-probs the engine reported for the tokens it sampled, under the
    # distribution it sampled from (vllm); None where the engine reports none (native, hf).
    sampled_logprobs: torch.Tensor | None = None
    # Rollouts that play an environment (``conspo.environments``): (N, T') long, the turn (0, 1,
    # …) each of the model's tokens belongs to, -1 on observation tokens and padding; and each
    # row's ``Episode`` as played. None: a run without an environment.
    turn_index: torch.Tensor | None = None
    episodes: list[Any] | None = None

    @property
    def model_mask(self) -> torch.Tensor:
        """(N, T') float, 1 on the tokens the model wrote (EOS included): what every loss,
        score, entropy, KL and length normalisation counts. Observation tokens are context the
        model reads, never tokens it is trained or scored on."""
        if self.observation_mask is None:
            return self.response_mask
        return self.response_mask * (1 - self.observation_mask)

    @property
    def model_lengths(self) -> torch.Tensor:
        """(N,) long: the tokens each rollout's model wrote (``lengths`` less observations)."""
        if self.observation_mask is None:
            return self.lengths
        return self.model_mask.sum(-1).long()

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The rollouts at ``rows`` ((N,) bool mask or index tensor on the batch's device)."""
        picked = (rows.nonzero().squeeze(1) if rows.dtype == torch.bool else rows).tolist()
        calls = None if self.tool_calls is None else [self.tool_calls[i] for i in picked]
        episodes = None if self.episodes is None else [self.episodes[i] for i in picked]
        return RolloutBatch(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.response_ids[rows],
            self.response_mask[rows],
            self.lengths[rows],
            self.truncated[rows],
            None if self.observation_mask is None else self.observation_mask[rows],
            calls,
            self.tool_seconds,
            None if self.sampled_logprobs is None else self.sampled_logprobs[rows],
            None if self.turn_index is None else self.turn_index[rows],
            episodes,
        )

    def to(self, device: torch.device) -> RolloutBatch:
        return RolloutBatch(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.response_ids.to(device),
            self.response_mask.to(device),
            self.lengths.to(device),
            self.truncated.to(device),
            None if self.observation_mask is None else self.observation_mask.to(device),
            self.tool_calls,
            self.tool_seconds,
            None if self.sampled_logprobs is None else self.sampled_logprobs.to(device),
            None if self.turn_index is None else self.turn_index.to(device),
            self.episodes,
        )


@dataclass(frozen=True)
class SampleRequest:
    """How to sample one response per prompt row: every engine reads the same fields.

    ``eos_id``: the token, or every token (``rollout.end_token_ids``), that ends a response;
    ``temperature`` 0 is greedy decoding; ``generator`` is where all randomness comes from, so a
    step's rollouts are a function of its seed; with ``group_size`` G > 1 the rows come in runs
    of G copies of one prompt (an engine may prefill it once)."""

    max_new_tokens: int
    eos_id: int | Sequence[int]
    pad_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    group_size: int = 1
    # Asked every ``STOP_CHECK_COLUMNS`` tokens and between tool turns by the native engine: when
    # it answers True the engine raises ``GenerationStopped`` (a cancel lands inside a long
    # generation, not after it). None: never asked (evaluation; a process group, whose ranks
    # must stop at the same step boundary).
    should_stop: Callable[[], bool] | None = None
    # The example each row answers (``conspo.tasks.Example``): what an environment run's rows
    # play (``conspo.generation.tool_rollout.ToolEngine``); None where no engine needs them.
    examples: Sequence[Any] | None = None

    @property
    def stop_ids(self) -> list[int]:
        return [self.eos_id] if isinstance(self.eos_id, int) else list(self.eos_id)


# How many generated tokens pass between two ``SampleRequest.should_stop`` calls. A count, not a
# clock, so every rank of a distributed run asks at the same token (the answer is agreed by a
# collective: one scalar all-reduce, small beside 8 decode steps). In a distributed run this is
# the only place a cancel lands inside generation (``conspo.stopping`` is not installed there),
# and 32 columns of SmolLM2's 8 x 8 rollouts take ~10 s on a loaded 2-core CPU.
STOP_CHECK_COLUMNS = 8


class GenerationStopped(Exception):
    """``SampleRequest.should_stop`` fired during generation: the rollouts were not finished."""


class Engine(Protocol):
    def sample(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
    ) -> RolloutBatch:
        """One response per row of ``prompt_ids`` (N, P), left-padded, as ``request`` asks."""
        ...

    def sample_with_tools(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        use: Any,
    ) -> RolloutBatch:
        """``sample``, the rows pausing at tool calls (``use``: a
        ``conspo.generation.tool_rollout.ToolUse``) and their output fed back as observation
        tokens (``RolloutBatch.observation_mask``)."""
        ...

    def sync(self, model: PreTrainedModel) -> None:
        """Make the engine sample from ``model``'s current weights (after an update)."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond this process's memory (vllm: its process)."""
        ...
