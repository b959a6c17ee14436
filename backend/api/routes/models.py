"""The model registry: finished runs' checkpoints as models, with lineage and eval results;
each exportable as a plain Hugging Face directory (``backend.model_registry``) and downloadable
as a tar of it (``GET /api/runs/{run_id}/export``, resumable with a Range, with its SHA-256). A
model is its owner's until they share it (``backend.runs.sharing``): each entry says what the
caller may do."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from backend import model_registry
from backend.api.body import JSONBodyRoute
from backend.api.contract import refusals
from backend.api.deps import (
    Credentials,
    CurrentUser,
    OptionalUser,
    OwnedRunDep,
    RunId,
    SessionDep,
    SettingsDep,
    found,
    get_current_user,
    owned,
)
from backend.config import Settings
from backend.models import Run, User
from backend.runs import sharing
from backend.security import TICKET_TTL_S, ticket_for, user_for_ticket

router = APIRouter(prefix="/models", tags=["models"], route_class=JSONBodyRoute)
# The download is a read of the run it comes from, beside its other reads (/api/runs/{id}/…).
runs_router = APIRouter(prefix="/runs", tags=["models"], route_class=JSONBodyRoute)

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
    pass_k: int = Field(description="The k of its eval/pass@k (the run's eval.pass_k).")
    pipeline_id: int | None
    finished_at: float | None
    owner: str | None = Field(description="Whose run it is (None: the user was deleted).")
    model_shared: bool = Field(
        description="Its owner lets other users start from it and export what they train from it"
        ' (PATCH /api/runs/{run_id} {"model_shared": true}).'
    )
    may_share: bool = Field(description="The caller may set model_shared: its owner or an admin.")
    may_start_from: bool = Field(
        description="The caller may name it as model.from_run: theirs or shared, and so is every"
        " run it was trained from (or the caller is an admin). False without a token."
    )
    may_export: bool = Field(
        description="The caller may export it: theirs (or an admin), and every run it was trained"
        " from is theirs or shared. False without a token."
    )


class ModelList(BaseModel):
    models: list[ModelOut]


class Exported(BaseModel):
    run_id: int
    step: Step
    path: str = Field(description="The directory; it loads with from_pretrained.")
    sha256: str = Field(description="The SHA-256 (hex) of its download, the tar of the directory.")
    size: int = Field(description="The bytes of its download.")
    download_url: str = Field(
        description="GET /api/runs/{run_id}/export of this step with a ticket signed by the"
        f" caller's token, for {TICKET_TTL_S} s: a link a browser follows without a token (a"
        " plain link cannot send an Authorization header)."
    )


@router.get("", response_model=ModelList)
def list_models(session: SessionDep, settings: SettingsDep, caller: OptionalUser) -> dict[str, Any]:
    """Every succeeded run with a checkpoint on disk: use one as ``model: {from_run: run_id,
    step: last | best}``. With a token, each says what its caller may do with it."""
    return {"models": model_registry.list_models(session, settings, caller)}


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: Step = "last"


EXPORT_REFUSALS = refusals(
    {
        403: "The run is another user's, or was trained from another user's run that is not"
        " shared (an admin may).",
        404: "No run has this id, or it has no such checkpoint on disk.",
    }
)


@router.post("/{run_id}/export", response_model=Exported, responses=EXPORT_REFUSALS)
def export(
    run: OwnedRunDep,
    body: ExportRequest,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    credentials: Credentials,
) -> dict[str, Any]:
    """Write the run's checkpoint as a Hugging Face directory (LoRA merged into its base) under
    the data dir; returns its path (it loads with ``from_pretrained``) and a short-lived URL that
    downloads it as a tar. Its owner or an admin only: it writes to the server's disk. A model
    trained from another user's run that is not shared is that user's too: 403 naming the run,
    unless the caller is an admin."""
    out = _exported(run, body.step, user, session, settings)
    archive, sha256 = model_registry.download(out)  # hashed here, so the download need not
    assert credentials is not None  # CurrentUser checked it
    ticket = ticket_for(session, credentials.credentials, _download_purpose(run.id, body.step))
    url = f"/api/runs/{run.id}/export?step={body.step}&ticket={ticket}"
    return {
        "run_id": run.id,
        "step": body.step,
        "path": str(out),
        "download_url": url,
        "sha256": sha256,
        "size": archive.size,
    }


def _download_purpose(run_id: int, step: Step) -> str:
    return f"export {run_id} {step}"


TAR_HEADERS = {
    "Accept-Ranges": {"description": "bytes: a Range of one span is answered with a 206."},
    "ETag": {"description": 'The tar\'s SHA-256 in hex, quoted: "<sha256>". Strong.'},
    "Repr-Digest": {
        "description": "RFC 9530: sha-256=:<base64>: of the whole tar (a 206's too); the"
        " export's sha256 in base64."
    },
}


@runs_router.get(
    "/{run_id}/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-tar": {}},
            "description": "A tar of one directory, run-<id>-<step>/, that loads with"
            " AutoModelForCausalLM.from_pretrained once extracted.",
            "headers": TAR_HEADERS,
        },
        206: {
            "content": {"application/x-tar": {}},
            "description": "The bytes of the tar that the Range asked for (Content-Range says"
            " which), the same bytes as the 200's at those offsets.",
            "headers": {
                **TAR_HEADERS,
                "Content-Range": {"description": "bytes <first>-<last>/<size>"},
            },
        },
        **EXPORT_REFUSALS,
        **refusals(
            {
                401: "Neither a token nor a ticket, or a ticket that is invalid, expired or"
                " for another run or step: export the model again for a new download_url.",
                416: "The Range starts past the end of the tar (or asks for its last 0 bytes);"
                " Content-Range: bytes */<size> says its size.",
            }
        ),
    },
)
def download_export(
    run_id: RunId,
    session: SessionDep,
    settings: SettingsDep,
    credentials: Credentials,
    step: Annotated[Step, Query(description="Its checkpoint: last, best or a kept step.")] = "last",
    ticket: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Instead of a token: the ticket of the download_url that POST"
            " /api/models/{run_id}/export answered (this run and step, for a few minutes).",
        ),
    ] = None,
    range_: Annotated[
        str | None,
        Header(
            alias="Range",
            description="bytes=<first>-<last>, bytes=<first>- or bytes=-<suffix length>: only"
            " those bytes (206). Several ranges, another unit or a malformed value: the whole.",
        ),
    ] = None,
    if_range: Annotated[
        str | None,
        Header(
            alias="If-Range",
            description="The ETag of the tar the caller has a part of: the Range is honoured"
            " only while the tar is still that one, else the whole tar is sent (200).",
        ),
    ] = None,
) -> StreamingResponse:
    """The exported model as a tar, streamed from the disk (the export written first if it is
    not yet: a LoRA merge may take longer than a read may wait, so POST
    /api/models/{run_id}/export first). The same rules as that export. The caller is the token's
    user, or the ticket's: a browser follows the export's download_url as a plain link, and the
    tar streams to the disk instead of being held in the page's memory.

    Resumable (RFC 9110 ranges): a ``Range`` of one span gets a 206 with just those bytes, read
    from the disk at that offset (the tar is the same bytes on every request while the
    directory is unchanged); one starting past the end a 416 with ``Content-Range: bytes
    */<size>``. A Range of several spans is answered with the whole tar (200), which RFC 9110
    allows, as it does ignoring a malformed one. ``If-Range`` with the ETag (the tar's SHA-256)
    makes the Range conditional on the tar being unchanged. Every answer carries the whole tar's
    SHA-256 as ``Repr-Digest`` (RFC 9530), computed once and kept beside the export."""
    user = _downloader(session, credentials, ticket, _download_purpose(run_id, step))
    run = owned(found(session, Run, run_id, "run"), user, "run")
    out = _exported(run, step, user, session, settings)
    archive, sha256 = model_registry.download(out)
    etag = f'"{sha256}"'
    headers = {
        "Content-Disposition": f'attachment; filename="{out.name}.tar"',
        "Accept-Ranges": "bytes",
        "ETag": etag,
        "Repr-Digest": f"sha-256=:{base64.b64encode(bytes.fromhex(sha256)).decode()}:",
    }
    span = _byte_range(range_, archive.size) if if_range in (None, etag) else None
    if span is None:
        headers["Content-Length"] = str(archive.size)
        return StreamingResponse(archive.chunks(), media_type="application/x-tar", headers=headers)
    start, end = span
    headers["Content-Length"] = str(end - start)
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{archive.size}"
    return StreamingResponse(
        archive.chunks(start, end),
        status_code=status.HTTP_206_PARTIAL_CONTENT,
        media_type="application/x-tar",
        headers=headers,
    )


_ONE_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one span a ``Range`` header asks for, as ``[start, end)`` within ``size`` bytes (a
    last byte past the end is the end); None for the whole: no header, several spans, another
    unit, or not the syntax (which RFC 9110 lets a server ignore). 416 when nothing of the tar
    is in it."""
    match = _ONE_RANGE.fullmatch(header.replace(" ", "")) if header else None
    if match is None or match.groups() == ("", ""):
        return None
    # (a number of more than 30 digits is past any end, and int() refuses thousands of them)
    first, last = (None if not g else int(g) if len(g) <= 30 else 10**30 for g in match.groups())
    if first is None:  # bytes=-n: the last n bytes (none of them for n = 0: a 416)
        assert last is not None
        start, end = max(size - last, 0), size
    else:
        if last is not None and last < first:
            return None  # not a range (RFC 9110 14.1.1): ignored
        start, end = first, size if last is None else min(last + 1, size)
    if start >= end:
        raise HTTPException(
            status.HTTP_416_RANGE_NOT_SATISFIABLE,
            f"Range {header}: the tar has {size} bytes (0-{size - 1})",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return start, end


def _downloader(
    session: Session, credentials: Credentials, ticket: str | None, purpose: str
) -> User:
    """The caller by its ticket when it brings one (401 when it is no good), else by its token
    (first, as every owned read: a caller without either learns nothing of the run)."""
    if ticket is None:
        return get_current_user(session, credentials)
    user = user_for_ticket(session, ticket, purpose)
    if user is None:
        detail = "the download link is invalid or expired: export the model again for a new one"
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail)
    return user


def _exported(run: Run, step: Step, user: User, session: Session, settings: Settings) -> Path:
    """The run's checkpoint ``step`` as an exported directory (written once): 403 naming the
    run of its lineage the caller may not use, 404 when there is no such checkpoint."""
    refused = sharing.first_refused(session, run, user, itself=False)
    if refused is not None:
        detail = sharing.refusal(run, refused, "exporting a model trained from it")
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail)
    try:
        return model_registry.export_model(settings, run.id, step)
    except FileNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
