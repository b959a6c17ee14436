"""Separation statistics: how well log-prob scores order correct above wrong rollouts (§4).

``separation_stats`` is computed every step on log-prob scores s_θ whatever the objective, so GRPO
and ConSPO runs are comparable on one axis (docs/objectives.md §4).

Averaging: every group-level quantity (mean s⁺, the fraction of ordered pairs, mean P⁺, ...) is
first computed *within* each valid group (0 < N⁺ < G) and then averaged with equal weight over
the valid groups of the batch. Pair-level fractions are therefore per-group fractions averaged
over groups, not a pooled count of all pairs in the batch, so a group with 7 positives and 1
negative weighs as much as one with 4 and 4 (the same weighting as ConSPO's batch loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from conspo import metrics
from conspo.environments.base import Episode
from conspo.generation.batch import CallRecord
from conspo.objectives.base import (
    POSITIVE_THRESHOLD,
    dense_group_index,
    positive_mask,
    token_ratio,
)


def _padded(values: torch.Tensor, idx: torch.Tensor, n_groups: int, size: int) -> torch.Tensor:
    """Scatter (B,) ``values`` into a (n_groups, size) layout, one row per group (0-padded)."""
    order = torch.argsort(idx, stable=True)
    sorted_idx = idx[order]
    counts = torch.bincount(idx, minlength=n_groups)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(idx.shape[0], device=idx.device) - starts[sorted_idx]
    out = values.new_zeros((n_groups, size))
    out[sorted_idx, slot] = values[order]
    return out


def _mean_over_valid(per_group: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """0-d mean of (K,) ``per_group`` over ``valid`` groups; NaN when there is none."""
    return per_group[valid].mean()  # the mean of an empty tensor is NaN: a gap in the chart


def separation_stats(
    scores: torch.Tensor,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    lengths: torch.Tensor,
    *,
    margin: float,
    tau: float,
    clipped_scores: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The §4 statistics of one batch as detached 0-d tensors, keyed by ``conspo.metrics``.

    scores: (B,) log-prob scores s_θ (detached or not; never differentiated); rewards: (B,);
    group_ids: (B,) arbitrary integers; lengths: (B,) response tokens incl. EOS; margin: the
    current m_t; tau: ConSPO's τ; clipped_scores: (B,) GRPO's clipped-ratio scores, or None.

    With P_i⁺ = e^{ŝ_i/τ}/Z_i, P_ij⁻ = e^{s_j⁻/τ}/Z_i (ŝ_i = s_i⁺ − m, Eq. 13 of
    arXiv:2605.12969), the hard-negative share max_j P_ij⁻ / Σ_j P_ij⁻ does not depend on i
    (Z_i cancels): it is the largest softmax weight over the group's negatives at temperature τ.

    Group-averaged keys (sep/*, conspo/p_pos*, conspo/hard_neg_share, grpo/*) are NaN when the
    batch has no valid group; conspo/margin is the schedule's value and is always given;
    grpo/clip_gap is 0 when ``clipped_scores`` is None. batch/pass_rate, len/pos and len/neg are
    over all rollouts of the batch (NaN for a class with no rollout); the counts are always given.
    """
    dtype = torch.promote_types(scores.dtype, torch.float32)
    device = scores.device
    b = scores.shape[0]
    pos = positive_mask(rewards)
    lengths = lengths.to(dtype)
    out: dict[str, torch.Tensor] = {
        metrics.CONSPO_MARGIN: torch.tensor(margin, dtype=dtype, device=device),
        metrics.BATCH_PASS_RATE: pos.to(dtype).mean(),
        metrics.LEN_POS: lengths[pos].mean(),
        metrics.LEN_NEG: lengths[~pos].mean(),
    }
    idx = dense_group_index(group_ids)
    # One host sync for the layout's shape; this runs on detached scores once per step.
    n_groups = int(idx.max()) + 1 if b else 0
    size = int(torch.bincount(idx).max()) if b else 0

    s = _padded(scores.detach().to(dtype), idx, n_groups, size)  # (K, Gmax)
    is_pos = _padded(pos, idx, n_groups, size)  # (K, Gmax) bool, False on padding
    is_neg = _padded(~pos, idx, n_groups, size)
    n_pos = is_pos.sum(1).to(dtype)  # (K,)
    n_neg = is_neg.sum(1).to(dtype)
    valid = (n_pos > 0) & (n_neg > 0)
    out[metrics.BATCH_VALID_GROUPS] = valid.sum().to(dtype)
    out[metrics.BATCH_ALL_POS_GROUPS] = ((n_pos > 0) & (n_neg == 0)).sum().to(dtype)
    out[metrics.BATCH_ALL_NEG_GROUPS] = ((n_neg > 0) & (n_pos == 0)).sum().to(dtype)

    zero = s.new_zeros(())
    mean_pos = torch.where(is_pos, s, zero).sum(1) / n_pos.clamp_min(1)
    mean_neg = torch.where(is_neg, s, zero).sum(1) / n_neg.clamp_min(1)
    min_pos = torch.where(is_pos, s, math.inf).amin(1)
    max_neg = torch.where(is_neg, s, -math.inf).amax(1)

    pairs = is_pos[:, :, None] & is_neg[:, None, :]  # (K, Gmax⁺, Gmax⁻): i positive, j negative
    n_pairs = (n_pos * n_neg).clamp_min(1)
    ordered = (s[:, :, None] > s[:, None, :]) & pairs
    margin_ordered = ((s[:, :, None] - margin) > s[:, None, :]) & pairs

    neg_logits = torch.where(is_neg, s / tau, -math.inf)
    lse_neg = torch.logsumexp(neg_logits, 1)  # (K,) log Σ_j e^{s_j⁻/τ}; -inf without negatives
    pos_logits = (s - margin) / tau
    p_pos = torch.exp(pos_logits - torch.logaddexp(pos_logits, lse_neg[:, None]))  # P_i⁺
    p_hat = n_pos / (n_pos + n_neg).clamp_min(1)

    per_group = {
        metrics.SEP_POS_SCORE: mean_pos,
        metrics.SEP_NEG_SCORE: mean_neg,
        metrics.SEP_GAP: mean_pos - mean_neg,
        metrics.SEP_GAP_MIN: min_pos - max_neg,
        metrics.SEP_ORDER_ACC: ordered.sum((1, 2)).to(dtype) / n_pairs,
        metrics.SEP_MARGIN_ACC: margin_ordered.sum((1, 2)).to(dtype) / n_pairs,
        metrics.CONSPO_P_POS: torch.where(is_pos, p_pos, zero).sum(1) / n_pos.clamp_min(1),
        metrics.CONSPO_P_POS_UNIFORM: 1.0 / (1.0 + n_neg),
        metrics.CONSPO_HARD_NEG_SHARE: torch.exp(max_neg / tau - lse_neg),
        metrics.GRPO_WEIGHT: torch.sqrt(p_hat * (1 - p_hat)),
    }
    if clipped_scores is not None:
        c = _padded(clipped_scores.detach().to(dtype), idx, n_groups, size)
        clip_pos = torch.where(is_pos, c, zero).sum(1) / n_pos.clamp_min(1)
        clip_neg = torch.where(is_neg, c, zero).sum(1) / n_neg.clamp_min(1)
        per_group[metrics.GRPO_CLIP_GAP] = clip_pos - clip_neg
    else:
        out[metrics.GRPO_CLIP_GAP] = s.new_zeros(())
    for key, values in per_group.items():
        out[key] = _mean_over_valid(values, valid)
    return {key: out[key] for key in metrics.SEPARATION_KEYS}


def offpolicy_stats(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> dict[str, torch.Tensor]:
    """How far one update's π_θ is from the π_old that sampled, as detached 0-d tensors.

    logprobs, old_logprobs, mask: (B, T); ``old_logprobs=None`` is one update per rollout batch
    (ρ = 1). Over response tokens: the mean, largest and smallest ratio ρ_t, and the fractions
    below 1 − clip_low and above 1 + clip_high (outside the trust region, whatever the advantage's
    sign: how off-policy the update was, not which clip was active; that is grpo/clip_frac).
    """
    ratio = token_ratio(logprobs.detach(), old_logprobs, mask).float()
    tokens = mask > 0  # every rollout has one at least (its EOS or its truncated last token)
    n = tokens.sum().clamp_min(1)
    return {
        metrics.OFFPOLICY_RATIO_MEAN: torch.where(tokens, ratio, 0.0).sum() / n,
        metrics.OFFPOLICY_RATIO_MAX: torch.where(tokens, ratio, -math.inf).amax(),
        metrics.OFFPOLICY_RATIO_MIN: torch.where(tokens, ratio, math.inf).amin(),
        metrics.OFFPOLICY_CLIP_LOW: ((ratio < 1 - clip_low) & tokens).sum() / n,
        metrics.OFFPOLICY_CLIP_HIGH: ((ratio > 1 + clip_high) & tokens).sum() / n,
    }


def tool_stats(calls: list[list[CallRecord]], correct: list[float]) -> dict[str, float]:
    """The step's tool use (``conspo.generation.tool_rollout``): calls per rollout overall and
    by outcome, the pass rate of rollouts that called and of those that did not (does calling
    pay?), how calls ended, turns and interpreter tokens. ``calls``: each rollout's calls;
    ``correct``: its verified outcome. Host lists: nothing here touches a device. A mean over
    nothing (no correct rollout, no call) is NaN: there is nothing to say."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    counts = [float(len(c)) for c in calls]
    positive = [c > 0.5 for c in correct]
    called = [n > 0 for n in counts]
    every_call = [call for row in calls for call in row]
    status = [call.status for call in every_call]
    return {
        metrics.TOOLS_CALLS: mean(counts),
        metrics.TOOLS_CALLS_POS: mean([n for n, p in zip(counts, positive, strict=True) if p]),
        metrics.TOOLS_CALLS_NEG: mean([n for n, p in zip(counts, positive, strict=True) if not p]),
        metrics.TOOLS_CALL_RATE: mean([float(c) for c in called]),
        metrics.TOOLS_ACC_WITH_CALL: mean(
            [float(p) for p, c in zip(positive, called, strict=True) if c]
        ),
        metrics.TOOLS_ACC_WITHOUT_CALL: mean(
            [float(p) for p, c in zip(positive, called, strict=True) if not c]
        ),
        metrics.TOOLS_OK_RATE: mean([float(s == "ok") for s in status]),
        metrics.TOOLS_ERROR_RATE: mean([float(s == "error") for s in status]),
        metrics.TOOLS_TIMEOUT_RATE: mean([float(s == "timeout") for s in status]),
        metrics.TOOLS_TURNS: mean([n + 1 for n in counts]),
        metrics.TIME_SANDBOX_S: sum(call.seconds for call in every_call),
        metrics.TOOLS_OBSERVATION_TOKENS: mean(
            [float(sum(call.observation_tokens for call in row)) for row in calls]
        ),
    }


def environment_stats(
    episodes: Sequence[Episode | None], correct: list[float], observed: list[float]
) -> dict[str, float]:
    """The step's episodes (``conspo.environments``): turns overall and by outcome (do the won
    ones finish sooner?), how episodes ended, rewards, and the seconds the environment took.
    ``correct``: each rollout's verified outcome; ``observed``: its observation tokens. Rows
    that played no episode (a benchmark's problem) are left out. Host lists only."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    played = [(e, c > 0.5, o) for e, c, o in zip(episodes, correct, observed, strict=True) if e]
    turns = [(float(e.turn_count), won) for e, won, _ in played]
    every_turn = [turn for e, _, _ in played for turn in e.turns]
    return {
        metrics.ENV_TURNS: mean([t for t, _ in turns]),
        metrics.ENV_TURNS_POS: mean([t for t, won in turns if won]),
        metrics.ENV_TURNS_NEG: mean([t for t, won in turns if not won]),
        metrics.ENV_SUCCESS: mean([float(won) for _, won, _ in played]),
        metrics.ENV_FAILED: mean([float(e.failure is not None) for e, _, _ in played]),
        metrics.ENV_TRUNCATED: mean([float(_cut(e)) for e, _, _ in played]),
        metrics.ENV_INVALID: mean([float(bool(t.info.get("invalid"))) for t in every_turn]),
        metrics.ENV_RETURN: mean([e.total_reward for e, _, _ in played]),
        metrics.ENV_TURN_REWARD: mean([t.reward for t in every_turn]),
        metrics.ENV_OBSERVATION_TOKENS: mean([o for _, _, o in played]),
        metrics.TIME_ENV_S: sum(t.seconds for t in every_turn),
    }


def _cut(episode: Episode) -> bool:
    """Ended without a fault before the environment said done (the turn limit, the budget)."""
    ended = bool(episode.turns) and episode.turns[-1].done
    return episode.failure is None and not ended


def proxy_stats(
    proxy: Sequence[float], truth: Sequence[float], group_ids: Sequence[int]
) -> dict[str, float]:
    """The proxy-vs-truth view of one step (``RunConfig.truth``): each rollout's shaped reward
    (``proxy``, what the objective trains on) against its truth reward. Means and their gap;
    within each prompt's group, the share of pairs whose truth differs that the proxy orders
    the same way (a tie counts half: 0.5 is chance; NaN without such a pair), which is what
    a reward model is trained to get right and what over-optimisation erodes; and Spearman's ρ
    over the whole step (NaN when either side is constant). Host lists only."""
    n = len(proxy)
    agree = pairs = 0.0
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    for rows in members.values():
        for a_pos, a in enumerate(rows):
            for b in rows[a_pos + 1 :]:
                if truth[a] == truth[b]:
                    continue
                pairs += 1
                same = (proxy[a] - proxy[b]) * (truth[a] - truth[b])
                agree += 1.0 if same > 0 else 0.5 if same == 0 else 0.0
    mean_proxy, mean_truth = sum(proxy) / n, sum(truth) / n
    return {
        metrics.PROXY_REWARD: mean_proxy,
        metrics.PROXY_TRUTH: mean_truth,
        metrics.PROXY_GAP: mean_proxy - mean_truth,
        metrics.PROXY_AGREEMENT: agree / pairs if pairs else math.nan,
        metrics.PROXY_SPEARMAN: spearman(proxy, truth),
    }


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's of the ranks, ties at their mean rank); NaN when
    either side is constant."""
    rx, ry = mean_ranks(xs), mean_ranks(ys)
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def mean_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``, tied values sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def best_of_n(scores: Sequence[float], outcomes: Sequence[float], n: int) -> dict[str, float]:
    """Best-of-N on held-out samples, ``n`` consecutive per problem: the sample ``scores`` rank
    highest (the first of a tie) is the problem's pick; eval/best_of_n is the share of picks
    verified correct, eval/sample_accuracy the share of all samples (pass@1 at the sampling
    temperature). A reward that ranks right lifts the first above the second."""
    problems = range(0, len(scores), n)
    picks = [max(range(i, i + n), key=lambda j: (scores[j], -j)) for i in problems]
    positive = [o > POSITIVE_THRESHOLD for o in outcomes]
    return {
        metrics.EVAL_BEST_OF_N: sum(positive[j] for j in picks) / len(picks),
        metrics.EVAL_SAMPLE_ACCURACY: sum(positive) / len(positive),
    }
