"""The critic of an objective that reads values (PPO, ``RegisteredObjective.critic``): a value
head on its own copy of a backbone, its own LoRA adapters and its own optimiser.

    critic = load_critic(cfg, params, path, device, precision)      # in setup
    values = critic_values(critic, batch, cfg, precision)           # V(s_t) of every token
    rewards = placed_rewards(batch, shaped)                         # each token's reward
    ... the policy's update reads them through PolicyBatch.values / token_rewards ...
    stats = train_critic(critic, cfg, params, precision, scored, plan)  # V onto GAE's returns

The critic never shares weights with the policy: its backbone is loaded again (the policy's
model, or ``params.critic_model``) and takes the run's LoRA settings as adapters of its own, so
the policy's checkpoint, export and sampler see nothing of it. The value head is one linear
map of the decoder's last hidden state to a scalar, in float32, starting at zero (V ≡ 0 until
the critic has seen returns). The critic is saved beside the policy in each checkpoint
(``critic/critic.pt``: its trainable tensors by name, the head and its optimiser) and resumed
with it.

Shapes: N rollouts of the step, B of a mini-batch, T response positions, H hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from conspo import metrics as M
from conspo import stopping
from conspo.config import RunConfig
from conspo.distributed import collectives as distributed
from conspo.generation.batch import RolloutBatch
from conspo.models.loading import load_pretrained, prepare_for_training
from conspo.models.precision import Precision
from conspo.objectives.base import PolicyBatch
from conspo.objectives.ppo import PPOParams, ppo_targets
from conspo.training.logprobs import logprob_mode, token_states
from conspo.training.microbatch import micro_batches, piece_group_size, trimmed

CRITIC_DIR = "critic"
CRITIC_STATE = "critic.pt"


@dataclass
class Critic:
    model: PreTrainedModel  # the backbone (a peft model with LoRA), never the policy's object
    head: nn.Linear  # H → 1, float32
    optimizer: torch.optim.Optimizer
    trainable: list[nn.Parameter]  # the backbone's (LoRA: its adapters) and the head's
    warmup: int  # steps 1 … warmup train the critic alone

    def named_trainable(self) -> dict[str, torch.Tensor]:
        """The backbone's trainable tensors by name (what a checkpoint keeps of it)."""
        return {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}


def load_critic(
    cfg: RunConfig, params: PPOParams, path: Path | str, device: torch.device, precision: Precision
) -> Critic:
    """The critic of a run: the backbone at ``path`` (the policy's model or params.critic_model,
    resolved by the caller) with the run's LoRA and checkpointing settings, its adapters drawn
    from a seed of their own, a zero value head, and AdamW at params.critic_lr (else optim.lr)."""
    if distributed.active():
        raise ValueError(
            f"algorithm {cfg.algorithm!r} trains a critic, which runs in one process for now:"
            " set resources.processes to 1"
        )
    model, _ = load_pretrained(path, device, precision.weights, cfg.model.attn_implementation)
    stopping.check_between_layers(model)
    model = prepare_for_training(model, cfg.model, cfg.seed + 1)
    hidden = int(model.config.hidden_size)
    head = nn.Linear(hidden, 1, device=device, dtype=torch.float32)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    trainable = [p for p in model.parameters() if p.requires_grad] + list(head.parameters())
    lr = params.critic_lr or cfg.optim.lr
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=cfg.optim.weight_decay)
    return Critic(model, head, optimizer, trainable, params.critic_warmup)


def values_of(critic: Critic, batch: RolloutBatch, group_size: int) -> torch.Tensor:
    """(N, T) V(s_t) before each response token of ``batch`` (grad as the caller's mode)."""
    states = token_states(critic.model, batch, group_size)
    return critic.head(states.float()).squeeze(-1)


def critic_values(
    critic: Critic, batch: RolloutBatch, cfg: RunConfig, precision: Precision
) -> torch.Tensor:
    """(N, T) float32 values of every row without grad, one micro-batch at a time; 0 past a
    row's response."""
    g = cfg.sampling.group_size
    n, t = batch.response_ids.shape
    out = torch.zeros(n, t, device=critic.head.weight.device)
    logprob_mode(critic.model)
    with torch.no_grad(), precision.autocast():
        for idx in micro_batches(batch, g, cfg.optim.micro_batch_tokens):
            stopping.check()
            piece = trimmed(batch.select(idx.to(batch.response_ids.device)))
            values = values_of(critic, piece, piece_group_size(idx, g))
            out[idx.to(out.device), : values.shape[1]] = values.float()
    return out * batch.model_mask.to(out.device)


def placed_rewards(batch: RolloutBatch, rewards: torch.Tensor) -> torch.Tensor:
    """(N, T) float32 on the CPU: each rollout's (shaped) reward ``rewards`` (N,) at its last
    model token and, in an environment, each played turn's own reward at that turn's last model
    token (as ``conspo.credit`` counts them: the turn's step reward, the outcome besides at the
    end)."""
    mask = batch.model_mask.cpu() > 0
    n, t = mask.shape
    positions = torch.arange(t).expand(n, t)
    last = torch.where(mask, positions, torch.zeros_like(positions)).amax(-1)
    placed = torch.zeros(n, t)
    placed[torch.arange(n), last] = rewards.float().cpu()
    if batch.episodes is None or batch.turn_index is None:
        return placed * mask
    turn_of = batch.turn_index.cpu()
    for i, episode in enumerate(batch.episodes):
        if episode is None:
            continue
        for k, played in enumerate(episode.turns):
            own = (turn_of[i] == k).nonzero()
            if len(own):
                placed[i, int(own[-1])] += float(played.reward)
    return placed * mask


@dataclass(frozen=True)
class ScoredBatch:
    """The step's rollouts as the critic's update reads them (N rows, T positions)."""

    batch: RolloutBatch
    group_ids: torch.Tensor  # (N,) on the CPU
    rewards: torch.Tensor  # (N,) shaped rewards, on the CPU
    values: torch.Tensor  # (N, T) V(s_t) when the rollouts were scored
    token_rewards: torch.Tensor  # (N, T) on the CPU


def train_critic(
    critic: Critic,
    cfg: RunConfig,
    params: PPOParams,
    precision: Precision,
    scored: ScoredBatch,
    plan: list[torch.Tensor],
) -> dict[str, torch.Tensor]:
    """One critic update per mini-batch of the policy's ``plan`` (the same groups, in the same
    order): the clipped value loss ½·max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²) over
    the mini-batch's targets (``ppo_targets``: R from GAE on the values the rollouts were scored
    with), backpropagated one micro-batch at a time, its gradient clipped at
    optim.max_grad_norm. Returns the mean loss and value-clip fraction over the updates."""
    g = cfg.sampling.group_size
    device = critic.head.weight.device
    losses, clipped = [], []
    critic.model.train()
    logprob_mode(critic.model)
    for chunk in plan:
        stopping.check()
        rows = (scored.group_ids[:, None] == chunk[None]).any(-1)
        sub = scored.batch.select(rows.to(scored.batch.response_ids.device))
        old = scored.values[rows.to(scored.values.device)].to(device)
        mask = sub.model_mask.to(device)
        found = ppo_targets(
            PolicyBatch(
                logprobs=torch.zeros_like(old),
                mask=mask,
                rewards=scored.rewards[rows].to(device),
                group_ids=scored.group_ids[rows].to(device),
                values=old,
                token_rewards=scored.token_rewards[rows].to(device),
                turn_index=None if sub.turn_index is None else sub.turn_index.to(device),
            ),
            params,
        )
        count = found.targets.sum().clamp_min(1)
        critic.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        clip_sum = torch.zeros((), device=device)
        for idx in micro_batches(sub, g, cfg.optim.micro_batch_tokens):
            stopping.check()
            piece = trimmed(sub.select(idx.to(sub.response_ids.device)))
            where = idx.to(device)
            with precision.autocast():
                values = values_of(critic, piece, piece_group_size(idx, g))
            width = values.shape[1]
            loss, was_clipped = value_loss(
                values.float(),
                old[where, :width],
                found.returns[where, :width],
                found.targets[where, :width],
                params.value_clip,
            )
            precision.backward(params.value_coef * loss / count)
            loss_sum += loss.detach()
            clip_sum += was_clipped
        precision.step(critic.optimizer, critic.trainable, cfg.optim.max_grad_norm)
        losses.append(loss_sum / count)
        clipped.append(clip_sum / count)
    return {
        M.PPO_VALUE_LOSS: torch.stack(losses).mean(),
        M.PPO_VALUE_CLIP_FRAC: torch.stack(clipped).mean(),
    }


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    targets: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ over ``targets`` of ½·max((V − R)², (V_clipped − R)²), how many targets the clipped
    term was the larger at), V_clipped = V_old + clip(V − V_old, −ε_v, ε_v); with ε_v = 0 the
    plain ½(V − R)². All (b, t); sums, so micro-batches add up to the mini-batch's."""
    plain = (values - returns).square()
    if clip > 0:
        bounded = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (bounded - returns).square()
        per_target = torch.maximum(plain, clipped_error)
        larger = (clipped_error > plain) & targets
    else:
        per_target, larger = plain, torch.zeros_like(targets)
    zero = torch.zeros_like(per_target)
    return 0.5 * torch.where(targets, per_target, zero).sum(), larger.sum().float()


def save_critic(critic: Critic, directory: Path) -> None:
    """Write the critic into a checkpoint being written (``directory``: its temp dir)."""
    target = directory / CRITIC_DIR
    target.mkdir()
    state: dict[str, Any] = {
        "trainable": critic.named_trainable(),
        "head": critic.head.state_dict(),
        "optimizer": critic.optimizer.state_dict(),
    }
    torch.save(state, target / CRITIC_STATE)


def load_critic_state(critic: Critic, checkpoint: Path) -> None:
    """Resume the critic from ``checkpoint``: a checkpoint without one (written by a run of
    another objective) is refused, not silently started afresh."""
    file = checkpoint / CRITIC_DIR / CRITIC_STATE
    if not file.exists():
        raise RuntimeError(f"checkpoint {checkpoint} holds no critic ({CRITIC_DIR}/{CRITIC_STATE})")
    device = critic.head.weight.device
    saved = torch.load(file, map_location=device, weights_only=True)
    own = dict(critic.model.named_parameters())
    names = set(saved["trainable"])
    expected = {n for n, p in own.items() if p.requires_grad}
    if names != expected:
        raise RuntimeError(
            f"checkpoint {checkpoint}'s critic does not match this run's: missing"
            f" {sorted(expected - names)[:5]}, unexpected {sorted(names - expected)[:5]}"
        )
    with torch.no_grad():
        for name, tensor in saved["trainable"].items():
            own[name].copy_(tensor)
    critic.head.load_state_dict(saved["head"])
    critic.optimizer.load_state_dict(saved["optimizer"])
