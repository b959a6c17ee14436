"""The model registry: finished runs' checkpoints as models, with lineage and eval results;
each exportable as a plain Hugging Face directory (``backend.chaining``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field

from backend import chaining
from backend.api.body import JSONBodyRoute
from backend.api.deps import OwnedRunDep, SessionDep, SettingsDep

router = APIRouter(prefix="/models", tags=["models"], route_class=JSONBodyRoute)


@router.get("")
def list_models(session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """Every succeeded run with a checkpoint on disk: use one as ``model: {from_run: run_id,
    step: last | best}``."""
    return {"models": chaining.list_models(session, settings)}


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: Literal["best", "last"] | Annotated[int, Field(ge=0, le=1_000_000)] = "last"


@router.post("/{run_id}/export")
def export(run: OwnedRunDep, body: ExportRequest, settings: SettingsDep) -> dict[str, Any]:
    """Write the run's checkpoint as a Hugging Face directory (LoRA merged into its base) under
    the data dir; returns its path (it loads with ``from_pretrained``). Its owner or an admin
    only: it writes to the server's disk."""
    try:
        out = chaining.export_model(settings, run.id, body.step)
    except FileNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return {"run_id": run.id, "step": body.step, "path": str(out)}
