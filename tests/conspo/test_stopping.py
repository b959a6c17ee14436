"""A cancel lands inside a long forward pass that computes no gradient (issue 37: a prefill of
SmolLM2's prompts took ~7 s on a loaded CPU with nowhere to stop; a cancel took 10-22 s)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conspo import stopping

LAYERS = 4


@pytest.fixture
def model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    built = LlamaForCausalLM(config)
    stopping.check_between_layers(built)
    return built


def asked_until(turns_true_at: int) -> tuple[list[int], object]:
    asked: list[int] = []

    def check() -> bool:
        asked.append(1)
        return len(asked) >= turns_true_at

    return asked, check


def test_a_forward_without_gradients_stops_between_its_layers(model: LlamaForCausalLM) -> None:
    ids = torch.randint(0, 64, (2, 8))
    asked, check = asked_until(3)
    with torch.no_grad(), stopping.abandon_when(check), pytest.raises(stopping.Abandoned):
        model(input_ids=ids)
    assert len(asked) == 3  # before the third layer: the rest of the pass never ran


def test_a_forward_that_computes_gradients_is_left_alone(model: LlamaForCausalLM) -> None:
    ids = torch.randint(0, 64, (2, 8))
    asked, check = asked_until(1)
    with stopping.abandon_when(check):
        model(input_ids=ids).logits.sum().backward()
    assert asked == []  # the update asks between its micro-batches instead


def test_without_a_check_installed_the_hooks_do_nothing(model: LlamaForCausalLM) -> None:
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    fresh = LlamaForCausalLM(model.config)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, before)
