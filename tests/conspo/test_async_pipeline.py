"""Asynchronous generation (sampling.max_staleness, conspo.training.pipeline): step s is sampled
by exactly the weights after update s − 1 − k, whatever the threads' timing; an async run logs
its policy lag and waits, corrects with the sampler's log-probs, reproduces itself, resumes,
cancels without leaving its thread, and is refused where it cannot be right."""

from __future__ import annotations

import threading

import pytest
import torch
from pydantic import ValidationError

from conspo import metrics as M
from conspo import stopping
from conspo.config import RunConfig
from conspo.models.resources import ModelDims, estimate_memory
from conspo.sink import MemorySink
from conspo.training.loop import setup
from conspo.training.pipeline import RolloutPipeline, snapshot
from conspo.training.rollouts import collect_rollouts
from conspo.training.trainer import train


def config(steps: int = 4, **sampling) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": steps,
        "seed": 5,
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 2}, "eval_size": 4},
        "model": {"name": "tiny-arith"},
        "optim": {"lr": 3e-3},
        "checkpoint": {"every": 1, "keep": 5},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, **sampling},
    })  # fmt: skip


def generation_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("conspo-rollouts")]


def moved(model: torch.nn.Module, seed: int) -> None:
    """An update stand-in: every trainable weight moved by noise of its own."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def sampled_by(cfg: RunConfig, store, weights: dict[str, torch.Tensor], step: int):
    """Step ``step``'s rollouts drawn synchronously by a fresh policy holding ``weights``."""
    state = setup(cfg, store)
    with torch.no_grad():
        for name, p in state.model.named_parameters():
            if name in weights:
                p.copy_(weights[name])
    return collect_rollouts(state, step, lambda: False)


@pytest.mark.parametrize("k", [1, 2])
def test_step_s_is_sampled_by_the_weights_after_update_s_minus_1_minus_k(model_store, k):
    cfg = config(steps=5, max_staleness=k)
    state = setup(cfg, model_store)
    versions = {0: snapshot(state.model)}
    pipeline = RolloutPipeline(state, first_step=1, max_staleness=k)
    taken = {}
    try:
        for step in range(1, 6):
            generated, _ = pipeline.take(step, lambda: False)
            taken[step] = generated
            moved(state.model, step)  # update `step`
            versions[step] = snapshot(state.model)
            pipeline.publish(step, state.model)
    finally:
        pipeline.close()
    assert [taken[s].version for s in range(1, 6)] == [max(0, s - 1 - k) for s in range(1, 6)]
    for step in (k + 1, 5):  # the last step of the starting weights, and one k updates stale
        want = sampled_by(cfg, model_store, versions[taken[step].version], step)
        got = taken[step].rollouts
        assert torch.equal(got.batch.response_ids, want.batch.response_ids), step
        assert torch.equal(got.rewards, want.rewards), step
    # and not by the trainer's own weights: those sample otherwise
    fresh = sampled_by(cfg, model_store, versions[4], 5)
    assert not torch.equal(taken[5].rollouts.batch.response_ids, fresh.batch.response_ids)
    assert not generation_threads()


def test_an_async_run_logs_its_lag_corrects_with_the_sampler_and_reproduces(model_store, tmp_path):
    cfg = config(max_staleness=1)
    assert cfg.sampling.correction == "sequence_mask"  # auto: the sampler is older weights
    runs = []
    for name in ("a", "b"):
        sink = MemorySink()
        assert train(cfg, sink, workdir=tmp_path / name, model_store=model_store).last_step == 4
        runs.append({s: r.metrics for s, r in sink.steps.items()})
        assert not generation_threads()
    first, second = runs
    assert [first[s][M.ASYNC_POLICY_LAG] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    for s in (1, 2, 3, 4):
        assert first[s][M.ASYNC_TRAINER_WAIT_S] >= 0 and first[s][M.ASYNC_GENERATOR_IDLE_S] >= 0
        for key in (M.LOSS, M.SEP_GAP, M.MISMATCH_LOGP_DIFF_MEAN):  # the same run twice
            same = pytest.approx(second[s][key], rel=1e-6, abs=1e-9, nan_ok=True)
            assert first[s][key] == same, (s, key)
    # step 1 is sampled by the trainer's own weights; a step after an update, by older ones
    assert first[1][M.MISMATCH_LOGP_DIFF_MEAN] < 1e-4
    stale = [s for s in (2, 3, 4) if first[s - 1][M.OPTIM_UPDATES] > 0]
    assert stale, "no update moved the policy: nothing was stale"
    for s in stale:
        assert first[s][M.MISMATCH_LOGP_DIFF_MEAN] > 1e-4, s


def test_an_async_run_resumes_each_step_once_from_the_checkpoint(model_store, tmp_path):
    sink = MemorySink()
    stop_after_two = lambda: 2 in sink.steps  # noqa: E731
    result = train(config(max_staleness=2), sink, stop_after_two, workdir=tmp_path,
                   model_store=model_store)  # fmt: skip
    assert (result.status, result.last_step) == ("cancelled", 2)
    assert not generation_threads()
    resumed = MemorySink()
    train(config(max_staleness=2), resumed, workdir=tmp_path, model_store=model_store)
    assert sorted(resumed.steps) == [3, 4]
    # the pipeline restarts from the checkpoint's weights: step 3 is theirs
    lags = [resumed.steps[s].metrics[M.ASYNC_POLICY_LAG] for s in (3, 4)]
    assert lags == [0, 1]


def test_a_cancel_inside_generation_ends_the_run_and_its_thread(model_store, tmp_path):
    sink = MemorySink()
    with stopping.abandon_when(lambda: 1 in sink.steps):  # lands while step 2+ generate
        result = train(config(steps=6, max_staleness=2), sink, workdir=tmp_path,
                       model_store=model_store)  # fmt: skip
    assert result.status == "cancelled" and result.last_step <= 2
    assert not generation_threads()


def test_what_async_cannot_do_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="sampling.max_staleness.*hf engine"):
        config(max_staleness=1, engine="hf")
    with pytest.raises(ValidationError, match="sampling.max_staleness.*one process"):
        RunConfig.model_validate(config(max_staleness=1).model_dump() | {"resources": {"gpus": 2}})
    with pytest.raises(ValidationError, match="max_staleness"):
        config(max_staleness=9)


def test_the_memory_estimate_adds_the_overlapped_sampling_and_the_copies():
    dims = ModelDims(params=135_000_000, layers=30, hidden=576, intermediate=1536,
                     kv_width=192, vocab=49152)  # fmt: skip

    def lora(**sampling) -> RunConfig:
        data = config(**sampling).model_dump()
        data["model"]["lora"]["rank"] = 16
        return RunConfig.model_validate(data)

    sync = estimate_memory(lora(), dims, 4)
    overlapped = estimate_memory(lora(max_staleness=2), dims, 4)
    assert overlapped.overlapped and not sync.overlapped
    assert overlapped.state > sync.state
    step = sync.sampling + sync.update
    assert overlapped.total == overlapped.process + overlapped.state + max(step, sync.evaluation)
