"""OCI error bodies, and the mapping of registry failures to the proxy's answers."""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx
from starlette.responses import Response

from docker_variant.errors import DockerVariantError
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    RegistryError,
    UpstreamUnavailableError,
    one_line,
)

__all__ = ["JSON", "error_kind", "failure_response", "oci_error"]

JSON = "application/json"


def oci_error(
    status: int,
    code: str,
    message: str,
    detail: object = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """``{"errors": [{"code", "message", "detail"}]}``, the distribution spec's error body."""
    body = {"errors": [{"code": code, "message": one_line(message), "detail": detail}]}
    return Response(
        json.dumps(body, sort_keys=True).encode(),
        status_code=status,
        headers=dict(headers or {}),
        media_type=JSON,
    )


def _timed_out(exc: BaseException) -> bool:
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
    if _timed_out(exc):
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


def failure_response(exc: BaseException, what: str) -> Response:
    """The answer for a failed index scan: the upstream's own status for auth and
    not-found, 429 passed on, 504 for a time-out, 502 for everything else."""
    detail = {"upstream": exc.url} if isinstance(exc, RegistryError) and exc.url else None
    if _timed_out(exc):
        return oci_error(
            504, "UNAVAILABLE", f"{what}: the upstream registry timed out: {exc}", detail
        )
    if isinstance(exc, RegistryAuthError):
        status = exc.status if exc.status in (401, 403) else 401
        headers = {}
        if challenge := exc.headers.get("www-authenticate"):
            headers["WWW-Authenticate"] = challenge
        code = exc.code or ("UNAUTHORIZED" if status == 401 else "DENIED")
        return oci_error(status, code, str(exc), detail, headers)
    if isinstance(exc, NotFoundError):
        return oci_error(404, exc.code or "NAME_UNKNOWN", str(exc), detail)
    if isinstance(exc, UpstreamUnavailableError) and exc.status == 429:
        headers = {}
        if retry := exc.headers.get("retry-after"):
            headers["Retry-After"] = retry
        return oci_error(429, "TOOMANYREQUESTS", str(exc), detail, headers)
    if isinstance(exc, BadUpstreamResponseError):
        return oci_error(502, "UNKNOWN", f"{what}: the upstream answered garbage: {exc}", detail)
    if isinstance(exc, UpstreamUnavailableError):
        return oci_error(502, "UNAVAILABLE", f"{what}: the upstream is unavailable: {exc}", detail)
    if isinstance(exc, DockerVariantError):
        return oci_error(502, "UNKNOWN", f"{what}: {exc}", detail)
    return oci_error(502, "UNKNOWN", f"{what}: {type(exc).__name__}: {exc}", detail)
