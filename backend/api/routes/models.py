"""The model registry: finished runs' checkpoints as models, with lineage and eval results;
each exportable as a plain Hugging Face directory (``backend.model_registry``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field

from backend import model_registry
from backend.api.body import JSONBodyRoute
from backend.api.deps import OwnedRunDep, SessionDep, SettingsDep

router = APIRouter(prefix="/models", tags=["models"], route_class=JSONBodyRoute)

Step = Literal["best", "last"] | Annotated[int, Field(ge=0, le=1_000_000)]


class Checkpoint(BaseModel):
    path: str
    lora: bool = Field(description="Adapters only: exporting merges them into the base.")
    step: int | None = Field(description="Its step; None for the last or best directory.")


class StartedFrom(BaseModel):
    """A run the model started from."""

    run: int
    step: str | int = Field(description="Its checkpoint: last, best or a kept step.")
    exists: bool = Field(description="False: that run has been deleted since.")


class BaseModelLink(BaseModel):
    """The base model at the end of the chain."""

    base: str


class ModelOut(BaseModel):
    run_id: int
    name: str
    status: str
    kind: str
    algorithm: str | None
    label: str = Field(description='What it trained, for people: "rl · grpo", "sft".')
    task: str
    steps: int
    checkpoints: dict[str, Checkpoint] = Field(description="last and/or best.")
    lineage: list[StartedFrom | BaseModelLink] = Field(description="Nearest starting point first.")
    eval: dict[str, float | None] = Field(description="Its last held-out evaluation.")
    pipeline_id: int | None
    finished_at: float | None


class ModelList(BaseModel):
    models: list[ModelOut]


class Exported(BaseModel):
    run_id: int
    step: Step
    path: str = Field(description="The directory; it loads with from_pretrained.")


@router.get("", response_model=ModelList)
def list_models(session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """Every succeeded run with a checkpoint on disk: use one as ``model: {from_run: run_id,
    step: last | best}``."""
    return {"models": model_registry.list_models(session, settings)}


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: Step = "last"


@router.post("/{run_id}/export", response_model=Exported)
def export(run: OwnedRunDep, body: ExportRequest, settings: SettingsDep) -> dict[str, Any]:
    """Write the run's checkpoint as a Hugging Face directory (LoRA merged into its base) under
    the data dir; returns its path (it loads with ``from_pretrained``). Its owner or an admin
    only: it writes to the server's disk."""
    try:
        out = model_registry.export_model(settings, run.id, body.step)
    except FileNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return {"run_id": run.id, "step": body.step, "path": str(out)}
