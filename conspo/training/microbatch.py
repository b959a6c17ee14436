"""Micro-batches: a mini-batch split so that one forward/backward pass stays under a token budget
(``optim.micro_batch_tokens``), and what a micro-batch's forward sees.

A micro-batch's cost is its padded size, rows × (longest real prompt + longest response), the
positions its forward runs after ``trimmed`` drops the columns that are padding in every row.
Whole groups go together where the budget allows (so their prompt runs once,
conspo.generation.forward's shared-prompt path); a group over the budget alone is split by rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from conspo.generation.rollout import RolloutBatch


def micro_batches(batch: RolloutBatch, group_size: int, budget: int) -> list[torch.Tensor]:
    """Row indices (into ``batch``, (k,) long on the CPU) of each micro-batch, in order, covering
    every row once. ``budget`` 0: one micro-batch of every row. A single row over the budget is
    a micro-batch of its own (rows are never cut)."""
    n = batch.response_ids.shape[0]
    if budget == 0:
        return [torch.arange(n)]
    prompt_len = batch.prompt_mask.sum(-1).cpu()
    response_len = batch.response_mask.sum(-1).cpu().long().clamp(min=1)

    def cost(rows: list[int]) -> int:
        if not rows:
            return 0
        return len(rows) * int(prompt_len[rows].max() + response_len[rows].max())

    pieces: list[list[int]] = []
    current: list[int] = []
    for start in range(0, n, group_size):
        group = list(range(start, min(start + group_size, n)))
        if cost(current + group) <= budget:
            current += group
            continue
        if current:
            pieces.append(current)
            current = []
        if cost(group) <= budget:
            current = group
        else:
            pieces += _split_rows(group, cost, budget)
    if current:
        pieces.append(current)
    return [torch.tensor(p) for p in pieces]


def _split_rows(rows: list[int], cost: Callable[[list[int]], int], budget: int) -> list[list[int]]:
    pieces: list[list[int]] = [[]]
    for row in rows:
        if pieces[-1] and cost(pieces[-1] + [row]) > budget:
            pieces.append([])
        pieces[-1].append(row)
    return pieces


def trimmed(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` without the prompt columns that are padding in every row (on the left) and the
    response columns past its longest response (on the right): the same log-probs, fewer
    positions. At least one response column is kept."""
    p = int(batch.prompt_mask.sum(-1).max())
    t = max(1, int(batch.response_mask.sum(-1).max()))
    width = batch.prompt_ids.shape[1]
    return RolloutBatch(
        batch.prompt_ids[:, width - p :],
        batch.prompt_mask[:, width - p :],
        batch.response_ids[:, :t],
        batch.response_mask[:, :t],
        batch.lengths,
        batch.truncated,
    )
