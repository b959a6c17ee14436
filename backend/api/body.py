"""JSON request bodies: a route class whose refusals of a body name what is wrong with it.

FastAPI reads a body of another content type as raw bytes and lets the model refuse it (a 422
that says nothing of the content type, or a 500 when the bytes are not UTF-8), and answers any
other failure to parse JSON with "There was an error parsing the body". Routers that take JSON
bodies use ``route_class=JSONBodyRoute``: a body that is not JSON gets 415, one that is not
UTF-8, nested past what the parser can follow, or holding an integer too long to convert gets
400 saying so. Malformed JSON keeps FastAPI's 422 with the position of the error.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response, status
from fastapi.routing import APIRoute


class JSONBodyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        takes_body = self.body_field is not None

        async def handler(request: Request) -> Response:
            request = JSONBodyRequest(request.scope, request.receive)
            if takes_body and await request.body():
                _require_json_content_type(request.headers.get("content-type"))
            return await handle(request)

        return handler


class JSONBodyRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = _parse(await self.body())
        return self._json


def _require_json_content_type(value: str | None) -> None:
    message = email.message.Message()
    message["content-type"] = value or ""
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (
        subtype == "json" or subtype.endswith("+json")
    ):
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            detail=f"the request body must be JSON (Content-Type: application/json), not"
            f" {value[:100] if value else 'a body without a Content-Type'}",
        )


def _parse(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_body(f"is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise  # FastAPI answers 422 with the position
    except RecursionError:
        raise _bad_body("is nested too deeply to parse") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _bad_body(f"holds a value that cannot be read: {str(exc)[:200]}") from None


def _bad_body(problem: str) -> HTTPException:
    return HTTPException(status.HTTP_400_BAD_REQUEST, detail=f"the request body {problem}")
