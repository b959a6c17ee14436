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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel


@dataclass
class RolloutBatch:
    prompt_ids: torch.Tensor  # (N, P) left-padded with pad_id
    prompt_mask: torch.Tensor  # (N, P) long, 1 on prompt tokens
    response_ids: torch.Tensor  # (N, T') right-padded with pad_id, T' <= T
    response_mask: torch.Tensor  # (N, T') float, 1 on response tokens incl. EOS, 0 on padding
    lengths: torch.Tensor  # (N,) long, response tokens incl. EOS
    truncated: torch.Tensor  # (N,) bool, hit max_new_tokens without EOS

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The rollouts at ``rows`` ((N,) bool mask or index tensor on the batch's device)."""
        return RolloutBatch(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.response_ids[rows],
            self.response_mask[rows],
            self.lengths[rows],
            self.truncated[rows],
        )

    def to(self, device: torch.device) -> RolloutBatch:
        return RolloutBatch(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.response_ids.to(device),
            self.response_mask.to(device),
            self.lengths.to(device),
            self.truncated.to(device),
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

    @property
    def stop_ids(self) -> list[int]:
        return [self.eos_id] if isinstance(self.eos_id, int) else list(self.eos_id)


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

    def sync(self, model: PreTrainedModel) -> None:
        """Make the engine sample from ``model``'s current weights (after an update)."""
        ...
