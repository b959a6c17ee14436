"""Shared fixtures: one model store per test session, so the SFT base is built once."""

import pytest
import torch

from conspo.models import ModelStore


@pytest.fixture(scope="session", autouse=True)
def _single_thread():
    # Tiny models run 2-3x faster single-threaded on a shared CPU.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def model_store(tmp_path_factory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("model-store"))


@pytest.fixture(scope="session")
def arith_base(model_store):
    """Path of tiny-arith (tiny + SFT warm start), built once for the session."""
    return model_store.resolve("tiny-arith")
