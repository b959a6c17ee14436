"""Per-turn credit (``conspo.credit``): turn returns, the two step groupings, and the objectives
that take the turn-level advantages; and the config's refusals of a credit that cannot apply."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from conspo.config import RunConfig
from conspo.credit import turn_advantages, turn_returns
from conspo.environments.base import Episode, Turn
from conspo.objectives.base import PolicyBatch
from conspo.registry import get_objective


def turn(observation: str, reward: float = 0.0, done: bool = False, **info) -> Turn:
    return Turn("act", observation, reward, done, 0.0, info=info)


def test_a_turn_return_discounts_later_rewards_and_ends_with_the_outcome() -> None:
    assert turn_returns([0.0, 0.0, 0.0], 1.0, 1.0) == [1.0, 1.0, 1.0]
    assert turn_returns([0.0, 0.0, 0.0], 1.0, 0.5) == [0.25, 0.5, 1.0]
    assert turn_returns([0.5, 0.0], 1.0, 0.5) == [1.0, 1.0]
    assert turn_returns([], 1.0, 1.0) == []


def layout(turns_per_row: list[int], width: int) -> torch.Tensor:
    """(N, width) turn index: each turn 2 model tokens then 1 observation token (-1)."""
    index = torch.full((len(turns_per_row), width), -1)
    for i, k in enumerate(turns_per_row):
        col = 0
        for t in range(k):
            index[i, col : col + 2] = t
            col += 3
    return index


def test_outcome_credit_adds_nothing() -> None:
    index = layout([1, 2], 8)
    episodes = [Episode((turn("a"),)), Episode((turn("a"), turn("b")))]
    none = turn_advantages(
        index, episodes, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "outcome"
    )
    assert none is None


def test_turn_credit_normalises_returns_among_the_rollouts_at_each_turn() -> None:
    # One group of three: rollout 0 wins in one turn, 1 wins on its second, 2 loses in two.
    index = layout([1, 2, 2], 9)
    episodes = [
        Episode((turn("a", 1.0, True),)),
        Episode((turn("higher"), turn("b", 1.0, True))),
        Episode((turn("higher"), turn("lower"))),
    ]
    rewards = torch.tensor([1.0, 1.0, 0.0])
    extra = turn_advantages(index, episodes, rewards, torch.zeros(3), "turn", gamma=1.0, weight=2.0)
    assert extra is not None and extra.shape == index.shape
    assert bool((extra[index == -1] == 0).all())  # observations and padding get none
    # turn 0: returns 2, 2, 0 (the win's step reward + R) → z-scores over the three
    first = torch.tensor([2.0, 2.0, 0.0])
    z = (first - first.mean()) / first.std(correction=0)
    assert torch.allclose(extra[:, 0], 2.0 * z)
    # turn 1: rollouts 1 and 2 reached it: returns 2 and 0 → +1, -1
    assert torch.allclose(extra[1:, 3], torch.tensor([2.0, -2.0]))
    # a token's value is its turn's
    assert bool((extra[:, 0] == extra[:, 1]).all())


def test_gigpo_groups_turns_by_the_state_they_acted_on() -> None:
    # Four rollouts of one group. After turn 0, rollouts 0 and 1 saw "higher", 2 and 3 saw
    # "lower": their second turns form two anchor groups of two.
    index = layout([2, 2, 2, 2], 6)
    episodes = [
        Episode((turn("higher"), turn("x", 1.0, True))),
        Episode((turn("higher"), turn("y"))),
        Episode((turn("lower"), turn("z", 1.0, True))),
        Episode((turn("lower"), turn("w"))),
    ]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    extra = turn_advantages(index, episodes, rewards, torch.zeros(4), "gigpo")
    assert extra is not None
    assert torch.allclose(extra[:, 3], torch.tensor([1.0, -1.0, 1.0, -1.0]))
    # turn-index grouping sees one group of four at turn 1: the same here, by symmetry; an
    # environment naming its state overrides the observation: all four in one anchor
    named = [Episode((turn(f"o{i}", state="s"), e.turns[1])) for i, e in enumerate(episodes)]
    extra_named = turn_advantages(index, named, rewards, torch.zeros(4), "gigpo")
    different_obs = [Episode((turn(f"o{i}"), e.turns[1])) for i, e in enumerate(episodes)]
    singletons = turn_advantages(index, different_obs, rewards, torch.zeros(4), "gigpo")
    assert extra_named is not None and singletons is not None
    assert torch.allclose(extra_named[:, 3], torch.tensor([1.0, -1.0, 1.0, -1.0]))
    assert bool((singletons[:, 3] == 0).all())  # each anchor group of one: nothing to compare
    # groups never mix: the same observations in two groups are two anchor groups
    split = turn_advantages(index, episodes, rewards, torch.tensor([0, 0, 1, 1]), "gigpo")
    assert split is not None and torch.allclose(split[:, 3], torch.tensor([1.0, -1.0, 1.0, -1.0]))


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp", "conspo"])
def test_the_objectives_that_take_turn_credit_move_each_turn_by_it(name: str) -> None:
    """Rewards without spread give no episode advantage: whatever gradient there is comes from
    the turn-level advantages, and it pushes each token along its own."""
    entry = get_objective(name)
    assert entry.turn_credit
    logprobs = torch.full((4, 3), -1.0, requires_grad=True)
    turn_adv = torch.tensor([[1.0, 1.0, -1.0], [0.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
    batch = PolicyBatch(
        logprobs=logprobs,
        mask=torch.ones(4, 3),
        rewards=torch.ones(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        correct=torch.ones(4),
        turn_advantages=turn_adv,
    )
    out = entry.fn(batch, entry.params())
    out.loss.backward()
    grad = logprobs.grad
    assert grad is not None
    # descending the loss raises log π where the turn advantage is positive, lowers it where
    # negative, and leaves it where it is 0
    assert bool((torch.sign(-grad) == torch.sign(turn_adv)).all())
    without = PolicyBatch(
        logprobs=logprobs.detach().requires_grad_(),
        mask=torch.ones(4, 3),
        rewards=torch.ones(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        correct=torch.ones(4),
    )
    entry.fn(without, entry.params()).loss.backward()
    assert without.logprobs.grad is None or bool((without.logprobs.grad == 0).all())


def env_config(**overrides) -> dict:
    base = {
        "algorithm": "grpo",
        "task": {"name": "environment", "params": {"environment": "guess_number"}},
        "environment": {"credit": "gigpo"},
    }
    base.update(overrides)
    return base


def refused_at(data: dict) -> dict[tuple, str]:
    with pytest.raises(ValidationError) as caught:
        RunConfig.model_validate(data)
    return {tuple(e["loc"]): e["msg"] for e in caught.value.errors()}


def test_a_credit_that_cannot_apply_is_refused_at_its_field() -> None:
    assert RunConfig.model_validate(env_config()).environment.credit == "gigpo"
    errors = refused_at(env_config(task={"name": "arith"}))
    assert "needs a task that plays one" in errors[("environment", "credit")]
    errors = refused_at(env_config(algorithm="gspo"))
    assert "per-turn advantages" in errors[("environment", "credit")]
    errors = refused_at(env_config(sampling={"engine": "hf"}))
    assert "native engine" in errors[("sampling", "engine")]
    errors = refused_at(env_config(environment={"max_turns": 11}))
    assert "at most 10 turns" in errors[("environment", "max_turns")]
    errors = refused_at(env_config(environment={"gamma": 1.5}))
    assert ("environment", "gamma") in errors
    # a task that plays no environment takes the section's defaults
    assert RunConfig.model_validate({"task": {"name": "arith"}}).played_environment() is None
