"""Shared fixtures: one model store per test session, so the SFT base is built once; the SFT
base as a policy and a left-padded prompt batch for the rollout and forward tests."""

import pytest
import torch

from conspo.generation.rollout import encode_prompts
from conspo.models.builtins import builtin_store
from conspo.models.loading import load_pretrained
from conspo.models.store import ModelStore
from tests.support import shared_model_store


@pytest.fixture(scope="session", autouse=True)
def _single_thread():
    # Tiny models run 2-3x faster single-threaded on a shared CPU.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def model_store(tmp_path_factory) -> ModelStore:
    return builtin_store(shared_model_store(tmp_path_factory))


@pytest.fixture(scope="session")
def arith_base(model_store):
    """Path of tiny-arith (tiny + SFT warm start), built once for the session."""
    return model_store.resolve("tiny-arith")


@pytest.fixture(scope="module")
def policy(arith_base):
    model, tok = load_pretrained(arith_base, torch.device("cpu"), torch.float32)
    return model.eval(), tok


@pytest.fixture(scope="module")
def prompts(policy):
    _, tok = policy
    # Different prompt lengths, so left padding matters.
    texts = ["1+2=", "7-3+5=", "12+34=", "9=", "3-8-1="]
    return encode_prompts(tok, texts, torch.device("cpu"))
