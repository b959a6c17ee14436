"""The OpenAPI document as the API's contract: every status an operation can answer, the body of
each refusal, and whether it needs a token.

Most refusals come from what a route depends on, each written once (``backend.api.deps``,
``backend.api.body``, the middleware of ``backend.main``), so they are documented once here, from
the dependency that answers them (``ANSWERS``), and follow a route when its dependencies change:

* a run, study or pipeline in the path: 404; the owner's version of it: 401, 403 and 404;
* the caller (``CurrentUser``): 401; an optional caller (``OptionalUser``): 401 for a bad token;
* a database session: 503 (no connection free in time, a statement past its timeout, the
  database down);
* a JSON body (``JSONBodyRoute``): 400 (not UTF-8, unreadable), 413 (too large), 415 (not JSON);
* every /api route: 422 (a parameter out of its range, a query that is not UTF-8);
* every read: 503 when it has not begun answering within CONSPO_REQUEST_TIMEOUT_S, and 401
  without a token when CONSPO_READS_REQUIRE_TOKEN=true.

What a handler refuses by itself (409: logging into a run that a worker runs) its decorator
declares, with ``refusals``; a handler that reads the token itself says so with
``OPTIONAL_TOKEN``.

Security follows the same facts: an operation needs a token when it depends on the caller; a
read needs one only when CONSPO_READS_REQUIRE_TOKEN=true and is otherwise public (``security:
[]``); a token is optional (``[{}, bearer]``) where it only changes the answer (what the caller
may do with a model; whose streams a live stream counts against). The document is made per
app, so it states the settings that app runs with.

And a method the document does not list for a path is a 405 whose Allow names the ones it does
(``Methods``), for the path the URL denotes as OpenAPI reads it (a concrete path before a
templated one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from pydantic import BaseModel, Field
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from backend.api import deps
from backend.api.body import JSONBodyRoute
from backend.api.query import query_is_utf8
from backend.config import Settings

READS = frozenset({"GET", "HEAD"})


class Refusal(BaseModel):
    """A refusal: what was refused and why, in the user's terms."""

    detail: str


class FieldError(BaseModel):
    type: str
    loc: list[str | int] = Field(description='Where: "body", "query" or "path", then the field.')
    msg: str
    input: Any = Field(None, description="The refused value, when it is short.")
    ctx: dict[str, Any] | None = None


class FieldRefusals(BaseModel):
    """Each problem located at its field (at most 50); a string when the database refused a
    value that validation let through."""

    detail: list[FieldError] | str


class CSVText(PlainTextResponse):
    """CSV, documented as ``text/csv``."""

    media_type = "text/csv"


BUSY = (
    "The server is busy or its database unavailable: no connection free within"
    " CONSPO_DB_POOL_TIMEOUT_S, a query past CONSPO_DB_STATEMENT_TIMEOUT_S, or a read not begun"
    " within CONSPO_REQUEST_TIMEOUT_S. Retry later (Retry-After)."
)
NO_TOKEN = "No token (Authorization: Bearer <token>), or an invalid or revoked one."
BAD_TOKEN = "The token given is invalid or revoked (none at all is fine)."
# a submit checks its configs' tasks on helpers first (backend.task_checks), then queues
SUBMIT_BUSY = f"{BUSY} Or every task-check helper stayed busy (CONSPO_TASK_CHECK_WAIT_S)."
QUEUE_DOWN = f"{SUBMIT_BUSY} Or the job queue is unreachable: nothing was queued."
STARTS_FROM_UNSHARED = (
    "A config starts from another user's run that is not shared (model.from_run): located at"
    " that field."
)
INVALID = "A parameter or a body field is invalid: each problem located at its field."
FIELD_STATUSES = frozenset({403, 422})  # refusals located at fields (Forbidden, InvalidInput)

# What each dependency answers besides letting the request through.
ANSWERS: dict[Callable[..., Any], dict[int, str]] = {
    deps.get_current_user: {401: NO_TOKEN},
    deps.get_optional_user: {401: BAD_TOKEN},
    deps.get_owned_run: {
        401: NO_TOKEN,
        403: "The run is another user's: only its owner or an admin may.",
        404: "No run has this id.",
    },
    deps.get_run: {404: "No run has this id."},
    deps.get_study: {404: "No study has this id."},
    deps.get_owned_study: {403: "The study is another user's: only its owner or an admin may."},
    deps.get_pipeline: {404: "No pipeline has this id."},
    deps.get_owned_pipeline: {
        403: "The pipeline is another user's: only its owner or an admin may."
    },
    deps.start_run_stream: {404: "No run has this id."},
    deps.get_session: {503: BUSY},
    deps.get_in_session: {503: BUSY},
    query_is_utf8: {422: INVALID},
}
NEEDS_TOKEN = frozenset({deps.get_current_user, deps.get_owned_run})
TAKES_TOKEN = frozenset({deps.get_optional_user, deps.start_run_stream, deps.start_runs_stream})
BODY_ANSWERS = {
    413: "The body is over CONSPO_MAX_REQUEST_BYTES.",
    422: INVALID,
}
JSON_BODY_ANSWERS = {
    400: "The body is not UTF-8, is nested too deeply to parse, or holds a number that cannot"
    " be read (an integer of thousands of digits).",
    415: "The body is not JSON (Content-Type: application/json or …+json).",
}


# For ``openapi_extra=``: a handler that reads the token itself (``Credentials``) and answers
# without one says so, as the dependencies above cannot.
OPTIONAL_TOKEN: dict[str, Any] = {"security": [{}, {deps.bearer.scheme_name: []}]}


def refusals(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A route's own refusals for ``responses=``: ``{409: "why"}``, each with its error body."""
    return {code: _response(code, why) for code, why in described.items()}


def _response(code: int, why: str) -> dict[str, Any]:
    return {"model": FieldRefusals if code in FIELD_STATUSES else Refusal, "description": why}


def install(app: FastAPI, settings: Settings) -> None:
    """``app.openapi()`` (and /openapi.json) gives the document completed by ``complete``, and a
    method it does not list for a path is a 405 naming those it does (``Methods``)."""
    make = app.openapi
    completed: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        document = make()  # FastAPI's, cached until the routes change
        if not any(document is done for done in completed):
            complete(document, app.routes, settings)
            completed[:] = [document]
        return document

    app.openapi = openapi  # type: ignore[method-assign]
    methods = Methods(app)

    async def method_not_allowed(request: Request, _: Exception) -> Response:
        return methods.refusal(methods.of(request.url.path) or frozenset())

    app.add_exception_handler(405, method_not_allowed)
    app.add_middleware(ConcretePathsFirst, methods=methods)


class Methods:
    """The methods of each /api path of the document, for the path a URL denotes: a concrete
    path before a templated one, as OpenAPI reads them. Made from the routes on first use (by
    then every router is included)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._concrete: dict[str, frozenset[str]] | None = None
        self._templated: list[tuple[re.Pattern[str], frozenset[str]]] = []

    def concrete(self, path: str) -> frozenset[str] | None:
        if self._concrete is None:
            self._build()
        assert self._concrete is not None
        return self._concrete.get(path)

    def of(self, path: str) -> frozenset[str] | None:
        found = self.concrete(path)
        if found is not None:
            return found
        return next((methods for regex, methods in self._templated if regex.match(path)), None)

    @staticmethod
    def refusal(allowed: frozenset[str]) -> Response:
        headers = {"Allow": ", ".join(sorted(allowed))}
        return JSONResponse({"detail": "Method Not Allowed"}, status_code=405, headers=headers)

    def _build(self) -> None:
        by_path: dict[str, set[str]] = {}
        regex: dict[str, re.Pattern[str]] = {}
        for path, route, methods in api_routes(self._app.routes):
            by_path.setdefault(path, set()).update(methods)
            regex[path] = route.path_regex
        self._templated = [(regex[p], frozenset(m)) for p, m in by_path.items() if "{" in p]
        self._concrete = {p: frozenset(m) for p, m in by_path.items() if "{" not in p}


class ConcretePathsFirst:
    """A method not listed for a concrete /api path is its 405 (``Methods.refusal``), never a
    request to a templated path that also matches it: POST /api/runs/estimate exists, so PATCH
    /api/runs/estimate is a 405, not a PATCH of the run "estimate". Starlette's router would
    take the templated route (a 422 for that run id); the templated paths' own 405s are the
    exception handler's. One dict look-up a request."""

    def __init__(self, app: ASGIApp, methods: Methods) -> None:
        self.app, self.methods = app, methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            allowed = self.methods.concrete(scope["path"])
            if allowed is not None and scope["method"] not in allowed:
                await self.methods.refusal(allowed)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def complete(document: dict[str, Any], routes: Iterable[BaseRoute], settings: Settings) -> None:
    """Add to each /api operation of ``document`` the statuses its dependencies answer and the
    security it really has (FastAPI marks every operation whose dependencies read a token as
    needing one, though most only look at it)."""
    schemes = document.setdefault("components", {}).setdefault("schemas", {})
    for model in (Refusal, FieldRefusals):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemes.update(schema.pop("$defs", {}))
        schemes[model.__name__] = schema
    for path, route, methods in api_routes(routes):
        calls = _calls(route.dependant)
        for method in methods:
            operation = document["paths"][path][method.lower()]
            reads = method in READS
            _add_answers(operation, _answers(route, calls, reads, settings))
            declared = (route.openapi_extra or {}).get("security")
            operation["security"] = declared or _security(calls, reads, settings)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemes.pop(unused, None)  # FastAPI's 422 body, replaced by FieldRefusals
    _as_validated(document)


def api_routes(routes: Iterable[BaseRoute]) -> Iterator[tuple[str, RouteContext, set[str]]]:
    """(path, route, methods) of every documented /api route, included routers' too."""
    for route in iter_route_contexts(list(routes)):
        path = route.path_format
        documented = isinstance(route.original_route, APIRoute) and route.include_in_schema
        if documented and path is not None and path.startswith("/api/"):
            yield path, route, set(route.methods or ())


def _as_validated(node: Any) -> None:
    """Two things FastAPI's rendering of pydantic's schemas says otherwise than pydantic
    validates, said as it validates:

    * a dict whose keys have a pattern (``dict[Label, float]``): every key must match it, but
      ``patternProperties`` lets a key that misses it through with any value; ``propertyNames``
      says it;
    * whole bounds: FastAPI writes them as floats (2**63 - 1 becomes 2**63, and a fuzzer drawing
      the boundary sends 9.2e18, a float); written as integers, they are exact.
    """
    if isinstance(node, list):
        for item in node:
            _as_validated(item)
    if not isinstance(node, dict):
        return
    keyed = node.get("patternProperties")
    if isinstance(keyed, dict) and len(keyed) == 1 and "additionalProperties" not in node:
        ((pattern, values),) = node.pop("patternProperties").items()
        node["additionalProperties"] = values
        node.setdefault("propertyNames", {})["pattern"] = pattern
    for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(node.get(bound), float) and node[bound].is_integer():
            node[bound] = int(node[bound])
    for value in node.values():
        _as_validated(value)


def _answers(
    route: RouteContext, calls: set[Callable[..., Any]], reads: bool, settings: Settings
) -> dict[int, str]:
    found: dict[int, str] = {}
    for call in calls:
        for code, why in ANSWERS.get(call, {}).items():
            found.setdefault(code, why)
    if route.body_field is not None:
        found.update(BODY_ANSWERS)
        if isinstance(route.original_route, JSONBodyRoute):
            found.update(JSON_BODY_ANSWERS)
    if reads:
        found.setdefault(503, BUSY)  # main.RequestTimeout
        if deps.require_reader in calls and settings.reads_require_token:
            found.setdefault(401, NO_TOKEN)
    return found


def _add_answers(operation: dict[str, Any], answers: dict[int, str]) -> None:
    responses = operation.setdefault("responses", {})
    for code, why in sorted(answers.items()):
        declared = responses.get(str(code))
        if declared is None:
            responses[str(code)] = {"description": why}
        if declared is None or code == 422:  # FastAPI's own 422 has FastAPI's body
            model = FieldRefusals if code in FIELD_STATUSES else Refusal
            ref = {"$ref": f"#/components/schemas/{model.__name__}"}
            responses[str(code)]["content"] = {"application/json": {"schema": ref}}
    if "422" in responses and responses["422"].get("description") == "Validation Error":
        responses["422"]["description"] = INVALID
    for code, response in responses.items():
        content = response.get("content")
        if int(code) >= 400 and content and "application/json" not in content:
            # FastAPI files a refusal under the route's own media type (text/csv): refusals
            # are always JSON
            response["content"] = {"application/json": next(iter(content.values()))}
    operation["responses"] = dict(sorted(responses.items()))


def _security(
    calls: set[Callable[..., Any]], reads: bool, settings: Settings
) -> list[dict[str, list[str]]]:
    bearer: dict[str, list[str]] = {deps.bearer.scheme_name: []}
    guarded_read = reads and deps.require_reader in calls and settings.reads_require_token
    if calls & NEEDS_TOKEN or guarded_read:
        return [bearer]
    if calls & TAKES_TOKEN:
        return [{}, bearer]
    return []


def _calls(dependant: Dependant) -> set[Callable[..., Any]]:
    """Every function ``dependant`` depends on, however deep."""
    found: set[Callable[..., Any]] = set()
    stack = [dependant]
    while stack:
        current = stack.pop()
        if current.call is not None:
            found.add(current.call)
        stack.extend(current.dependencies)
    return found
