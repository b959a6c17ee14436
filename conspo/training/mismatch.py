"""The sampler/trainer mismatch: how far the probabilities of the engine that sampled a batch (μ)
are from the trainer's π_old on the same tokens, and the importance weights that correct for it
(docs/objectives.md, "Sampler mismatch").

    weights = correction_weights(old_logprobs, sampled_logprobs, mask, "sequence_mask", 3.0)
    logprobs = reweighted(logprobs, weights)   # the same values; each token's gradient × w
    stats = mismatch_stats(old_logprobs, sampled_logprobs, mask, "sequence_mask", 3.0)

The rollouts were drawn from μ (vLLM's kernels, a bf16 decode, a stale copy of the weights), but
every objective's gradient is an expectation over π_old. The per-token importance weight
w_t = π_old(o_t)/μ(o_t) turns the one into the other; ``sequence_*`` modes weight a whole rollout
by the product over its tokens, ``token_*`` each token by its own. Weights above the cap C are
truncated to C (``*_truncate``, TIS) or set to 0 (``*_mask``, the rollout or token left out), as
TRL's ``vllm_importance_sampling_mode`` does.

The weight multiplies each token's whole gradient, not a term of one objective's loss, so every
registered objective is corrected without knowing of it: ``reweighted`` keeps the log-probs'
values and scales their gradient. For a token-level surrogate (GRPO, DAPO, …) that is exactly
TRL's per-token loss × w; for ConSPO, whose loss reads each rollout's mean log-prob, a rollout's
score gradient takes its weight. The KL term's gradient is weighted too (its expectation is over
π_old as well; TRL leaves its KL unweighted).

Shapes: B rollouts, T response positions; masks are 1.0 on the model's own tokens.
"""

from __future__ import annotations

import torch

from conspo import metrics as M
from conspo.config import MismatchCorrection


def log_ratio(
    old_logprobs: torch.Tensor, sampled_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(B, T) log π_old − log μ on the model's tokens, 0 elsewhere (float32 at least)."""
    diff = old_logprobs.float() - sampled_logprobs.to(old_logprobs.device).float()
    return torch.where(mask > 0, diff, torch.zeros_like(diff))


def unit_ratios(
    old_logprobs: torch.Tensor,
    sampled_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: MismatchCorrection,
) -> torch.Tensor:
    """The importance ratio π_old/μ of each unit the mode weights: (B, T) per token for token_*
    modes, (B, 1) per rollout (exp of the summed log ratio) for sequence_* modes."""
    diff = log_ratio(old_logprobs, sampled_logprobs, mask)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    return diff.exp()


def correction_weights(
    old_logprobs: torch.Tensor,
    sampled_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: MismatchCorrection,
    cap: float,
) -> torch.Tensor:
    """(B, T) detached weights w of each token's gradient: π_old/μ of its unit (token or
    rollout), above ``cap`` truncated to it or masked to 0 by ``mode``; 1 where ``mode`` is off."""
    if mode in ("off", "auto"):
        return torch.ones_like(mask, dtype=torch.float32)
    ratio = unit_ratios(old_logprobs.detach(), sampled_logprobs, mask, mode)
    if mode.endswith("truncate"):
        ratio = ratio.clamp(max=cap)
    else:
        ratio = ratio.masked_fill(ratio > cap, 0.0)
    return ratio.expand_as(mask).float()


def reweighted(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``logprobs`` (B, T) with the same values and each position's gradient × ``weights``.

    detach + w·(x − detach): the value is x exactly (x − x is 0 in floating point), the gradient
    w. Positions off the mask carry weight 1 but no loss reads them."""
    frozen = logprobs.detach()
    return frozen + weights.to(logprobs.dtype) * (logprobs - frozen)


def k3(x: torch.Tensor) -> torch.Tensor:
    """e^x − x − 1 elementwise, ≥ 0 as the exact value is. Written expm1(x) − x: a sampler that
    agrees with the trainer to float32 noise has |x| ~ 1e-6, where e^x − 1 cancels to within
    float32's step at 1 (~1e-7) and the mean came out negative (issue 49's walk: SmolLM2 GRPO
    logged mismatch/kl = −1.9e-9, the exact value ~+1e-11); the clamp keeps a last rounding of
    expm1 from doing the same."""
    return (torch.expm1(x) - x).clamp(min=0.0)


def mismatch_stats(
    old_logprobs: torch.Tensor,
    sampled_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: MismatchCorrection,
    cap: float,
) -> dict[str, torch.Tensor]:
    """The mismatch/* statistics of one update (0-d, detached):

    logp_diff_mean / _max: mean and largest |log π_old − log μ| over the model's tokens;
    kl: KL(μ ‖ π_old) per token, the k3 estimate e^x − x − 1 at x = log π_old − log μ (the
    tokens are μ's samples, so it is unbiased and never negative);
    weight_mean: the mean weight the correction gives (per token, or per rollout in sequence
    modes; 1 when off); corrected_frac: the share of those units whose ratio passed the cap
    (truncated or masked; of tokens for off and token modes, of rollouts for sequence modes).
    """
    diff = log_ratio(old_logprobs.detach(), sampled_logprobs, mask)
    on = mask > 0
    tokens = on.sum().clamp(min=1)
    zero = torch.zeros((), device=diff.device)
    abs_diff = diff.abs()
    stats = {
        M.MISMATCH_LOGP_DIFF_MEAN: abs_diff.sum() / tokens,
        M.MISMATCH_LOGP_DIFF_MAX: abs_diff.max() if bool(on.any()) else zero,
        M.MISMATCH_KL: torch.where(on, k3(diff), zero).sum() / tokens,
    }
    if mode.startswith("sequence"):
        rows = on.any(-1)
        ratio = diff.sum(-1).exp()[rows]
        weights = correction_weights(old_logprobs, sampled_logprobs, mask, mode, cap)[:, 0][rows]
    else:
        ratio = diff.exp()[on]
        weights = correction_weights(old_logprobs, sampled_logprobs, mask, mode, cap)[on]
    units = max(ratio.numel(), 1)
    stats[M.MISMATCH_WEIGHT_MEAN] = weights.sum() / units if ratio.numel() else zero + 1
    stats[M.MISMATCH_CORRECTED_FRAC] = (ratio > cap).float().sum() / units
    return {k: v.detach().float() for k, v in stats.items()}
