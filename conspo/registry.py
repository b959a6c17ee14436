"""Objective registry: each algorithm is one function plus one registration.

    @register_objective("conspo", params=ConSPOParams, description="...")
    def conspo_objective(batch: PolicyBatch, params: ConSPOParams) -> ObjectiveOutput: ...

The registry holds the function, its pydantic parameter model (defaults, help text, validation)
and a one-line description. The config model, the trainer, the REST presets endpoint and the web
form all read this registry, so nothing else has to change when an algorithm is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class RegisteredObjective:
    name: str
    fn: Callable[..., Any]
    params: type[BaseModel]
    description: str


_OBJECTIVES: dict[str, RegisteredObjective] = {}


def register_objective(
    name: str, *, params: type[BaseModel], description: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` under ``name``; one name registered twice with different code is an error."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        existing = _OBJECTIVES.get(name)
        if existing is not None and (
            existing.fn.__code__ is not fn.__code__ or existing.params is not params
        ):
            raise ValueError(
                f"objective {name!r} is already registered to {existing.fn.__qualname__}"
            )
        _OBJECTIVES[name] = RegisteredObjective(name, fn, params, description)
        return fn

    return decorator


def get_objective(name: str) -> RegisteredObjective:
    _ensure_builtin_objectives_loaded()
    try:
        return _OBJECTIVES[name]
    except KeyError:
        valid = ", ".join(sorted(_OBJECTIVES))
        raise KeyError(f"unknown algorithm {name!r}; valid algorithms: {valid}") from None


def objective_names() -> list[str]:
    _ensure_builtin_objectives_loaded()
    return sorted(_OBJECTIVES)


def _ensure_builtin_objectives_loaded() -> None:
    # Importing the module runs its @register_objective decorators.
    from conspo import objectives  # noqa: F401
