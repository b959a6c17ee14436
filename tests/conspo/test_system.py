"""conspo.system: the sampler's readings of this process and machine (real psutil), how a window
of samples becomes one step's system/* metrics, and the trainer logging them on the steps a
sample fell in (or not at all when logging.system_metrics is off). NVML cannot run on this CPU
machine: its aggregation is checked against a stand-in module that answers like pynvml (a fake,
said so here); bench/gpu_proof.py reads the real one on a GPU."""

from __future__ import annotations

import math
import tempfile
import types
from typing import Any

import pytest

from conspo import metrics as M
from conspo import system
from conspo.config import RunConfig
from conspo.sink import MemorySink
from conspo.system import SystemSampler
from conspo.training.trainer import train

GIB = 2**30


def test_readings_of_this_process_are_plausible_and_the_window_resets():
    sampler = SystemSampler("cpu", interval_s=60)  # the thread stays asleep: samples by hand
    try:
        assert sampler.gpu_note == "a CPU run: no GPU to read"
        ballast = bytearray(300 * 2**20)  # resident: written below
        ballast[::4096] = b"x" * len(ballast[::4096])
        sampler.sample()
        sampler.sample()
        got = sampler.take()
        assert set(got) == {M.SYS_CPU_PERCENT, M.SYS_RSS_GIB, M.SYS_PEAK_RSS_GIB,
                            M.SYS_AVAILABLE_GIB}  # fmt: skip
        assert got[M.SYS_RSS_GIB] > 0.3 and got[M.SYS_PEAK_RSS_GIB] >= got[M.SYS_RSS_GIB]
        assert 0 < got[M.SYS_AVAILABLE_GIB] < 4096
        assert got[M.SYS_CPU_PERCENT] >= 0
        assert sampler.take() == {}  # nothing sampled since
        del ballast
    finally:
        sampler.close()


class FakeNvml(types.SimpleNamespace):
    """Answers like pynvml for two GPUs whose readings change per call (a stand-in: no NVIDIA
    driver here)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        super().__init__(calls=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:  # noqa: N802 — pynvml's names
        self.calls += 1
        return types.SimpleNamespace(used=(h + 1) * self.calls * GIB, total=80 * GIB)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:  # noqa: N802
        return types.SimpleNamespace(gpu=50 + 10 * h + self.calls)

    def nvmlDeviceGetPowerUsage(self, h: int) -> float:  # noqa: N802
        if h == 1:
            raise RuntimeError("NVMLError_NotSupported")
        return 300_000.0  # milliwatts

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> float:  # noqa: N802
        return 60 + self.calls

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass


def test_gpu_readings_become_per_gpu_keys():
    sampler = SystemSampler("cpu", interval_s=60)
    fake = FakeNvml()
    sampler._nvml = system._Nvml(fake, {0: 0, 1: 1})
    try:
        sampler.sample()
        sampler.sample()
        got = sampler.take()
    finally:
        sampler.close()
    # GPU 0: memory calls 1 and 3 (GPU 1 takes 2 and 4): the highest, 3 GiB; util mean of 51, 53
    assert got[M.sys_gpu_key(0, "mem_gib")] == 3.0
    assert got[M.sys_gpu_key(1, "mem_gib")] == 8.0
    assert got[M.sys_gpu_key(0, "util")] == 52.0 and got[M.sys_gpu_key(1, "util")] == 63.0
    assert got[M.sys_gpu_key(0, "mem_total_gib")] == 80.0
    assert got[M.sys_gpu_key(0, "power_w")] == 300.0
    assert math.isnan(got[M.sys_gpu_key(1, "power_w")])  # not offered: a gap, not a crash
    assert got[M.sys_gpu_key(1, "temp_c")] == 64.0  # the highest sample
    for key in got:
        assert M.metric(key) is not None or M.pattern(key) is not None, key  # catalogued


def test_a_cuda_run_without_nvml_says_why(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("no module named pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert system._open_nvml("cuda") == (None, "nvidia-ml-py is not installed on this worker")
    monkeypatch.undo()
    handle, why = system._open_nvml("cuda")  # the package is here; the driver is not (a CPU box)
    if handle is None:
        assert why.startswith("NVML could not be read")
    else:  # a machine with an NVIDIA driver reads it
        handle.close()


@pytest.mark.parametrize("on", [True, False])
def test_the_trainer_logs_system_metrics_on_the_steps_a_sample_fell_in(on, model_store):
    cfg = RunConfig.model_validate({
        "algorithm": "grpo", "steps": 8, "model": {"name": "tiny-arith", "device": "cpu"},
        "task": {"name": "arith", "eval_size": 4}, "eval": {"every": 0},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "logging": {"system_metrics": on, "system_interval_s": 0.5},
    })  # fmt: skip
    sink = MemorySink()
    slow = {"n": 0}

    class SlowSink(MemorySink):
        def log_step(self, record: Any) -> None:  # each step lasts at least one interval
            import time

            time.sleep(0.6)
            slow["n"] += 1
            sink.log_step(record)

    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, SlowSink(), workdir=workdir, model_store=model_store)
    with_readings = [r.step for r in sink.steps.values() if M.SYS_RSS_GIB in r.metrics]
    if on:
        assert len(with_readings) >= 6, with_readings
        assert all(sink.steps[s].metrics[M.SYS_RSS_GIB] > 0.05 for s in with_readings)
    else:
        assert with_readings == []
    assert not any(k.startswith("system/gpu") for r in sink.steps.values() for k in r.metrics)


def test_a_run_shorter_than_one_interval_still_logs_its_readings_on_its_last_step(model_store):
    """On an idle machine a short run finished before the sampler's first reading and logged no
    system/* at all (no peak memory to hold an estimate to): the last step reads once more."""
    cfg = RunConfig.model_validate({
        "algorithm": "grpo", "steps": 2, "model": {"name": "tiny-arith", "device": "cpu"},
        "task": {"name": "arith", "eval_size": 4}, "eval": {"every": 0},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "logging": {"system_interval_s": 60},
    })  # fmt: skip
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as workdir:
        train(cfg, sink, workdir=workdir, model_store=model_store)
    assert M.SYS_PEAK_RSS_GIB not in sink.steps[1].metrics  # no reading fell in it
    assert sink.steps[2].metrics[M.SYS_PEAK_RSS_GIB] >= sink.steps[2].metrics[M.SYS_RSS_GIB] > 0.05
