"""What this worker can run: its GPUs, its CPU slots, Ray, the optional packages some
configs need, and whether it can run model-written code (``sandbox``: ``bwrap`` or ``none``).

Probed once at start, logged, and stored in the worker's ``workers`` row
(``backend.liveness``): ``/api/health`` lists it, the API accepts a config that needs
vLLM or flash-attn when a live worker advertises it (``backend.runs.inputs``), even though the
API process itself has neither, and says why a queued run waits (``backend.runs.scheduling``). The
queues the worker consumes follow from the same probe (``capacity``, ``queues``).
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

from backend.config import Settings
from backend.runs.scheduling import Capacity, queues_served
from conspo import plugins
from conspo.generation.engines import ENGINES
from conspo.generation.vllm_interpreter import vllm_available
from conspo.sandbox import sandbox_available

# Engines that need more than the training stack, and how to tell whether this machine has it:
# vllm runs in an interpreter of its own (`make vllm`, or CONSPO_VLLM_PYTHON).
ENGINE_CHECKS = {"vllm": vllm_available}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def probe(settings: Settings | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(gpus [{index, name, memory_bytes}], {engines, flash_attn, torch, cuda, sandbox,
    cpu_processes, ray, plugins}); ``ray`` is the cluster address when Ray is installed and
    ``ray_address`` is set."""
    from backend.config import get_settings

    settings = settings or get_settings()
    gpus, found = _probe_machine()
    capabilities = {
        **found,
        "cpu_processes": settings.worker_cpu_processes,
        "ray": settings.ray_address if settings.ray_address and installed("ray") else None,
        # The users' plugins it loaded (and any that failed, by name): the API refuses a run
        # whose plugin no live worker has (backend.runs.inputs.missing_plugins).
        "plugins": plugins.report(),
    }
    return list(gpus), capabilities


@lru_cache(maxsize=1)
def _probe_machine() -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """The devices and packages, probed once per process (the CLI chooses the queues from it
    before Celery starts, and the worker stores it once Celery is ready)."""
    import torch

    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"index": index, "name": props.name, "memory_bytes": props.total_memory})
    engines = [name for name in ENGINES if name not in ENGINE_CHECKS or ENGINE_CHECKS[name]()]
    capabilities = {
        "engines": engines,
        # flash-attn's kernels run on CUDA only: without a GPU the package does not help.
        "flash_attn": bool(gpus) and installed("flash_attn"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if gpus else None,
        # A snippet really run through bwrap once: a worker without it refuses code execution.
        "sandbox": "bwrap" if sandbox_available() else "none",
    }
    return tuple(gpus), capabilities


def capacity(settings: Settings | None = None) -> Capacity:
    """What runs this worker can hold (``backend.runs.scheduling``)."""
    return Capacity.advertised(*probe(settings))


def queues(settings: Settings) -> list[str]:
    """The Celery queues this worker consumes: one per capacity class it can hold."""
    return queues_served(capacity(settings), settings.queue)
