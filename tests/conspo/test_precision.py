"""Precision (model.dtype, model.mixed_precision) and what the trainer reports it used; the
error a step that runs out of device memory ends the run with."""

from __future__ import annotations

import math

import pytest
import torch

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.models.resources import OutOfMemory
from conspo.sink import MemorySink
from conspo.training import trainer
from conspo.training.loop import setup
from conspo.training.trainer import train


def config(**model) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "conspo",
        "steps": 2,
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 4},
        "model": {"name": "tiny-arith", "device": "cpu", **model},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "optim": {"lr": 1e-3, "micro_batch_tokens": 60},
        "eval": {"every": 0, "pass_k": 1},
        "checkpoint": {"every": 0},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "mixed", "weights", "scaled"),
    [
        ("bfloat16", False, torch.bfloat16, False),
        ("bfloat16", True, torch.float32, False),
        ("float16", False, torch.float32, True),  # float16 is always mixed, with loss scaling
    ],
)
def test_half_precision_runs_train_with_finite_losses(dtype, mixed, weights, scaled, model_store,
                                                      arith_base, tmp_path):  # fmt: skip
    cfg = config(dtype=dtype, mixed_precision=mixed, gradient_checkpointing=True)
    state = setup(cfg, model_store)
    assert {p.dtype for p in state.model.parameters()} == {weights}
    assert (state.precision.scaler is not None) == scaled
    sink = MemorySink()
    result = train(cfg, sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded"
    assert all(math.isfinite(sink.steps[s].metrics[M.LOSS]) for s in (1, 2))
    kind, info = sink.events[0]
    assert kind == "started"
    assert (info["dtype"], info["mixed_precision"]) == (dtype, weights != getattr(torch, dtype))
    assert info["device"] == "cpu" and info["attn_implementation"] == "sdpa"
    assert info["trainable_params"] == info["total_params"] > 0 and info["lora_rank"] == 0


def test_flash_attention_is_refused_without_a_gpu(model_store, arith_base):
    with pytest.raises(ValueError, match="model.attn_implementation: flash_attention_2"):
        setup(config(attn_implementation="flash_attention_2"), model_store)


def test_running_out_of_device_memory_says_what_to_change(model_store, arith_base, tmp_path,
                                                          monkeypatch):  # fmt: skip
    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer, "update", exhausted)  # where a too-large step would fail
    with pytest.raises(OutOfMemory) as info:
        train(config(), MemorySink(), workdir=tmp_path, model_store=model_store)
    message = str(info.value)
    assert "needs about" in message and "the device has" in message
    for field in ("optim.micro_batch_tokens (now 60", "model.gradient_checkpointing (now false",
                  "model.lora.rank (now 0", "sampling.prompts_per_step"):  # fmt: skip
        assert field in message
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def test_cpu_bfloat16_reads_the_cpu_flags(monkeypatch, tmp_path):
    """Native bfloat16 is named by its flag; a CPU with neither flag is said to emulate it."""
    from pathlib import Path

    from conspo.models import precision

    cpuinfo = tmp_path / "cpuinfo"
    real_read = Path.read_text

    def read(self, *args, **kwargs):
        if str(self) == "/proc/cpuinfo":
            return real_read(cpuinfo)
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert precision.cpu_bfloat16() == "avx512_bf16"
    assert "native" in precision.bfloat16_note()
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert precision.cpu_bfloat16() == ""
    assert "emulated" in precision.bfloat16_note() and "float32" in precision.bfloat16_note()
    assert "no native bfloat16" in str(precision.emulated_bfloat16("cpu", torch.bfloat16))
    assert precision.emulated_bfloat16("cpu", "bfloat16") is not None
    assert precision.emulated_bfloat16("cpu", torch.float32) is None
    assert precision.emulated_bfloat16("cuda", torch.bfloat16) is None
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16\n")
    assert precision.emulated_bfloat16("cpu", torch.bfloat16) is None
