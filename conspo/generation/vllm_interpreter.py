"""Where vLLM is: the interpreter ``sampling.engine: vllm`` runs its engine process with.

Imports neither torch nor vllm: the API process asks ``vllm_available`` to accept or refuse a
run's ``sampling.engine``, and must stay free of torch (tests/api/test_api_no_torch.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

# Where `make vllm` puts vLLM's virtualenv, relative to the repository.
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"


def vllm_python() -> str | None:
    """The interpreter that has vLLM: ``CONSPO_VLLM_PYTHON``, else this one if it has vLLM, else
    ``.venv-vllm``'s. None where there is none, or where ``CONSPO_VLLM_PYTHON`` is ``none``."""
    explicit = os.environ.get("CONSPO_VLLM_PYTHON")
    if explicit == "none":
        return None
    if explicit:
        return explicit if _has_vllm(explicit) else None
    for candidate in (sys.executable, str(DEFAULT_VENV / "bin" / "python")):
        if Path(candidate).exists() and _has_vllm(candidate):
            return candidate
    return None


@lru_cache(maxsize=8)
def _has_vllm(python: str) -> bool:
    """Whether ``python`` can import vllm (found, not imported: a second, not a minute)."""
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return (
            subprocess.run([python, "-c", check], timeout=60, capture_output=True).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def vllm_available() -> bool:
    return vllm_python() is not None
