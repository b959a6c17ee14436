"""Per-turn credit for rollouts that play an environment (``environment.credit``).

    extra = turn_advantages(batch.turn_index, batch.episodes, rewards, group_ids,
                            "gigpo", gamma=1.0, weight=1.0)     # (N, T') or None
    PolicyBatch(..., turn_advantages=extra[rows])

Outcome credit (the default) gives every token of a rollout its objective's advantage of the
rollout's reward R, as for a single answer. The two others add a turn-level term to it, GiGPO's
combination (arXiv:2505.10978): Â_t = Â(R) + ω · Â_turn(k(t)), k(t) the turn of token t.

A rollout's turns k = 0 … K-1 are the model's turns (``RolloutBatch.turn_index``). Turn k earns
the environment's reward for that step (``Episode.turns[k].reward``; 0 for a turn never played,
cut by the token budget), and the last turn earns R besides, so a game that rewards only the
end has its outcome there. A turn's return is G_k = Σ_{j≥k} γ^{j−k} u_j. Â_turn(k) is G_k
normalised, (G_k − mean) / std over a step group of turns:

- ``turn``: the turns of the same group's rollouts at the same index k;
- ``gigpo``: the turns of the same group's rollouts that acted on the same state (GiGPO's anchor
  states): the state an environment names in its step ``info["state"]``, else the observation
  the turn answered (the prompt, for turn 0).

A step group of one turn, or with no spread (std ≤ ``STD_EPS``), adds nothing. With γ = 1 and no
step rewards every turn's return is R, and ``turn`` credit adds, to each turn, R normalised
among the rollouts that reached it: rollouts that go on longer share their later turns' credit
with fewer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch

from conspo.environments.base import Episode
from conspo.objectives.base import STD_EPS

Credit = Literal["outcome", "turn", "gigpo"]


def turn_returns(step_rewards: Sequence[float], outcome: float, gamma: float) -> list[float]:
    """G_k for each turn: the discounted sum of the turn's and later turns' rewards, the
    rollout's reward ``outcome`` earned at the last turn."""
    earned = list(step_rewards)
    if not earned:
        return []
    earned[-1] += outcome
    returns, later = [0.0] * len(earned), 0.0
    for k in range(len(earned) - 1, -1, -1):
        later = earned[k] + gamma * later
        returns[k] = later
    return returns


def turn_advantages(
    turn_index: torch.Tensor,
    episodes: Sequence[Episode | None],
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    credit: Credit,
    *,
    gamma: float = 1.0,
    weight: float = 1.0,
) -> torch.Tensor | None:
    """(N, T') ω · Â_turn at each of the model's tokens, 0 elsewhere (module docstring); None
    for outcome credit. ``turn_index`` (N, T'): each token's turn, -1 off the model's tokens;
    ``rewards`` (N,): each rollout's reward R; ``group_ids`` (N,)."""
    if credit == "outcome":
        return None
    index = turn_index.cpu()
    turns = (index.max(dim=1).values + 1).clamp_min(0).tolist()  # the model's turns per row
    groups = group_ids.cpu().tolist()
    outcome = rewards.cpu().float().tolist()
    returns: list[list[float]] = []
    members: dict[tuple[int, Hashable], list[tuple[int, int]]] = defaultdict(list)
    for i, (k_i, episode) in enumerate(zip(turns, episodes, strict=True)):
        played = episode.turns if episode is not None else ()
        step = [played[k].reward if k < len(played) else 0.0 for k in range(k_i)]
        returns.append(turn_returns(step, outcome[i], gamma))
        for k in range(k_i):
            key = k if credit == "turn" else _state(episode, k)
            members[(groups[i], key)].append((i, k))
    normalised = [[0.0] * len(row) for row in returns]
    for pairs in members.values():
        values = torch.tensor([returns[i][k] for i, k in pairs], dtype=torch.float64)
        std = float(values.std(correction=0)) if len(pairs) > 1 else 0.0
        if std <= STD_EPS:
            continue
        mean = float(values.mean())
        for i, k in pairs:
            normalised[i][k] = (returns[i][k] - mean) / std
    width = max((len(row) for row in normalised), default=0)
    table = torch.zeros(len(normalised), width + 1, dtype=torch.float32)  # column 0: not a turn
    for i, row in enumerate(normalised):
        table[i, 1 : len(row) + 1] = torch.tensor(row, dtype=torch.float32)
    return weight * table.gather(1, index + 1)  # -1 → column 0


def _state(episode: Episode | None, k: int) -> Hashable:
    """The state turn k acted on: the one its environment named (``info["state"]`` of the
    step before), else the observation it answered; the prompt for turn 0."""
    if k == 0 or episode is None or k > len(episode.turns):
        return ("start",) if k == 0 else ("unplayed", k)
    before = episode.turns[k - 1]
    named = before.info.get("state")
    return ("state", repr(named)) if named is not None else ("observation", before.observation)
