"""The FastAPI application: ``create_app(settings)`` and a module-level ``app`` for uvicorn."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend import task_checks
from backend.alerts.dispatcher import Dispatcher
from backend.api import contract, errors
from backend.api.deps import SessionGate, require_reader
from backend.api.query import format_is_declared, query_is_utf8
from backend.api.routes import (
    alerts,
    answers,
    compare,
    external,
    health,
    metrics,
    models,
    pipelines,
    presets,
    prompts,
    rollouts,
    runs,
    stream,
    studies,
)
from backend.api.stream_hub import StreamHub
from backend.config import VERSION, Settings, get_settings
from backend.db import Database
from backend.pipelines.stages import install_hooks
from backend.runs.queue import JobQueue, make_celery
from conspo import plugins

log = logging.getLogger(__name__)


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI, reading the body, answers 413 with it instead of taking
    it for a malformed body (400)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, detail=f"request body over {max_bytes} bytes")


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _plain(send, 400, "invalid Content-Length header")
                return
            if int(declared) > self.max_bytes:
                await _plain(send, 413, f"request body over {self.max_bytes} bytes")
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:
            if not started:
                await _plain(send, 413, exc.detail)


class RequestTimeout:
    """A GET or HEAD whose response has not started after ``seconds`` gets 503.

    What it cuts short is mostly waiting: for a worker thread, behind a backlog. Requests that
    clients gave up on are dropped instead of run late, so a burst cannot keep the API busy
    long after it ended. A handler already running in a thread finishes first (threads cannot
    be interrupted; the statement timeout bounds its queries). Only reads are cut: a write cut
    after it committed would tell its client it failed. Once a response has started (every
    live stream starts at once) it is never cut.
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.seconds or scope["method"] not in {"GET", "HEAD"}:
            await self.app(scope, receive, send)
            return
        started = False
        with anyio.CancelScope(deadline=anyio.current_time() + self.seconds) as deadline:

            async def send_lifting_deadline(message: Message) -> None:
                nonlocal started
                if message["type"] == "http.response.start":
                    started = True
                    deadline.deadline = math.inf
                await send(message)

            await self.app(scope, receive, send_lifting_deadline)
        if deadline.cancelled_caught and not started:
            await _plain(
                send,
                503,
                f"request took longer than {self.seconds:g} s (CONSPO_REQUEST_TIMEOUT_S); "
                "the server is busy, retry later",
                retry_after=1,
            )


async def _plain(send: Send, status: int, detail: str, retry_after: int | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    install_hooks()  # lifecycle.finish releases a pipeline's next stage

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The task-check helpers start on first use (the form's estimate, as you type, or a
        # submit), not here: most processes serving pages and reads never need them.
        # The users' plugins are imported now, so one that fails is named in the log at start
        # (and in /api/health), not at the first submit that needs it.
        plugins.load_plugins()
        alerts = Dispatcher(app.state.db, settings)
        alerts.start()
        yield
        alerts.stop()
        app.state.db.dispose()
        task_checks.for_settings(settings).close()

    app = FastAPI(
        title="ConSPO Lab",
        version=VERSION,
        description="Self-hosted RLVR experiment platform (docs/api.md is the contract).",
        lifespan=lifespan,
        # /docs is backend.pages' own offline reference: Swagger UI loads from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db = Database(settings, serving=True)
    app.state.streams = StreamHub(app.state.db, settings)
    app.state.session_gate = SessionGate.for_settings(settings)
    app.state.celery = make_celery(settings)
    app.state.jobs = JobQueue(app.state.celery, settings.queue)
    if settings.ui_token_inject and settings.token_file.is_file():
        app.state.ui_token = settings.token_file.read_text().strip() or None

    api = APIRouter(
        prefix="/api",
        dependencies=[
            Depends(query_is_utf8),
            Depends(format_is_declared),
            Depends(require_reader),
        ],
    )
    for module in (
        runs,
        external,
        metrics,
        rollouts,
        prompts,
        presets,
        stream,
        studies,
        compare,
        pipelines,
        models,
        alerts,
        answers,
    ):
        api.include_router(module.router)
    api.include_router(models.runs_router)  # GET /api/runs/{run_id}/export: a model's download
    app.include_router(api)
    app.include_router(health.router, prefix="/api")  # health stays open
    errors.install(app)
    contract.install(app, settings)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestTimeout, seconds=settings.request_timeout_s)
    try:
        from backend import pages
    except ImportError:  # the HTML pages are optional for the API
        pages = None  # type: ignore[assignment]
    if pages is not None:
        app.include_router(pages.router)
        _install_not_found_page(app, pages)
    return app


def _install_not_found_page(app: FastAPI, pages: Any) -> None:
    """Browsers get an HTML 404 page for unknown URLs; /api and every non-HTML client keep the
    JSON error."""

    async def not_found(request: Request, exc: Exception) -> Any:
        if getattr(exc, "status_code", None) == 404 and pages.wants_html(request):
            return pages.not_found_page(request)
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]

    app.add_exception_handler(StarletteHTTPException, not_found)


def __getattr__(name: str) -> Any:
    # `uvicorn backend.main:app`: built on first access, so importing this module has no effects.
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
