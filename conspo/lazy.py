"""``lazy_import("torch")``: a module that is imported on first use, not when its user is.

Why: each module of ``conspo.objectives`` holds its objective's parameter model beside its tensor
code, so an algorithm stays one function and one registration in one file. The API process validates
run configs and serves the form from those parameter models, and it must not load torch (seconds of
start-up and hundreds of MB per process, on machines that never train). The objectives' tensor
code only runs in the worker, where the first attribute access imports the real module.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class _LazyModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self.__name__), attr)
        setattr(self, attr, value)  # later accesses are plain attribute lookups
        return value


def lazy_import(name: str) -> Any:
    """A stand-in for module ``name`` that imports it at the first attribute access."""
    return _LazyModule(name)
