"""The mapping of registry failures to the proxy's answers (bodies: ``server.errors.oci_error``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.responses import Response

from docker_variant.errors import DockerVariantError, one_line, without_origins
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    UpstreamUnavailableError,
)
from docker_variant.server.errors import oci_error, timed_out

__all__ = ["failure_response", "upstream_error"]

_log = logging.getLogger("docker_variant.proxy")


def upstream_error(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An OCI error about the upstream, with every URL's origin taken out of the message
    (paths stay: they are the caller's own names); the full message goes to the log."""
    _log.warning("upstream failure (%s %s): %s", status, code, one_line(message))
    return oci_error(status, code, without_origins(message, "<upstream>"), None, headers)


def failure_response(exc: BaseException, what: str) -> Response:
    """The answer for a failed index scan: the upstream's own status for auth and
    not-found, 429 passed on, 504 for a time-out, 502 for everything else."""
    if timed_out(exc):
        detail = f": {exc}" if str(exc) else ""  # asyncio's TimeoutError says nothing
        return upstream_error(
            504, ErrorCode.UNAVAILABLE, f"{what}: the upstream registry timed out{detail}"
        )
    if isinstance(exc, RegistryAuthError):
        status = exc.status if exc.status in (401, 403) else 401
        headers = {}
        if challenge := exc.headers.get("www-authenticate"):
            headers["WWW-Authenticate"] = challenge
        code = exc.code or (ErrorCode.UNAUTHORIZED if status == 401 else ErrorCode.DENIED)
        return upstream_error(status, code, str(exc), headers)
    if isinstance(exc, NotFoundError):
        return upstream_error(404, exc.code or ErrorCode.NAME_UNKNOWN, str(exc))
    if isinstance(exc, UpstreamUnavailableError) and exc.status == 429:
        headers = {}
        if retry := exc.headers.get("retry-after"):
            headers["Retry-After"] = retry
        return upstream_error(429, ErrorCode.TOOMANYREQUESTS, str(exc), headers)
    if isinstance(exc, BadUpstreamResponseError):
        return upstream_error(
            502, ErrorCode.UNKNOWN, f"{what}: the upstream answered garbage: {exc}"
        )
    if isinstance(exc, UpstreamUnavailableError):
        return upstream_error(
            502, ErrorCode.UNAVAILABLE, f"{what}: the upstream is unavailable: {exc}"
        )
    if isinstance(exc, DockerVariantError):
        return upstream_error(502, ErrorCode.UNKNOWN, f"{what}: {exc}")
    return upstream_error(502, ErrorCode.UNKNOWN, f"{what}: {type(exc).__name__}: {exc}")
