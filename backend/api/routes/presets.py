"""Presets: what the form offers, read from conspo's registries, model catalogue and config."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from backend.schemas import Presets
from conspo.config import RunConfig
from conspo.registry import OBJECTIVES, TASKS, Registry

router = APIRouter(tags=["presets"])


@lru_cache(maxsize=1)
def presets() -> dict[str, Any]:
    return {
        "algorithms": _registered(OBJECTIVES),
        "tasks": _registered(TASKS),
        "models": _models(),
        "config_schema": RunConfig.model_json_schema(),
        "defaults": RunConfig.model_validate({}).model_dump(mode="json"),
    }


def _registered(registry: Registry[Any]) -> list[dict[str, Any]]:
    """Each entry's name, description, parameter schema and defaults (what the form renders)."""
    out = []
    for name in registry.names():
        entry = registry.get(name)
        out.append(
            {
                "name": name,
                "description": entry.description,
                "params_schema": entry.params.model_json_schema(),
                "defaults": _defaults(entry.params),
            }
        )
    return out


def _defaults(params: type[BaseModel]) -> dict[str, Any]:
    """The parameters that have a default (a required one, such as jsonl's path, has none)."""
    return to_jsonable_python(
        {
            name: field.get_default(call_default_factory=True)
            for name, field in params.model_fields.items()
            if not field.is_required()
        }
    )


def _models() -> list[dict[str, str]]:
    try:
        from conspo.models import WARM_STARTS
    except ImportError:  # pragma: no cover - the model module is optional for the API
        WARM_STARTS = {}  # noqa: N806
    models = [
        {"name": "tiny", "description": "Tiny Qwen-style model, random init (builds in a second)."}
    ]
    for name, (tasks, steps) in WARM_STARTS.items():
        what = ", ".join(sorted({t.name for t in tasks}))
        models.append(
            {"name": name, "description": f"tiny after a {steps}-step SFT warm start on {what}."}
        )
    return models


@router.get("/presets", response_model=Presets)
def get_presets() -> dict[str, Any]:
    return presets()
