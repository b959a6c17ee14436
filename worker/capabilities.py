"""What this worker can run: its GPUs and the optional packages some configs need.

Probed once at start, logged, and stored in the worker's ``workers`` row
(``backend.liveness``): ``/api/health`` lists it, and the API accepts a config that needs
vLLM or flash-attn when a live worker advertises it (``backend.run_inputs``), even though the
API process itself has neither.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from conspo.engines import ENGINES

# Engines that need a package beyond the training stack, and the module that provides it.
ENGINE_PACKAGES = {"vllm": "vllm"}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def probe() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(gpus [{index, name, memory_bytes}], {engines, flash_attn, torch, cuda})."""
    import torch

    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"index": index, "name": props.name, "memory_bytes": props.total_memory})
    engines = [
        name for name in ENGINES if name not in ENGINE_PACKAGES or installed(ENGINE_PACKAGES[name])
    ]
    capabilities = {
        "engines": engines,
        # flash-attn's kernels run on CUDA only: without a GPU the package does not help.
        "flash_attn": bool(gpus) and installed("flash_attn"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if gpus else None,
    }
    return gpus, capabilities
