"""OpenAI-style error bodies and the exception handlers that produce them.

Every error the server answers has the body OpenAI's clients parse:
`{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`. Validation problems are 400
`invalid_request_error` with `param` naming the field (`temperature`, `messages.0.role`), never FastAPI's
default 422 list.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("infer.serve")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    """An error to answer with an OpenAI-style body; raise it anywhere in a route."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers
        """Extra response headers (`Retry-After` on a 503)."""

    def body(self) -> dict[str, Any]:
        """The JSON body: `{"error": {...}}`."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        """This error as an HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, *, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An OpenAI error object wrapped in `{"error": ...}`."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _param_of(loc: tuple[Any, ...]) -> str | None:
    """`("body", "messages", 0, "role")` -> `messages.0.role`; None for the body as a whole."""
    parts = [str(p) for p in loc if p != "body"]
    # pydantic adds the union member's type name to the location ("function-after[...]", "str");
    # a client wants the field path only.
    parts = [
        p
        for p in parts
        if not any(ch in p for ch in "[]()") and p not in _TYPE_NAMES and not p.startswith("constrained-")
    ]
    return ".".join(parts) or None


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "list[str]", "list[int]", "none"})


def _describe(error: dict[str, Any]) -> str:
    if error.get("type") == "json_invalid":
        detail = error.get("ctx", {}).get("error", "")
        return (
            f"the request body is not valid JSON ({detail})"
            if detail
            else "the request body is not valid JSON"
        )
    param = _param_of(tuple(error.get("loc", ())))
    message = str(error.get("msg", "invalid value"))
    if param is None:
        if error.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return "the request body must be a JSON object (Content-Type: application/json)"
        return message
    shown = _shown(error["input"]) if "input" in error and error.get("type") != "missing" else None
    return f"{param}: {message}" + (f" (got {shown})" if shown is not None else "")


def _shown(value: Any) -> str:
    """`value` as the message quotes it, at most 80 characters, made in time independent of its size
    (the repr of a 100,000-item list alone would hold up the event loop)."""
    if isinstance(value, (list, tuple, dict)) and len(value) > 8:
        kind = "an object" if isinstance(value, dict) else "a list"
        return f"{kind} of {len(value)} items"
    if isinstance(value, (str, bytes)) and len(value) > 80:
        value = value[:80]
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _first_required_field(request: Request) -> str | None:
    """The first required field of the route's body model (`messages`, `prompt`, `input`)."""
    route = request.scope.get("route")
    body_field = getattr(route, "body_field", None)
    model = getattr(getattr(body_field, "field_info", None), "annotation", None)
    fields = getattr(model, "model_fields", {})
    return next((name for name, info in fields.items() if info.is_required()), None)


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    # A list past its cap fails every member of a union (`stop`: a string, or a list of at most 16);
    # the cap is what the client needs to hear, not that a list is not a string.
    errors.sort(key=lambda e: not str(e.get("type", "")).endswith("too_long"))
    first = dict(errors[0]) if errors else {}
    if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
        # no body at all: name the field a client must send first
        field_name = _first_required_field(request)
        wanted = f" with at least `{field_name}`" if field_name else ""
        message = f"the request body is empty; send a JSON object{wanted} (Content-Type: application/json)"
        return JSONResponse(error_body(message, param=field_name), status_code=400)
    message = _describe(first)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    param = None if first.get("type") == "json_invalid" else _param_of(tuple(first.get("loc", ())))
    return JSONResponse(error_body(message, param=param), status_code=400)


async def _api_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _http_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    return JSONResponse(
        error_body(str(exc.detail), type=kind, code=code),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def _unexpected_handler(_request: Request, exc: Exception) -> JSONResponse:
    # A bug must not take the server down or leak a traceback to the client; it goes to the log.
    logger.exception("unhandled error while serving a request")
    return JSONResponse(
        error_body(f"internal error: {type(exc).__name__}: {exc}", type=SERVER_ERROR), status_code=500
    )


def install_error_handlers(app: FastAPI) -> None:
    """Make every error `app` answers an OpenAI-style body (400 for validation, not 422)."""
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(APIError, _api_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
