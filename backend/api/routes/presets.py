"""Presets: what the form offers, read from conspo's registry and config model."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import APIRouter

from backend.schemas import Presets
from conspo.config import RunConfig
from conspo.registry import get_objective, get_task, objective_names, task_names

router = APIRouter(tags=["presets"])


@lru_cache(maxsize=1)
def presets() -> dict[str, Any]:
    algorithms = []
    for name in objective_names():
        reg = get_objective(name)
        algorithms.append(
            {
                "name": name,
                "description": reg.description,
                "params_schema": reg.params.model_json_schema(),
                "defaults": reg.params().model_dump(mode="json"),
            }
        )
    tasks = [{"name": t, "description": get_task(t).description} for t in task_names()]
    return {
        "algorithms": algorithms,
        "tasks": tasks,
        "models": _models(),
        "config_schema": RunConfig.model_json_schema(),
        "defaults": RunConfig.model_validate({}).model_dump(mode="json"),
    }


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
