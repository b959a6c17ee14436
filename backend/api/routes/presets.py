"""Presets: what the form offers, read from conspo's registries, model catalogue and config."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as PathParam
from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from backend.api.contract import refusals
from backend.api.deps import SettingsDep
from backend.schemas import Presets
from conspo.config import PROMPT_TEMPLATES, RunConfig
from conspo.demo import DEMO_CONFIG
from conspo.models.catalog import BUILTIN_MODELS
from conspo.registry import (
    ENVIRONMENTS,
    JOB_KINDS,
    OBJECTIVES,
    REWARDS,
    TASKS,
    TOOLS,
    Registry,
)
from conspo.tools.base import OBSERVATION_TEMPLATE

router = APIRouter(tags=["presets"])


@lru_cache(maxsize=1)
def presets() -> dict[str, Any]:
    return {
        # what a run trains (config.kind, its kind_params) and which sections it reads
        "kinds": [
            {**e, "sections": list(JOB_KINDS.get(e["name"]).sections)}
            for e in _registered(JOB_KINDS)
        ],
        "algorithms": _registered(OBJECTIVES),
        "tasks": _registered(TASKS),
        # what task "environment" may play (its params.environment, environment_params)
        "environments": _registered(ENVIRONMENTS),
        "rewards": _rewards(),
        "models": [
            {
                "name": m.name,
                "description": m.description,
                "recommended": m.recommended,
                "recommended_why": m.recommended_why,
            }
            for m in BUILTIN_MODELS.values()
        ],
        "config_schema": RunConfig.model_json_schema(),
        # The form starts from the demo's settings, so an untouched form's run compares with them.
        "defaults": RunConfig.model_validate(DEMO_CONFIG).model_dump(mode="json"),
        "prompt_templates": PROMPT_TEMPLATES,
        "tools": _tools(),
        "tool_observation": _observation_format(),
    }


def _observation_format() -> dict[str, str]:
    """The text around a tool's output in a rollout (``conspo.tools.base``)."""
    before, after = OBSERVATION_TEMPLATE.split("{output}")
    return {"before": before, "after": after}


def _tools() -> list[dict[str, Any]]:
    """Each tool as the form offers it: what it does, the tag the model calls it with, and
    whether it runs code in the sandbox (a run names tools only: their limits are its
    ``tools`` section's)."""
    return [
        {"name": t.name, "description": t.description, "tag": t.tag, "sandboxed": t.sandboxed}
        for t in map(TOOLS.get, TOOLS.names())
    ]


def _registered(registry: Registry[Any]) -> list[dict[str, Any]]:
    """Each entry's name, description, parameter schema and defaults (what the form renders),
    and the plugin that registered it (None for a built-in)."""
    out = []
    for name in registry.names():
        entry = registry.get(name)
        out.append(
            {
                "name": name,
                "description": entry.description,
                "params_schema": entry.params.model_json_schema(),
                "defaults": _defaults(entry.params),
                "plugin": registry.origin(name),
            }
        )
    return out


def _rewards() -> list[dict[str, Any]]:
    """Each reward as the form offers it: its entry, its weight when none is given, and the tasks
    a run may have it with (the config's own check: RegisteredReward.applies_to)."""
    out = []
    for preset in _registered(REWARDS):
        reward = REWARDS.get(preset["name"])
        tasks = [name for name in TASKS.names() if reward.applies_to(TASKS.get(name))]
        out.append({**preset, "default_weight": reward.default_weight, "tasks": tasks})
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


@router.get("/presets", response_model=Presets)
def get_presets(settings: SettingsDep) -> dict[str, Any]:
    return {**presets(), "tool_timeout_max_s": settings.sandbox_max_timeout_s}


class GeneratorParameter(BaseModel):
    name: str
    type: str = Field(description='integer, number, boolean, string, or "other" (JSON only).')
    default: bool | int | float | str | None = Field(
        description="The generator's own default (None where a form cannot show it)."
    )
    min: float | None = Field(description="The lowest value a config may set (numbers).")
    max: float | None = Field(description="The highest value a config may set (numbers).")


class GeneratorParameters(BaseModel):
    name: str
    parameters: list[GeneratorParameter]


@router.get(
    "/presets/generators/{name}",
    response_model=GeneratorParameters,
    responses=refusals({404: "No reasoning-gym generator of that name."}),
)
def get_generator_parameters(
    name: Annotated[str, PathParam(max_length=100, pattern=r"^[A-Za-z0-9_]+$")],
) -> dict[str, Any]:
    """A reasoning-gym generator's config parameters (the ``reasoning_gym`` task's
    ``params.config``): the form draws one field for each, with its default and caps."""
    from conspo.tasks.reasoning_gym import generator_parameters

    try:
        return {"name": name, "parameters": generator_parameters(name)}
    except KeyError:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no reasoning-gym generator named {name!r}"
        ) from None
