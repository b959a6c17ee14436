"""The one place model-written code runs: a bubblewrap sandbox per snippet (``run``), many at
once through a bounded pool (``run_many``), and a probe of whether this machine can
(``sandbox_available``). Standard library only."""

from conspo.sandbox.base import Limits, SandboxResult, SandboxUnavailable, Snippet
from conspo.sandbox.runner import Probe, run, run_many, sandbox_available

__all__ = [
    "Limits",
    "Probe",
    "SandboxResult",
    "SandboxUnavailable",
    "Snippet",
    "run",
    "run_many",
    "sandbox_available",
]
