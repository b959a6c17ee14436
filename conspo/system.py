"""System metrics of a training run: the process's CPU and memory, the machine's free memory, and
each GPU's utilisation, memory, power and temperature, sampled on a thread of their own.

``SystemSampler`` wakes every ``interval_s`` seconds and reads psutil (the process and the
machine) and, on CUDA, NVML through nvidia-ml-py (the library W&B and ClearML read GPUs with);
the training thread only calls ``take`` once per step, which hands over what was sampled since
the step before as ordinary metrics under ``system/`` (conspo.metrics catalogues them). A step
shorter than the interval gets none: the series stay a few seconds apart, whatever the step
rate, and a fast step pays nothing. bench/system_metrics.py measures what sampling costs a step.

Per step: the process's CPU (mean over the samples, in % of one core: 200 = two busy cores),
its resident memory now and at its peak (the kernel's high-water mark, VmHWM, reset when the
sampler starts so an earlier run of the same worker process does not count), the machine's
available memory (the lowest sample); per GPU ``i`` the mean utilisation, the highest memory used
and its total, the mean power and the highest temperature.

Where NVML cannot be read (no driver, no nvidia-ml-py, a CPU run) the GPU keys are absent and
``gpu_note`` says why; the run page folds its GPU panels with that line.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conspo import metrics as M

GIB = 2**30


@dataclass
class _Window:
    """What the samples since the last ``take`` add up to."""

    samples: int = 0
    cpu_sum: float = 0.0
    rss: float = 0.0
    peak_rss: float = 0.0
    available_min: float = float("inf")
    gpus: dict[int, dict[str, float]] = field(default_factory=dict)


class SystemSampler:
    """Samples every ``interval_s`` on a daemon thread until ``close``; ``take`` per step."""

    def __init__(self, device_type: str, interval_s: float = 2.0) -> None:
        import psutil

        self.interval_s = interval_s
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts the clock
        _reset_peak_rss()
        self._nvml, self.gpu_note = _open_nvml(device_type)
        self._lock = threading.Lock()
        self._window = _Window()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="system-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 — a failed read must never stop a run
                self.gpu_note = self.gpu_note or f"sampling stopped: {exc}"
                return

    def sample(self) -> None:
        import psutil

        cpu = self._process.cpu_percent(None)
        rss = float(self._process.memory_info().rss)
        peak = max(float(_peak_rss() or 0), rss)
        available = float(psutil.virtual_memory().available)
        gpus = self._nvml.read() if self._nvml is not None else {}
        with self._lock:
            w = self._window
            w.samples += 1
            w.cpu_sum += cpu
            w.rss = rss
            w.peak_rss = max(w.peak_rss, peak)
            w.available_min = min(w.available_min, available)
            for index, reading in gpus.items():
                into = w.gpus.setdefault(index, {"n": 0, "util": 0.0, "power": 0.0,
                                                 "mem": 0.0, "temp": 0.0})  # fmt: skip
                into["n"] += 1
                into["util"] += reading["util"]
                into["power"] += reading["power"]
                into["mem"] = max(into["mem"], reading["mem"])
                into["temp"] = max(into["temp"], reading["temp"])
                into["mem_total"] = reading["mem_total"]

    def take(self) -> dict[str, float]:
        """The ``system/`` metrics of the samples since the last call ({} when there were none)."""
        with self._lock:
            w, self._window = self._window, _Window()
        if not w.samples:
            return {}
        out = {
            M.SYS_CPU_PERCENT: w.cpu_sum / w.samples,
            M.SYS_RSS_GIB: w.rss / GIB,
            M.SYS_PEAK_RSS_GIB: w.peak_rss / GIB,
            M.SYS_AVAILABLE_GIB: w.available_min / GIB,
        }
        for index, g in sorted(w.gpus.items()):
            n = g["n"]
            out |= {
                M.sys_gpu_key(index, "util"): g["util"] / n,
                M.sys_gpu_key(index, "mem_gib"): g["mem"] / GIB,
                M.sys_gpu_key(index, "mem_total_gib"): g["mem_total"] / GIB,
                M.sys_gpu_key(index, "power_w"): g["power"] / n,
                M.sys_gpu_key(index, "temp_c"): g["temp"],
            }
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._nvml is not None:
            self._nvml.close()


class _Nvml:
    """The run's GPUs through NVML (the ones CUDA_VISIBLE_DEVICES leaves it, numbered as CUDA
    numbers them)."""

    def __init__(self, pynvml: Any, handles: dict[int, Any]) -> None:
        self.pynvml, self.handles = pynvml, handles

    def read(self) -> dict[int, dict[str, float]]:
        nv = self.pynvml
        out = {}
        for index, handle in self.handles.items():
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            out[index] = {
                "util": float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
                "mem": float(memory.used),
                "mem_total": float(memory.total),
                "power": _or_nan(nv.nvmlDeviceGetPowerUsage, handle) / 1000.0,
                "temp": _or_nan(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            }
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutting down a library that is going anyway
            self.pynvml.nvmlShutdown()


def _or_nan(read: Callable[..., float], *args: Any) -> float:
    """A reading some GPUs do not offer (power on some boards): NaN, stored as a gap."""
    try:
        return float(read(*args))
    except Exception:  # noqa: BLE001 — NVMLError_NotSupported and kin
        return float("nan")


def _open_nvml(device_type: str) -> tuple[_Nvml | None, str]:
    """NVML's handles of the run's GPUs, or None and why not."""
    if device_type != "cuda":
        return None, "a CPU run: no GPU to read"
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed on this worker"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        physical = list(range(count))
        if visible:
            wanted = [v.strip() for v in visible.split(",") if v.strip()]
            if all(v.isdigit() for v in wanted):
                physical = [int(v) for v in wanted if int(v) < count]
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(p) for i, p in enumerate(physical)}
    except Exception as exc:  # noqa: BLE001 — NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML could not be read ({exc})"
    return _Nvml(pynvml, handles), ""


STATUS = Path("/proc/self/status")


def _peak_rss() -> int | None:
    """The process's resident high-water mark in bytes (VmHWM), where Linux says it."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux: writing 5 to clear_refs), so a long-lived
    worker's earlier runs do not count in this run's peak."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def host_memory_bytes() -> int:
    """This machine's memory: physical RAM, or the container's cgroup limit when lower."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            ram = min(ram, int(text))
    return ram
