"""PPO with a value model: GAE advantages per token (or per environment turn) from a critic, in
PPO's clipped token surrogate (docs/objectives.md §9).

    targets = ppo_targets(batch, params)     # advantages, returns, where the critic regresses
    loss = ppo_objective(batch, params).loss # the policy's clipped surrogate on the advantages

The critic itself (a value head on its own copy of the backbone, its own LoRA and optimiser) is
trained by the trainer (``conspo.training.critic``) on the returns this module computes; the
objective sees only what it predicted when the rollouts were scored (``PolicyBatch.values``), so
its gradient in the log-probs is the clipped surrogate's alone.

Shapes: B rollouts, T response positions; S = T recursion steps (tokens, or turns in columns
0 … K−1 with the rest invalid).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from conspo import metrics
from conspo.input_checks import Label
from conspo.lazy import lazy_import
from conspo.objectives.base import (
    LossAgg,
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    clipped_surrogate,
    finish_objective,
)
from conspo.registry import register_objective

if TYPE_CHECKING:
    import torch
else:  # the API reads the parameter models below without loading torch (see conspo.lazy)
    torch = lazy_import("torch")


class PPOParams(ObjectiveParams):
    # Params naming a model, checked against the model sources at submit like model.name.
    model_names: ClassVar[tuple[str, ...]] = ("critic_model",)

    gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        description="γ: the discount of GAE's recursion, per token (per turn in an environment)."
        " γ = 1 and λ = 1 give Monte-Carlo returns.",
    )
    lam: float = Field(
        0.95,
        ge=0,
        le=1,
        description="λ: GAE's bias–variance trade-off; 1 = Monte-Carlo advantages (the return"
        " less the value), 0 = one-step TD errors.",
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="ε_low: ratio clipped below at 1-ε_low.")
    clip_high: float = Field(0.2, gt=0, description="ε_high: ratio clipped above at 1+ε_high.")
    whiten_advantages: bool = Field(
        True,
        description="Normalise the mini-batch's token advantages to mean 0, std 1 (over the"
        " model's tokens) before the surrogate, as PPO implementations do.",
    )
    loss_agg: LossAgg = Field(
        "token-mean", description="How the policy's token losses are averaged."
    )
    value_clip: float = Field(
        0.2,
        ge=0,
        le=100,
        description="ε_v: the critic's new value is clipped to V_old ± ε_v in the value loss"
        " max((V − R)², (clip(V) − R)²); 0 turns value clipping off.",
    )
    value_coef: float = Field(
        0.5,
        gt=0,
        le=100,
        description="Scale of the critic's loss ½·max(…). The critic has its own AdamW, so this"
        " matters through its gradient clip (optim.max_grad_norm), not as a mix with the"
        " policy's loss.",
    )
    critic_lr: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The critic's learning rate (constant); null = optim.lr.",
    )
    critic_warmup: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Steps at the start that train only the critic: the policy takes no"
        " update until its advantages come from a critic that has seen returns.",
    )
    critic_model: Label | None = Field(
        None,
        min_length=1,
        max_length=300,
        description="The critic's backbone: a model of the catalogue or the store; null = the"
        " policy's model. It takes the run's LoRA settings (its own adapters) and a value head"
        " (a scalar per token).",
    )

    def separation_view(self, progress: float) -> SeparationView:
        """The default view with PPO's own clip range [1 − ε_low, 1 + ε_high]."""
        default = super().separation_view(progress)
        return replace(default, clip_eps=self.clip_high, clip_low=self.clip_low)


@dataclass(frozen=True)
class PPOTargets:
    """What GAE gives one mini-batch (B, T): each token's advantage (before whitening), each
    position's return R = A + V, and where the critic is regressed onto it (every model token;
    with turns, each turn's first token, the state the turn's value is read at)."""

    advantages: torch.Tensor
    returns: torch.Tensor
    targets: torch.Tensor  # (B, T) bool


def gae(
    rewards: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """(B, S) generalised advantage estimates (Schulman et al. 2016) over each row's valid steps.

    δ_s = r_s + γ·V_{s'} − V_s and A_s = δ_s + γλ·A_{s'}, s' the row's next valid step (V = A = 0
    past its last: the episode ends there). Invalid steps (padding, an environment's observation
    tokens) are skipped, not counted, and get 0. rewards, values: (B, S); valid: (B, S) bool.
    At least float32, else in their own dtype.
    """
    dtype = torch.promote_types(torch.promote_types(values.dtype, rewards.dtype), torch.float32)
    rewards, values = rewards.to(dtype), values.to(dtype)
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    for s in range(values.shape[1] - 1, -1, -1):
        here = valid[:, s]
        delta = rewards[:, s] + gamma * next_value - values[:, s]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, s] = torch.where(here, advantage, torch.zeros_like(advantage))
        next_value = torch.where(here, values[:, s], next_value)
        next_advantage = torch.where(here, advantage, next_advantage)
    return advantages


def ppo_targets(batch: PolicyBatch, params: PPOParams) -> PPOTargets:
    """GAE on ``batch``: per token, or per environment turn where ``batch.turn_index`` is given
    (each turn one step of the recursion: its value V at its first token, its reward the sum of
    its tokens', its advantage given to each of its tokens)."""
    mask = batch.mask > 0
    b, t = mask.shape
    dtype = torch.promote_types(batch.logprobs.dtype, torch.float32)
    zeros = torch.zeros(b, t, device=mask.device, dtype=dtype)
    values = zeros if batch.values is None else batch.values.to(dtype)
    values = torch.where(mask, values, zeros)
    rewards = token_rewards(batch).to(dtype)
    if batch.turn_index is None:
        advantages = gae(rewards, values, mask, params.gamma, params.lam)
        return PPOTargets(advantages, advantages + values, mask)
    turn = torch.where(mask, batch.turn_index, torch.full_like(batch.turn_index, -1))
    column = turn.clamp_min(0)  # turn k's step lives in column k
    own = turn >= 0
    positions = torch.arange(t, device=mask.device).expand(b, t)
    first = torch.full((b, t), t, device=mask.device, dtype=torch.long).scatter_reduce(
        1, column, torch.where(own, positions, torch.full_like(positions, t)), "amin"
    )  # (B, S) turn k's first token, T where the row has no turn k
    step_valid = first < t
    step_values = values.gather(1, first.clamp_max(t - 1)) * step_valid
    step_rewards = zeros.scatter_add(1, column, torch.where(own, rewards, zeros))
    step_advantages = gae(step_rewards, step_values, step_valid, params.gamma, params.lam)
    advantages = torch.where(own, step_advantages.gather(1, column), zeros)
    at_first = torch.zeros(b, t + 1, device=mask.device, dtype=dtype)  # column T: absent turns
    targets = at_first.scatter(1, first, step_valid.to(dtype))[:, :t] > 0
    returns = at_first.scatter(1, first, step_advantages + step_values)[:, :t]
    return PPOTargets(advantages, returns, targets)


def token_rewards(batch: PolicyBatch) -> torch.Tensor:
    """(B, T) float32 reward per token: ``batch.token_rewards``, else the rollout's reward at its
    last model token."""
    mask = batch.mask > 0
    if batch.token_rewards is not None:
        tokens = batch.token_rewards.float()
        return torch.where(mask, tokens, torch.zeros_like(tokens))
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.zeros_like(positions)).amax(-1, keepdim=True)
    placed = torch.zeros(mask.shape, device=mask.device)
    placed = placed.scatter(1, last, batch.rewards.float()[:, None].to(placed.device))
    return torch.where(mask, placed, torch.zeros_like(placed))


def whitened(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) advantages at mean 0 and std 1 over the model's tokens (``mask``), 0 elsewhere; a
    batch without spread only loses its mean."""
    on = mask > 0
    count = on.sum().clamp_min(1)
    mean = torch.where(on, advantages, torch.zeros_like(advantages)).sum() / count
    centred = torch.where(on, advantages - mean, torch.zeros_like(advantages))
    std = (centred.square().sum() / count).sqrt()
    return centred / torch.where(std > 1e-6, std, torch.ones_like(std))


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """0-d 1 − Var(R − V) / Var(R) over the ``targets`` positions: 1 for a perfect critic, 0 for
    one that predicts the mean, below 0 for a worse one; NaN when the returns have no spread."""
    count = targets.sum().clamp_min(1)

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = torch.where(targets, x, torch.zeros_like(x)).sum() / count
        return torch.where(targets, (x - mean).square(), torch.zeros_like(x)).sum() / count

    spread = variance(returns)
    unexplained = variance(returns - values)
    nan = torch.full_like(spread, float("nan"))
    return torch.where(spread > 1e-12, 1 - unexplained / spread.clamp_min(1e-12), nan)


def masked_mean(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    return torch.where(where, values, torch.zeros_like(values)).sum() / where.sum().clamp_min(1)


PPO_METRICS = (
    metrics.CLIP_FRAC,
    metrics.PPO_ADV_STD,
    metrics.PPO_RETURN_MEAN,
    metrics.PPO_VALUE_MEAN,
    metrics.PPO_EXPLAINED_VAR,
    metrics.PPO_VALUE_LOSS,
    metrics.PPO_VALUE_CLIP_FRAC,
)


@register_objective(
    "ppo",
    params=PPOParams,
    description="PPO: a critic's GAE advantages per token (per turn), clipped ratio.",
    metrics=PPO_METRICS,
    linear_on_policy=True,
    critic=True,
)
def ppo_objective(batch: PolicyBatch, params: PPOParams) -> ObjectiveOutput:
    """−agg_t min(ρ_t Â_t, clip(ρ_t, 1−ε_low, 1+ε_high) Â_t) + β·KL, Â_t from GAE (§9).

    Stats: loss, grpo/clip_frac, ppo/adv_std (the advantages' spread before whitening),
    ppo/return_mean and ppo/value_mean (at the critic's targets), ppo/explained_var (of the
    values the rollouts were scored with, against their returns). The trainer adds the critic's
    own ppo/value_loss and ppo/value_clip_frac.
    """
    found = ppo_targets(batch, params)
    mask = batch.mask > 0
    advantages = found.advantages
    if params.whiten_advantages:
        advantages = whitened(advantages, batch.mask)
    loss, clip_frac = clipped_surrogate(
        batch, advantages, params.clip_low, params.clip_high, params.loss_agg
    )
    values = torch.zeros_like(found.returns)
    if batch.values is not None:
        values = torch.where(found.targets, batch.values.to(values.dtype), values)
    raw = found.advantages
    stats = {
        metrics.CLIP_FRAC: clip_frac,
        metrics.PPO_ADV_STD: (masked_mean(raw.square(), mask) - masked_mean(raw, mask) ** 2)
        .clamp_min(0)
        .sqrt(),
        metrics.PPO_RETURN_MEAN: masked_mean(found.returns, found.targets),
        metrics.PPO_VALUE_MEAN: masked_mean(values, found.targets),
        metrics.PPO_EXPLAINED_VAR: explained_variance(values, found.returns, found.targets),
    }
    return finish_objective(
        loss, {k: v.detach() for k, v in stats.items()}, batch, params.beta, params.loss_agg
    )
