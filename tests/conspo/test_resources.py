"""The memory estimate (conspo.models.resources): model dimensions read without loading weights, the
estimate against a measured peak, and the refusal of a config that cannot fit."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from conspo.access import ModelSources
from conspo.config import RunConfig
from conspo.models.resources import (
    AUTO_GRAPH_BYTES,
    PROCESS_BYTES,
    MemoryRefused,
    ModelDims,
    check_budget,
    check_memory,
    estimate_memory,
    read_hf_config,
    source_dims,
    supervised_row_tokens,
)
from conspo.models.tiny import save_tiny
from conspo.tasks import Example

ROOT = Path(__file__).resolve().parents[2]
MAXIMAL = {"prompts_per_step": 4096, "group_size": 256, "max_new_tokens": 32_768}

SMALL_DECODERS = {
    "qwen2, grouped kv heads, untied": dict(
        model_type="qwen2", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False,
    ),
    "llama, explicit head_dim": dict(
        model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, vocab_size=200,
        tie_word_embeddings=False,
    ),
    "mistral, tied": dict(
        model_type="mistral", hidden_size=48, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, vocab_size=150, tie_word_embeddings=True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", SMALL_DECODERS)
def test_parameter_count_from_config_json_matches_the_model(name):
    config = SMALL_DECODERS[name]
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    dims = ModelDims.from_hf_config(config)
    assert dims is not None
    assert dims.params == sum(p.numel() for p in model.parameters())


def test_builtin_dims_are_those_of_the_built_model(tmp_path):
    save_tiny(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    builtin = source_dims(ModelSources().locate("tiny"))
    assert builtin == ModelDims.from_hf_config(read_hf_config(tmp_path) or {})
    assert builtin is not None and builtin.params == sum(p.numel() for p in model.parameters())
    local = ModelSources(roots=(tmp_path.parent,)).locate(str(tmp_path))
    assert source_dims(local) == builtin


def test_a_config_without_decoder_dimensions_is_not_estimated(tmp_path):
    assert ModelDims.from_hf_config({"model_type": "bert"}) is None
    assert ModelDims.from_hf_config({**SMALL_DECODERS["mistral, tied"], "hidden_size": -1}) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert read_hf_config(tmp_path) is None
    (tmp_path / "config.json").write_bytes(b" " * (2**20 + 1))  # read with a bound
    assert read_hf_config(tmp_path) is None


def test_the_maximal_sampling_config_is_refused_with_its_estimate():
    cfg = RunConfig.model_validate({"sampling": MAXIMAL})
    dims = source_dims(ModelSources().locate(cfg.model.name))
    assert dims is not None
    estimate = estimate_memory(cfg, dims, dtype_bytes=2)
    assert estimate.total > 275 * 10**9  # what the tester saw it ask for, at least
    with pytest.raises(MemoryRefused, match=r"needs about [\d.,]+ TiB") as info:
        check_memory(estimate, limit=80 * 2**30)
    assert info.value.loc == ("sampling",)
    assert "over the 80.0 GiB" in str(info.value)
    check_memory(estimate_memory(RunConfig(), dims, dtype_bytes=4), limit=2**30)  # the default


def test_the_estimate_grows_with_what_a_step_holds():
    dims = source_dims(ModelSources().locate("tiny"))
    assert dims is not None

    def total(**sampling: int) -> int:  # what the step holds: the process aside
        cfg = RunConfig.model_validate({"sampling": sampling})
        estimate = estimate_memory(cfg, dims, 4)
        return estimate.total - estimate.process

    base = total(prompts_per_step=16, group_size=8, max_new_tokens=64)
    assert total(prompts_per_step=32, group_size=8, max_new_tokens=64) > 1.9 * base - 10**7
    assert total(prompts_per_step=16, group_size=8, max_new_tokens=128) > 1.9 * base - 10**7
    split = RunConfig.model_validate(
        {"sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 64},
         "optim": {"mini_batches": 4}}
    )  # fmt: skip
    assert estimate_memory(split, dims, 4).update < base / 2


@pytest.mark.parametrize("lora", [0, 8])
def test_a_critic_adds_a_second_backbone_trained_as_the_policy_is(lora: int):
    """PPO's critic (conspo.training.critic) is a second copy of the backbone with its own
    adapters (or whole, trained): the state grows by exactly the policy's own state less its
    reference, and nothing else in the step changes."""
    dims = source_dims(ModelSources().locate("tiny"))
    assert dims is not None

    def estimate(algorithm: str) -> Any:
        cfg = RunConfig.model_validate({"algorithm": algorithm, "model": {"lora": {"rank": lora}}})
        return estimate_memory(cfg, dims, 4)

    grpo, ppo = estimate("grpo"), estimate("ppo")
    assert ppo.state - grpo.state == grpo.state  # neither has a reference (β = 0)
    assert (ppo.sampling, ppo.update, ppo.evaluation) == (
        grpo.sampling,
        grpo.update,
        grpo.evaluation,
    )


@pytest.mark.parametrize("lora", [0, 8])
def test_rrpo_anchors_count_a_reference_as_the_kl_does(lora: int):
    """RRPO's anchors read a frozen reference (conspo.training.anchors): without LoRA a copy of
    the weights, as GRPO's β > 0 holds; with LoRA the base itself, nothing more."""
    dims = source_dims(ModelSources().locate("tiny"))
    assert dims is not None

    def estimate(algorithm: str, **params: float) -> Any:
        cfg = RunConfig.model_validate(
            {"algorithm": algorithm, "params": params, "model": {"lora": {"rank": lora}}}
        )
        return estimate_memory(cfg, dims, 4)

    rrpo, grpo, with_kl = estimate("rrpo"), estimate("grpo"), estimate("grpo", beta=0.1)
    assert rrpo.state == with_kl.state
    assert (rrpo.state > grpo.state) == (lora == 0)


def test_lora_checkpointing_and_micro_batches_shrink_what_they_should():
    dims = ModelDims.from_hf_config({**SMALL_DECODERS["qwen2, grouped kv heads, untied"],
                                     "vocab_size": 151_936, "num_hidden_layers": 24})  # fmt: skip
    assert dims is not None
    sampling = {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 1024}

    def estimate(model=None, optim=None, dtype_bytes=2):
        cfg = RunConfig.model_validate({"sampling": sampling, "model": model or {},
                                        "optim": optim or {}, "params": {"beta": 0.1}})  # fmt: skip
        return estimate_memory(cfg, dims, dtype_bytes)

    full = estimate(optim={"memory_budget": 10_000})  # one gradient pass: no split needed
    assert full.micro_batch_tokens == 0
    lora = estimate({"lora": {"rank": 8}})
    assert lora.state < full.state / 4  # no gradients, moments or reference copy of the base
    unsplit = {"memory_budget": 10_000}
    assert estimate({"gradient_checkpointing": True}, unsplit).update < full.update / 2
    assert estimate(optim={"micro_batch_tokens": 4096}).update < full.update / 3
    mixed = estimate({"mixed_precision": True})
    assert mixed.state == 2 * full.state  # float32 master weights and moments
    assert estimate({"dtype": "float16"}).state == mixed.state  # float16 is always mixed
    # The logits of the training forward are one chunk, not 64 × 1024 positions × V.
    assert full.update < 64 * 1024 * 151_936 * 4


# The measured peak: a CPU run in a fresh process, after a warm-up run that pays the one-time
# costs the estimate leaves out (libraries, the tokenizer, torch's first calls). The peak growth
# of its anonymous resident memory (file-backed library pages left out: page-cache pressure from
# other processes evicts and re-faults them) is compared with the estimate: 1.07-1.20x on the
# development machine (the estimate leaves out allocator slack, so it reads a little low, as a
# refusal threshold should).
MEASURE = textwrap.dedent(
    """
    import json, resource, sys, threading, time
    import torch
    from conspo.access import ModelSources
    from conspo.config import RunConfig
    from conspo.models.builtins import builtin_store
    from conspo.models.store import ModelStore
    from conspo.models.resources import estimate_memory, source_dims
    from conspo.sink import MemorySink
    from conspo.training.trainer import train

    torch.set_num_threads(1)
    store, workdir, overrides = builtin_store(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    base = {"algorithm": "grpo", "steps": 1, "model": {"name": "tiny", "device": "cpu"},
            "task": {"name": "arith", "eval_size": 4}, "eval": {"every": 0, "pass_k": 1},
            "checkpoint": {"every": 0}, "params": {"beta": 0.1}}
    warm_up = {**base, "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}}
    train(RunConfig.model_validate(warm_up), MemorySink(), workdir=workdir + "w", model_store=store)
    cfg = RunConfig.model_validate({**base, **overrides})

    def anonymous() -> int:  # resident minus file-backed pages, which page-cache pressure evicts
        _, resident, shared, *_ = (int(x) for x in open("/proc/self/statm").read().split())
        return (resident - shared) * resource.getpagesize()

    before, peak, done = anonymous(), [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], anonymous())
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    train(cfg, MemorySink(), workdir=workdir + "r", model_store=store)
    done.set()
    watcher.join()
    peak = peak[0]
    estimate = estimate_memory(cfg, source_dims(ModelSources().locate("tiny")), 4)
    # the process (libraries, the tokenizer) is in ``before``: the step's own growth is compared
    print(json.dumps({"measured": peak - before, "estimate": estimate.total - estimate.process}))
    """
)

MEASURED_CONFIGS = {
    # ConSPO, not GRPO: the random tiny model answers nothing right, and a GRPO step without
    # signal (β = 0) skips its backward (conspo.training.update.without_gradient), where the
    # estimate is of a step with a gradient pass; ConSPO's in-group softmax still runs it.
    "one mini-batch": {
        "algorithm": "conspo",
        "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 48},
        "params": {"beta": 0.0},
    },
    "two mini-batches and a reference model": {
        "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 48},
        "optim": {"mini_batches": 2},
    },
    "LoRA, gradient checkpointing and micro-batches": {
        "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 48},
        "model": {
            "name": "tiny",
            "device": "cpu",
            "gradient_checkpointing": True,
            "lora": {"rank": 8},
        },
        "optim": {"mini_batches": 2, "micro_batch_tokens": 1024},
    },
}


def measure(overrides: dict[str, Any], tmp_path: Path) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path / "store"), f"{tmp_path}/",
         json.dumps(overrides)],
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                       "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", MEASURED_CONFIGS)
def test_the_estimate_is_within_a_stated_factor_of_the_measured_peak(name, tmp_path):
    got = [measure(MEASURED_CONFIGS[name], tmp_path / "1")]
    if got[0]["measured"] > 1.6 * got[0]["estimate"]:
        # What else runs on the machine only ever adds to a measured peak (allocator state,
        # pages faulted back in), never takes from it: a second measurement, and the lower.
        got.append(measure(MEASURED_CONFIGS[name], tmp_path / "2"))
    measured, estimate = min(g["measured"] for g in got), got[0]["estimate"]
    ratio = measured / estimate
    print(f"{name}: measured {measured / 2**20:.0f} MiB, estimate {estimate / 2**20:.0f} MiB,"
          f" ratio {ratio:.2f}")  # fmt: skip
    # The stated factor: the real peak is at least 0.6x and at most 1.6x the estimate. The
    # estimate's gradient pass holds every answer at max_new_tokens; the trainer's length buckets
    # (groups cut where one answer runs long) hold only the tokens sampled, so a step of short
    # answers peaks below it (0.73x for two mini-batches here, 1.07x when groups stayed whole).
    assert 0.6 <= ratio <= 1.6, got


def smol_config(**optim: Any) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 16}},
        "sampling": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 128},
        "eval": {"pass_k": 1}, "task": {"eval_size": 8}, "optim": optim,
    })  # fmt: skip


def test_a_memory_budget_splits_the_gradient_pass_as_far_as_it_must():
    dims = source_dims(ModelSources().locate("smollm2-135m-instruct"))
    assert dims is not None
    unsplit = estimate_memory(smol_config(memory_budget=10_000), dims, 4)
    assert unsplit.micro_batch_tokens == 0
    gib = 2**30
    fitted = []
    for budget in (6, 4, 2.5):  # GiB, each under the unsplit step's estimate
        assert unsplit.total > budget * gib
        cfg = smol_config(memory_budget=budget)
        estimate = estimate_memory(cfg, dims, 4)
        check_budget(estimate, cfg)  # fits
        assert estimate.total <= budget * gib and 128 <= estimate.micro_batch_tokens < 64 * 128
        # the largest split that fits: one more token's worth would not
        bigger = estimate_memory(smol_config(micro_batch_tokens=estimate.micro_batch_tokens + 1),
                                 dims, 4)  # fmt: skip
        assert bigger.total > budget * gib
        fitted.append(estimate.micro_batch_tokens)
    assert fitted == sorted(fitted, reverse=True)
    # What no split can fit is refused at the budget's field, with the estimate.
    cfg = smol_config(memory_budget=0.5)
    with pytest.raises(MemoryRefused, match=r"needs about .* over optim.memory_budget") as info:
        check_budget(estimate_memory(cfg, dims, 4), cfg)
    assert info.value.loc == ("optim", "memory_budget")
    tiny_budget = smol_config(memory_budget=1e-12)  # under a byte: still a budget, refused
    with pytest.raises(MemoryRefused):
        check_budget(estimate_memory(tiny_budget, dims, 4), tiny_budget)
    # An explicit micro_batch_tokens is what runs, budget or not.
    assert estimate_memory(smol_config(micro_batch_tokens=300, memory_budget=3), dims,
                           4).micro_batch_tokens == 300  # fmt: skip


def test_the_automatic_budget_keeps_the_graph_within_what_sampling_takes():
    smol = source_dims(ModelSources().locate("smollm2-135m-instruct"))
    tiny = source_dims(ModelSources().locate("tiny"))
    assert smol is not None and tiny is not None
    auto = estimate_memory(smol_config(), smol, 4)
    assert auto.micro_batch_tokens > 0
    assert auto.update <= max(auto.sampling, auto.evaluation, AUTO_GRAPH_BYTES)
    assert auto.total < estimate_memory(smol_config(memory_budget=10_000), smol, 4).total
    # A limit (the worker's memory) below that splits further.
    limited = estimate_memory(smol_config(), smol, 4, limit=auto.process + auto.state + 2**29)
    assert limited.micro_batch_tokens < auto.micro_batch_tokens
    assert limited.update <= 2**29
    # A small model's step needs no split.
    assert estimate_memory(RunConfig(), tiny, 4).micro_batch_tokens == 0


def test_fsdp_divides_the_sharded_state_by_the_processes():
    """fsdp (conspo.distributed.collectives): each of W processes holds the gathered weights, 1/W of
    the weights, gradients and moments, and the whole reference; the update adds the gathered
    gradient. ddp keeps every process's full copy whatever W."""
    dims = ModelDims.from_hf_config({**SMALL_DECODERS["qwen2, grouped kv heads, untied"],
                                     "vocab_size": 151_936, "num_hidden_layers": 24})  # fmt: skip
    assert dims is not None

    def estimate(gpus: int, strategy: str, beta: float = 0.0):
        cfg = RunConfig.model_validate({"sampling": {"prompts_per_step": 8},
                                        "resources": {"gpus": gpus, "strategy": strategy},
                                        "optim": {"memory_budget": 10_000},  # no split
                                        "params": {"beta": beta}})  # fmt: skip
        return estimate_memory(cfg, dims, 4)

    p = dims.params * 4
    ddp = estimate(8, "ddp")
    assert ddp.state == 4 * p == estimate(1, "ddp").state
    fsdp = estimate(8, "fsdp")
    assert fsdp.state == p + 4 * p / 8
    assert fsdp.update == ddp.update + p
    assert estimate(8, "fsdp", beta=0.1).state == 2 * p + 4 * p / 8
    assert estimate(1, "fsdp") == estimate(1, "ddp")  # one process shards nothing


# Kinds that train on given rows (issue 49: an SFT stage estimated at 1.6 GiB peaked at 4.32 GiB
# RSS, its rows counted as RL rollouts with chunked logits; bench/memory_estimate.py holds SFT, DPO
# and a GRPO run with a tool within 1.5x of their measured peaks on SmolLM2).


def supervised(kind: str, batch_size: int, **extra: Any) -> RunConfig:
    # where the rows come from: files, sized by max_new_tokens (an sft step on the task's own
    # problems has its rows measured instead: test_an_sft_step_is_sized_by_its_rows)
    pairs = {"from_run": 1} if kind == "dpo" else {"path": "rows.jsonl"}
    return RunConfig.model_validate({
        "kind": kind, "kind_params": {"batch_size": batch_size, **pairs},
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 16},
                  **extra},
        "sampling": {"max_new_tokens": 48}, "task": {"eval_size": 8}, "eval": {"pass_k": 1},
    })  # fmt: skip


def test_sft_and_dpo_steps_are_one_unsplit_forward_over_their_rows():
    dims = source_dims(ModelSources().locate("smollm2-135m-instruct"))
    assert dims is not None
    one, two = (estimate_memory(supervised("sft", n), dims, 4) for n in (16, 32))
    # nothing is sampled in a step, and the update is all its rows at once, whatever the optim
    # settings a split would come from (the step ignores them)
    assert one.sampling == 0 and one.micro_batch_tokens == 0
    budgeted = supervised("sft", 16).model_copy(
        update={"optim": supervised("sft", 16).optim.model_copy(update={"memory_budget": 1.0})}
    )
    assert estimate_memory(budgeted, dims, 4).update == one.update
    # every row's logits at once: twice the rows, twice the update (float32 LoRA: nothing fixed)
    assert two.update == 2 * one.update
    assert one.update > 16 * 48 * dims.vocab * 4  # not one chunk of logits
    # a DPO pair is two rows, and the reference scores them too
    dpo = estimate_memory(supervised("dpo", 8), dims, 4)
    assert dpo.update > one.update and dpo.state == one.state  # LoRA: the base is the reference
    full_sft = estimate_memory(supervised("sft", 8, lora={"rank": 0}), dims, 4)
    full_dpo = estimate_memory(supervised("dpo", 8, lora={"rank": 0}), dims, 4)
    assert full_dpo.state == full_sft.state * 5 / 4  # a frozen copy of the starting weights


# Issue 49's walk on SmolLM2 (LoRA r16): SFT at batch 8 estimated 1.3 GiB, peaked at 3.15 GiB RSS;
# GRPO 1.3 vs 2.80. The process was left out, and an SFT row was sized by max_new_tokens (16 by
# default) while the task's rows under the chat template are ~76 tokens.
# bench/memory_estimate.py measures the peaks these terms are held to.


def test_the_process_is_counted_in_every_estimate():
    dims = source_dims(ModelSources().locate("tiny"))
    assert dims is not None
    estimate = estimate_memory(RunConfig(), dims, 4)
    assert estimate.process == PROCESS_BYTES >= 400 * 2**20  # python + torch + transformers
    step = estimate.state + max(estimate.sampling, estimate.evaluation, estimate.update)
    assert estimate.total == estimate.process + step
    assert "process 430.0 MiB" in estimate.describe()
    # what fits the step alone does not fit the run
    with pytest.raises(MemoryRefused):
        check_memory(estimate, limit=step + PROCESS_BYTES // 2)
    # a memory budget is for the whole run too: the split leaves room for the process
    smol = source_dims(ModelSources().locate("smollm2-135m-instruct"))
    assert smol is not None
    cfg = smol_config(memory_budget=2.5)
    budgeted = estimate_memory(cfg, smol, 4)
    check_budget(budgeted, cfg)
    assert budgeted.total <= 2.5 * 2**30 and budgeted.process == PROCESS_BYTES


class QuestionsOf:
    """A built task's stand-in: every training problem a question of ``chars`` characters."""

    def __init__(self, chars: int) -> None:
        self.chars = chars

    def train_prompts(self, rng: Any, n: int) -> list[Example]:
        return [Example("q" * self.chars, "42") for _ in range(n)]


def sft_on_task(batch_size: int = 8, max_new_tokens: int = 16, **kind_params: Any) -> RunConfig:
    return RunConfig.model_validate({
        "kind": "sft", "kind_params": {"batch_size": batch_size, **kind_params},
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 16}},
        "sampling": {"max_new_tokens": max_new_tokens}, "task": {"eval_size": 8},
        "eval": {"pass_k": 1},
    })  # fmt: skip


def test_an_sft_step_is_sized_by_its_rows():
    dims = source_dims(ModelSources().locate("smollm2-135m-instruct"))
    assert dims is not None

    def update(cfg: RunConfig, task: Any = None) -> int:
        return estimate_memory(cfg, dims, 4, task=task).update

    # The rows are the task's prompts and targets, whatever max_new_tokens (which bounds what
    # evaluation writes): the walk's default of 16 no longer sizes a 76-token row.
    short, long = QuestionsOf(30), QuestionsOf(300)
    assert update(sft_on_task(max_new_tokens=16), short) == update(
        sft_on_task(max_new_tokens=512), short
    )
    assert update(sft_on_task(max_new_tokens=16)) == update(sft_on_task(max_new_tokens=512))
    # measured on the built task: the chat frame, question and answer at 3 characters a token,
    # EOS; the update (float32 LoRA: nothing fixed in it) in proportion to the rows
    rows_short, rows_long = (supervised_row_tokens(sft_on_task(), t) for t in (short, long))
    assert (rows_short, rows_long) == (32 + math.ceil(32 / 3) + 1, 32 + math.ceil(302 / 3) + 1)
    assert update(sft_on_task(), long) * rows_short == update(sft_on_task(), short) * rows_long
    # a target template is part of each row
    boxed = sft_on_task(target="The answer is \\boxed{{{answer}}}.")
    assert supervised_row_tokens(boxed, short) > supervised_row_tokens(sft_on_task(), short) + 5
    # not measured (the API builds no task): a default question, not max_new_tokens
    assert supervised_row_tokens(sft_on_task()) == 32 + 48 + 8 + 1
    # rows read from a file or built as tool traces are not measured here: max_new_tokens
    assert supervised_row_tokens(sft_on_task(path="rows.jsonl"), short) == 0
    from_file = (sft_on_task(max_new_tokens=n, path="rows.jsonl") for n in (64, 128))
    assert update(next(from_file)) * 2 == update(next(from_file))
