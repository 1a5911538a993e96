"""The OCI error body both servers answer with, and short failure kinds for metrics."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from starlette.responses import Response

from docker_variant.oci.errcode import ErrorCode, error_body
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    UpstreamUnavailableError,
)

__all__ = ["JSON", "error_kind", "oci_error", "timed_out"]

JSON = "application/json"


def oci_error(
    status: int,
    code: ErrorCode | str,
    message: str,
    detail: object = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """``{"errors": [{"code", "message", "detail"}]}``, the distribution spec's error body
    (written by ``oci.errcode.error_body``)."""
    return Response(
        error_body(code, message, detail),
        status_code=status,
        headers=dict(headers or {}),
        media_type=JSON,
    )


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
