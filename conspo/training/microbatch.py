"""Micro-batches: a mini-batch split so that one forward/backward pass stays under a token budget
(``optim.micro_batch_tokens``), and what a micro-batch's forward sees.

A micro-batch's cost is its padded size, rows × (longest real prompt + longest response), the
positions its forward runs after ``trimmed`` drops the columns that are padding in every row.
Whole groups go together where the budget allows (so their prompt runs once,
conspo.generation.forward's shared-prompt path); a group over the budget alone is split by rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from conspo.generation.batch import RolloutBatch


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


# What one more forward costs beyond its tokens, in token positions (the per-layer calls, and
# smaller matmuls running below the machine's best rate): a length bucket must save more
# padding than this to be split off.
BUCKET_OVERHEAD_TOKENS = 64
# The longest run of groups the search tries as one piece: it bounds the search's cost at
# thousands of groups (longer runs are then cut in pieces that cost the overhead more).
BUCKET_MAX_GROUPS = 256


def length_buckets(batch: RolloutBatch, group_size: int) -> list[torch.Tensor]:
    """Row indices (into ``batch``, (k,) long on the CPU) of whole groups of similar answer
    length, or of one group's rows, covering every row once: the pieces one gradient pass runs
    its forwards on, so that a batch whose answers end at 15 tokens but for one at 128 does not
    run every row 128 long.

    A piece's cost is its padded positions: groups x longest real prompt (each group's prompt
    runs once) + rows x longest response, plus ``BUCKET_OVERHEAD_TOKENS``. First, a group whose
    longest answers run far past the rest (an answer cut at ``max_new_tokens`` among short
    ones) is split in two pieces of its own, its shorter rows and its longer ones, when that
    costs less than the group alone (its prompt then runs twice, each piece sharing it across
    its rows). The other groups are sorted by their longest response and cut into consecutive
    runs of least total cost (dynamic programming over the cut points); one piece when
    splitting saves nothing.
    """
    n = batch.response_ids.shape[0]
    g = group_size if group_size > 1 and n % group_size == 0 else 1
    prompt_len = batch.prompt_mask.sum(-1).cpu().view(-1, g).max(-1).values.tolist()
    response_len = batch.response_mask.sum(-1).cpu().long().clamp(min=1).view(-1, g).tolist()
    split: list[list[int]] = []
    whole: list[int] = []  # groups left for the search
    for group, lengths in enumerate(response_len):
        rows = sorted(range(g), key=lambda i: lengths[i])
        at = _group_cut([lengths[i] for i in rows], prompt_len[group])
        if at:
            split += [sorted(group * g + i for i in part) for part in (rows[:at], rows[at:])]
        else:
            whole.append(group)
    longest = [max(response_len[group]) for group in whole]
    order = sorted(range(len(whole)), key=lambda i: longest[i])
    # best[k]: the least cost of the first k groups in ``order``; cut[k]: where its last run starts
    best = [0.0] + [math.inf] * len(order)
    cut = [0] * (len(order) + 1)
    for k in range(1, len(order) + 1):
        widest_prompt = 0
        for j in range(k, max(0, k - BUCKET_MAX_GROUPS), -1):  # last run: order[j-1 .. k-1]
            widest_prompt = max(widest_prompt, prompt_len[whole[order[j - 1]]])
            groups = k - j + 1
            run = groups * widest_prompt + groups * g * longest[order[k - 1]]
            cost = best[j - 1] + run + BUCKET_OVERHEAD_TOKENS
            if cost < best[k]:
                best[k], cut[k] = cost, j - 1
    pieces: list[list[int]] = []
    k = len(order)
    while k > 0:
        pieces.append(sorted(whole[i] for i in order[cut[k] : k]))
        k = cut[k]
    rows_of = [[group * g + i for group in piece for i in range(g)] for piece in reversed(pieces)]
    return [torch.tensor(rows) for rows in rows_of + split]


def _group_cut(lengths: list[int], prompt_len: int) -> int:
    """Where one group's ascending answer ``lengths`` are best cut in two pieces (the first
    ``cut`` rows, then the rest), or 0 when running the group whole costs no more."""
    g = len(lengths)
    whole = prompt_len + g * lengths[-1] + BUCKET_OVERHEAD_TOKENS
    best, where = whole, 0
    for cut in range(1, g):
        two = 2 * (prompt_len + BUCKET_OVERHEAD_TOKENS) + cut * lengths[cut - 1]
        two += (g - cut) * lengths[-1]
        if two < best:
            best, where = two, cut
    return where


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
        None if batch.observation_mask is None else batch.observation_mask[:, :t],
        batch.tool_calls,
        batch.tool_seconds,
    )


def piece_group_size(idx: torch.Tensor, g: int) -> int:
    """The prompt-sharing group size of a micro-batch: G for whole groups; a piece of one group
    shares its prompt across all its rows (token_logprobs checks either claim)."""
    return len(idx) if len(idx) < g else g
