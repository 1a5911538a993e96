"""The mapping of registry failures to the proxy's answers (bodies: ``server.errors.oci_error``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.responses import Response

from docker_variant.errors import DockerVariantError, one_line, without_origins
from docker_variant.oci.errcode import ErrorCode, registered
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
    code: ErrorCode, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """An OCI error about the upstream, with every URL's origin taken out of the message
    (paths stay: they are the caller's own names); the full message goes to the log."""
    _log.warning("upstream failure (%s %s): %s", code.status, code, one_line(message))
    return oci_error(code, without_origins(message, "<upstream>"), None, headers)


def _upstream_code(sent: str | None, fallback: ErrorCode) -> ErrorCode:
    """The upstream's own code where it is registered with ``fallback``'s status."""
    code = registered(sent)
    return code if code is not None and code.status == fallback.status else fallback


def failure_response(exc: BaseException, what: str) -> Response:
    """The answer for a failed index scan: the upstream's own auth and not-found answers
    (its code where it has that status), 429 passed on, 504 for a time-out, 502 for
    everything else."""
    if timed_out(exc):
        detail = f": {exc}" if str(exc) else ""  # asyncio's TimeoutError says nothing
        message = f"{what}: the upstream registry timed out{detail}"
        return upstream_error(ErrorCode.REGISTRY_TIMEOUT, message)
    if isinstance(exc, RegistryAuthError):
        fallback = ErrorCode.DENIED if exc.status == 403 else ErrorCode.UNAUTHORIZED
        headers = {}
        if challenge := exc.headers.get("www-authenticate"):
            headers["WWW-Authenticate"] = challenge
        return upstream_error(_upstream_code(exc.code, fallback), str(exc), headers)
    if isinstance(exc, NotFoundError):
        return upstream_error(_upstream_code(exc.code, ErrorCode.NAME_UNKNOWN), str(exc))
    if isinstance(exc, UpstreamUnavailableError) and exc.status == 429:
        headers = {}
        if retry := exc.headers.get("retry-after"):
            headers["Retry-After"] = retry
        return upstream_error(ErrorCode.TOOMANYREQUESTS, str(exc), headers)
    if isinstance(exc, BadUpstreamResponseError):
        message = f"{what}: the upstream answered garbage: {exc}"
    elif isinstance(exc, UpstreamUnavailableError):
        message = f"{what}: the upstream is unavailable: {exc}"
    elif isinstance(exc, DockerVariantError):
        message = f"{what}: {exc}"
    else:
        message = f"{what}: {type(exc).__name__}: {exc}"
    return upstream_error(ErrorCode.REGISTRY_UNAVAILABLE, message)
