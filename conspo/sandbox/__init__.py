"""The one place model-written code runs: a bubblewrap sandbox per snippet (``run``), many at
once through a bounded pool (``run_many``), and a probe of whether this machine can
(``sandbox_available``). Standard library only."""

from conspo.sandbox.base import Limits, SandboxResult, SandboxUnavailable, Snippet
from conspo.sandbox.runner import (
    UNSAFE_LOCAL_ENV,
    Probe,
    require_sandbox,
    run,
    run_many,
    sandbox_available,
    unsafe_local_opt_in,
)

__all__ = [
    "UNSAFE_LOCAL_ENV",
    "require_sandbox",
    "unsafe_local_opt_in",
    "Limits",
    "Probe",
    "SandboxResult",
    "SandboxUnavailable",
    "Snippet",
    "run",
    "run_many",
    "sandbox_available",
]
