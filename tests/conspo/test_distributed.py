"""Data-parallel training (conspo.distributed.collectives) on 2 gloo processes against 1 process.

The equivalence tests give both the same rollout batch (sampled from the same seed by every
process) and compare one ``update.update``: 2 ranks, each differentiating half of the groups,
must give the 1-process loss, gradients, parameters and logged statistics. Every scenario runs
in one spawn of the 2 ranks (a process start costs seconds here).

Tolerances (float32, CPU): each rank's forward runs on different micro-batches than the single
process's (other padding, other shared prompts), so log-probs agree to float rounding, not bit
for bit; gradients are asserted to rtol 1e-5 / atol 1e-6 of their values, statistics to
rtol 1e-5 / atol 1e-6 too.
"""

from __future__ import annotations

import atexit
import math
import os
import pickle
import random
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.distributed import collectives as distributed
from conspo.launch import local as launch
from conspo.models.builtins import build_builtin, builtin_store
from conspo.models.store import ModelStore
from conspo.sink import MemorySink
from conspo.training import loop, rollouts, trainer, update

TASK = {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 4}

# name → config overrides; each exercises a whole-batch normaliser a rank alone would get wrong.
SCENARIOS: dict[str, dict[str, Any]] = {
    # seq-mean over the mini-batch's rollouts, group std, KL to a reference (β > 0).
    "grpo": {"algorithm": "grpo", "params": {"beta": 0.05}},
    # Mean over valid groups; the two-pass micro-batch path (a budget below one group).
    "conspo": {"algorithm": "conspo", "optim": {"micro_batch_tokens": 40}},
    # Token-mean over the mini-batch, the batch reward std, two mini-batches (π_old frozen, the
    # second update after the first moved π_θ), no dynamic sampling (the batch is fixed here).
    "dapo": {
        "algorithm": "dapo",
        "params": {"refill_groups": False, "scale_rewards": "batch", "overlong_buffer": 2},
        "optim": {"mini_batches": 2},
    },
    # The one-pass micro-batch path of an objective linear on policy (∂loss/∂log-probs before
    # any forward; each rank's micro-batches backpropagated as they run, values gathered after).
    "grpo-micro": {"algorithm": "grpo", "optim": {"micro_batch_tokens": 40}},
    # LoRA adapters (only they are reduced), the reference being the base without adapters.
    "conspo-lora": {
        "algorithm": "conspo",
        "model": {"name": "tiny-arith", "lora": {"rank": 4}},
        "params": {"beta": 0.05},
    },
    # resources.strategy fsdp: parameters, gradients and AdamW state sharded (FSDP2); the
    # reference model stays whole per rank. ConSPO over the two-pass micro-batch path (ranks
    # run different numbers of backwards) and two mini-batches (gather after an update).
    "grpo-fsdp": {"algorithm": "grpo", "params": {"beta": 0.05}, "resources": {"strategy": "fsdp"}},
    "dr_grpo-micro-fsdp": {
        "algorithm": "dr_grpo",
        "optim": {"micro_batch_tokens": 40},
        "resources": {"strategy": "fsdp"},
    },
    "conspo-fsdp": {
        "algorithm": "conspo",
        "optim": {"micro_batch_tokens": 40, "mini_batches": 2},
        "resources": {"strategy": "fsdp"},
    },
}


def scenario_config(name: str) -> RunConfig:
    data: dict[str, Any] = {
        "steps": 4,
        "seed": 3,
        "task": TASK,
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 6, "group_size": 4, "max_new_tokens": 6},
        "eval": {"every": 0, "at_start": False},
        **SCENARIOS[name],
    }
    return RunConfig.model_validate(data)


def one_update(name: str, store: ModelStore) -> dict[str, Any]:
    """Set up ``name``'s run, sample the step's whole batch as one process would, take one
    ``update.update``; the stats, the last update's gradient and the weights after it."""
    cfg = scenario_config(name)
    state = loop.setup(cfg, store)
    prompts = state.task.train_prompts(random.Random(7), cfg.sampling.prompts_per_step)
    r = rollouts.sample_groups(state, prompts, seed=11)
    stats, scores, updates = update.update(state, r, step=2, lr=cfg.optim.lr)
    # fsdp's are this rank's shards: the whole tensors (a collective).
    grads = torch.cat(
        [distributed.plain(p.grad).flatten() for p in state.trainable if p.grad is not None]
    )
    weights = torch.cat([distributed.plain(p.detach()).flatten() for p in state.trainable])
    return {
        "stats": {k: float(v) for k, v in stats.items()},
        "scores": scores.detach().cpu(),
        "updates": updates,
        "grad": grads.cpu(),
        "weights": weights.cpu(),
        "responses": r.batch.response_ids.cpu(),
        "sharded": distributed.is_sharded(state.model),
    }


def refill(store: ModelStore) -> dict[str, Any]:
    """One step's rollouts under dynamic sampling (DAPO), as this rank ends up holding them."""
    cfg = scenario_config("dapo").model_copy(update={"params": {"overlong_buffer": 2}})
    state = loop.setup(cfg, store)
    r = rollouts.collect_rollouts(state, 1, distributed.agreed(lambda: False))
    assert r is not None
    return {
        "responses": r.batch.response_ids.cpu(),
        "correct": r.correct,
        "rounds": r.refill_rounds,
        "prompts": sorted((p.key, p.n, p.correct) for p in r.prompts or []),
    }


def _rank(rank: int, world: int, port: int, store_root: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        store = builtin_store(store_root)
        results = {name: one_update(name, store) for name in SCENARIOS}
        results["refill"] = refill(store)
    finally:
        dist.destroy_process_group()
    Path(f"{out}.{rank}").write_bytes(pickle.dumps(results))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(model_store: ModelStore, arith_base: Path) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp()) / "ranks.pkl"
    mp.spawn(_rank, args=(2, free_port(), str(model_store.root), str(out)), nprocs=2)
    return {r: pickle.loads(Path(f"{out}.{r}").read_bytes()) for r in (0, 1)}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_ranks_on_half_batches_equal_one_process(
    name: str, two_ranks: dict[str, Any], model_store: ModelStore
) -> None:
    one, two = one_update(name, model_store), two_ranks[0][name]
    assert torch.equal(one["responses"], two["responses"])  # the same batch went in
    assert two["sharded"] == name.endswith("-fsdp") and not one["sharded"]
    assert one["updates"] == two["updates"] > 0
    torch.testing.assert_close(two["grad"], one["grad"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(two["weights"], one["weights"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(two["scores"], one["scores"], rtol=1e-5, atol=1e-6)
    assert one["stats"].keys() == two["stats"].keys()
    for key in one["stats"]:  # loss, separation statistics, entropy, grad norm, off-policy
        a, b = one["stats"][key], two["stats"][key]
        same = math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
        assert same or (math.isnan(a) and math.isnan(b)), (key, a, b)
    assert M.LOSS in one["stats"] and M.SEP_GAP in one["stats"]


def test_dynamic_sampling_keeps_the_ranks_in_lockstep(two_ranks: dict[str, Any]) -> None:
    """Refill rounds: every rank samples its share of each round, all see the whole round, so
    all take the same decisions (rounds drawn, groups kept) and hold the same batch."""
    a, b = two_ranks[0]["refill"], two_ranks[1]["refill"]
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["correct"], b["correct"])
    assert a["rounds"] == b["rounds"] and a["prompts"] == b["prompts"]
    by_group = a["correct"].view(-1, 4).sum(-1)
    assert ((by_group > 0) & (by_group < 4)).all()  # only groups with both outcomes were kept


def test_a_config_needs_a_group_per_process() -> None:
    with pytest.raises(ValueError, match=r"sampling.prompts_per_step \(2\) must be at least"):
        RunConfig.model_validate({"sampling": {"prompts_per_step": 2}, "resources": {"gpus": 4}})


@pytest.mark.slow  # launch_local end to end: a child process per run
def test_train_on_two_processes_logs_the_whole_batch_and_resumes(
    model_store: ModelStore, arith_base: Path, tmp_path: Path
) -> None:
    """``launch_local`` with 2 ranks: stopped by rank 0's ``should_stop`` after step 1, resumed
    to step 2 from rank 0's checkpoint. Rollouts differ from 1 process's (each rank draws its own
    sampling noise); what must match: the prompts drawn, every metric key, rollouts counted."""
    cfg = scenario_config("grpo").model_copy(update={"steps": 2})
    single = MemorySink()
    trainer.train(cfg, single, workdir=tmp_path / "one", model_store=model_store)

    sink = MemorySink()

    def stop_after_one() -> bool:
        return len(sink.steps) >= 1

    common = {"workdir": tmp_path / "two", "nprocs": 2, "model_store": model_store}
    first = launch.launch_local(cfg, sink, stop_after_one, timeout_s=120, **common)
    assert (first.status, first.last_step) == ("cancelled", 1)
    second = launch.launch_local(cfg, sink, timeout_s=120, **common)
    assert (second.status, second.last_step) == ("succeeded", 2)
    assert [e for e, _ in sink.events].count("resumed") == 1
    assert sorted(sink.steps) == sorted(single.steps) == [1, 2]
    for step in (1, 2):
        a, b = single.steps[step], sink.steps[step]
        assert a.metrics.keys() == b.metrics.keys()
        prompts = lambda rec: sorted((p.key, p.n) for p in rec.prompts)  # noqa: E731
        assert prompts(a) == prompts(b)
        assert len(a.rollouts) == len(b.rollouts)
        assert a.metrics[M.ROLLOUTS_SEEN] == b.metrics[M.ROLLOUTS_SEEN]
    assert not dist.is_initialized()  # the caller (a worker) goes on to other runs


class BrokenOnRankOne(ModelStore):
    """A model store rank 1 cannot load from: a child that fails after joining the group. With
    ``slow_exit_s``, the failed child then takes that long to exit, as on a loaded machine: its
    error must reach the run anyway, without waiting for the exit."""

    slow_exit_s = 0.0

    def resolve(self, name: str) -> Path | str:
        if distributed.rank() == 1:
            if self.slow_exit_s:
                atexit.register(time.sleep, self.slow_exit_s)
            raise RuntimeError("rank 1 cannot load its model")
        return super().resolve(name)


@pytest.mark.slow  # launch_local end to end: a child process per run
def test_a_failing_child_fails_the_run_with_its_own_error(
    model_store: ModelStore,
    arith_base: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 waits in a collective for rank 1, which died: the run fails with rank 1's
    traceback (not a hang, not only rank 0's 'connection closed'), and the group is gone."""
    # The child unpickles BrokenOnRankOne from this module, imported by pytest from its folder.
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    cfg = scenario_config("grpo")
    broken = BrokenOnRankOne(model_store.root, builder=build_builtin)
    broken.slow_exit_s = 60  # longer than rank 0 waits for an exit (the CI flake: 10 s then)
    started = time.monotonic()
    with pytest.raises(launch.RankFailed, match="rank 1 cannot load its model"):
        launch.launch_local(
            cfg, MemorySink(), workdir=tmp_path, nprocs=2, model_store=broken, timeout_s=120
        )
    assert time.monotonic() - started < broken.slow_exit_s  # not held by the slow exit
    assert not dist.is_initialized()


def test_fsdp_refuses_lora_and_vllm_at_submit() -> None:
    with pytest.raises(ValueError, match=r"resources.strategy 'fsdp' does not train LoRA"):
        RunConfig.model_validate(
            {"model": {"lora": {"rank": 4}}, "resources": {"gpus": 2, "strategy": "fsdp"}}
        )
    with pytest.raises(ValueError, match=r"sampling.engine must be 'native' or 'hf'"):
        RunConfig.model_validate(
            {"sampling": {"engine": "vllm"}, "resources": {"gpus": 2, "strategy": "fsdp"}}
        )


@pytest.mark.slow  # launch_local end to end, three times
def test_fsdp_run_stopped_and_resumed_equals_the_uninterrupted_run(
    model_store: ModelStore, arith_base: Path, tmp_path: Path
) -> None:
    """2 fsdp ranks, stopped after step 1 and resumed from rank 0's checkpoint (gathered
    shards: weights and AdamW state): every step logged once, and the final weights and
    statistics equal those of the same 2-rank run uninterrupted (the same seeds per rank)."""
    from safetensors.torch import load_file

    cfg = scenario_config("conspo-fsdp")
    # Evaluated at the end, kept as checkpoints/best: the gathered weights, rank 0 deciding.
    evaluation = cfg.eval.model_copy(update={"every": 2, "best_metric": M.EVAL_ACCURACY})
    cfg = cfg.model_copy(update={"steps": 2, "eval": evaluation})
    common = {"nprocs": 2, "model_store": model_store, "timeout_s": 120}
    whole = MemorySink()
    launch.launch_local(cfg, whole, workdir=tmp_path / "whole", **common)

    sink = MemorySink()
    first = launch.launch_local(
        cfg, sink, lambda: len(sink.steps) >= 1, workdir=tmp_path / "parts", **common
    )
    assert (first.status, first.last_step) == ("cancelled", 1)
    second = launch.launch_local(cfg, sink, workdir=tmp_path / "parts", **common)
    assert (second.status, second.last_step) == ("succeeded", 2)
    assert [e for e, _ in sink.events].count("resumed") == 1
    assert sorted(sink.steps) == sorted(whole.steps) == [1, 2]
    for key in (M.LOSS, M.GRAD_NORM, M.SEP_GAP):
        assert sink.steps[2].metrics[key] == whole.steps[2].metrics[key], key
    final = "checkpoints/step_000002/model.safetensors"
    a, b = load_file(tmp_path / "whole" / final), load_file(tmp_path / "parts" / final)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    best = load_file(tmp_path / "parts" / "checkpoints/best/model.safetensors")
    assert best.keys() == a.keys() and all(torch.equal(best[k], a[k]) for k in a)
