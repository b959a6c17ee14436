"""Shared fixtures: one model store per test session, so the SFT base is built once; the SFT
base as a policy and a left-padded prompt batch for the rollout and forward tests; two steps of
every registered job kind, which the registry and metric tests both read."""

import random
from dataclasses import dataclass

import pytest
import torch

from conspo.config import RunConfig
from conspo.generation.rollout import encode_prompts
from conspo.jobs import RolloutsOf, prepare_inputs, train_job
from conspo.models.builtins import builtin_store
from conspo.models.loading import load_pretrained
from conspo.models.store import ModelStore
from conspo.registry import get_job_kind, job_kind_names
from conspo.sink import MemorySink
from conspo.tasks import make_task
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


@dataclass(frozen=True)
class KindRun:
    config: RunConfig
    logged: set[str]  # every key its steps logged
    status: str


def stand_in_rollouts(config: RunConfig) -> RolloutsOf:
    """A finished run's stored rollouts, for a kind that reads another run's (its input_runs):
    for a few of the task's prompts, the reference answer (reward 1) and a wrong one (0)."""
    task = make_task(config.task)
    prompts = task.train_prompts(random.Random(0), 4)

    def rollouts_of(run_id: int) -> list[tuple[str, str, float | None]]:
        return [r for ex in prompts for r in ((ex.prompt, ex.answer, 1.0),
                                              (ex.prompt, f"{ex.answer}0", 0.0))]  # fmt: skip

    return rollouts_of


@pytest.fixture(scope="session")
def job_kind_runs(model_store, tmp_path_factory) -> dict[str, KindRun]:
    """Two steps of every registered job kind, from the example params of its registration
    (``RegisteredJobKind.example_params``) on the tiny model, with a final evaluation."""
    tmp = tmp_path_factory.mktemp("kind-runs")
    runs = {}
    for kind in job_kind_names():
        config = RunConfig.model_validate({
            "kind": kind, "kind_params": get_job_kind(kind).example_params, "steps": 2,
            "model": {"name": "tiny"}, "task": {"name": "arith", "eval_size": 2},
            "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
            "eval": {"every": 0, "pass_k": 1}, "checkpoint": {"every": 0},
        })  # fmt: skip
        workdir = tmp / kind
        workdir.mkdir()
        prepare_inputs(config, workdir, stand_in_rollouts(config))
        sink = MemorySink()
        result = train_job(config, sink, workdir=workdir, model_store=model_store)
        logged = set().union(*(record.metrics for record in sink.steps.values()))
        runs[kind] = KindRun(config, logged, result.status)
    return runs
