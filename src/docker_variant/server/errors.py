"""The OCI error body both servers answer with, the exception handlers both servers install
(an exception becomes an answer here, once), and short failure kinds for metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from docker_variant.errors import InvalidInputError
from docker_variant.oci.errcode import ErrorCode, error_body
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    UpstreamUnavailableError,
)
from docker_variant.server.bodies import BodyTooLargeError

__all__ = [
    "JSON",
    "ErrorHandler",
    "OciErrorAnswer",
    "error_handlers",
    "error_kind",
    "handler_for",
    "oci_error",
    "timed_out",
]

JSON = "application/json"

ErrorHandler = Callable[[Request, Any], Awaitable[Response]]


def oci_error(
    code: ErrorCode,
    message: str,
    detail: object = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """``{"errors": [{"code", "message", "detail"}]}``, the distribution spec's error body
    (written by ``oci.errcode.error_body``), with the code's registered status."""
    return Response(
        error_body(code, message, detail),
        status_code=code.status,
        headers=dict(headers or {}),
        media_type=JSON,
    )


class OciErrorAnswer(Exception):
    """An error answer raised from anywhere under an endpoint: ``error_handlers`` sends it."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        detail: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.detail, self.headers = code, message, detail, headers


async def _answer(_request: Request, exc: OciErrorAnswer) -> Response:
    return oci_error(exc.code, exc.message, exc.detail, exc.headers)


async def _no_route(request: Request, exc: HTTPException) -> Response:
    # the router's own 404 and 405, in the error body every other answer has
    if exc.status_code == 405:
        code, what = ErrorCode.UNSUPPORTED, f"{request.method} is not allowed here"
    elif exc.status_code == 404:
        code, what = ErrorCode.ROUTE_UNKNOWN, "no such route"
    else:
        code, what = ErrorCode.INTERNAL, f"HTTP {exc.status_code}"
    return oci_error(code, f"{what}: {request.url.path}", headers=exc.headers)


async def _invalid_input(_request: Request, exc: InvalidInputError) -> Response:
    return oci_error(ErrorCode.INVALID_INPUT, str(exc))


async def _too_large(_request: Request, exc: BodyTooLargeError) -> Response:
    return oci_error(ErrorCode.REQUEST_TOO_LARGE, str(exc))


async def _internal(_request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware sends this, then raises on: the server logs the traceback
    return oci_error(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def error_handlers(own: Mapping[type[Exception], ErrorHandler]) -> dict[Any, ErrorHandler]:
    """Starlette's ``exception_handlers`` for either server: the shared mappings (an
    ``OciErrorAnswer``, the router's 404/405, bad input, a body too large, any other
    failure as 500) and the
    server's ``own``. Starlette looks a handler up along the exception's MRO, so a subclass's
    handler (``BodyTooLargeError`` before ``InvalidInputError``) wins over its base's."""
    shared: dict[Any, ErrorHandler] = {
        OciErrorAnswer: _answer,
        HTTPException: _no_route,
        InvalidInputError: _invalid_input,
        BodyTooLargeError: _too_large,
        Exception: _internal,
    }
    return shared | dict(own)


def timed_out(exc: BaseException) -> bool:
    # RegistryClient raises UpstreamUnavailableError "from" the httpx time-out; there is
    # no attribute that says "timed out", so follow the explicit causes.
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx.TimeoutException | TimeoutError):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def error_kind(exc: BaseException) -> str:
    """A short label for metrics: timeout, unreachable, bad_response, auth, not_found..."""
    if timed_out(exc):
        return "timeout"
    if isinstance(exc, RegistryAuthError):
        return "auth"
    if isinstance(exc, NotFoundError):
        return "not_found"
    if isinstance(exc, BadUpstreamResponseError):
        return "bad_response"
    if isinstance(exc, UpstreamUnavailableError):
        return "unreachable" if exc.status is None else "upstream_status"
    return "error"


def handler_for(exc: Exception, handlers: Mapping[Any, ErrorHandler]) -> ErrorHandler | None:
    """The handler Starlette picks for ``exc`` (the first along its MRO), short of
    ``Exception``'s: that 500 is sent, and the traceback logged, outside the app's middleware."""
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            found: ErrorHandler = handlers[cls]
            return found
    return None
