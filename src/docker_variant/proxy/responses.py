"""The mapping of registry failures to the proxy's answers (bodies: ``serving.oci_error``)."""

from __future__ import annotations

from starlette.responses import Response

from docker_variant.errors import DockerVariantError
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    RegistryError,
    UpstreamUnavailableError,
)
from docker_variant.serving import oci_error, timed_out

__all__ = ["failure_response"]


def failure_response(exc: BaseException, what: str) -> Response:
    """The answer for a failed index scan: the upstream's own status for auth and
    not-found, 429 passed on, 504 for a time-out, 502 for everything else."""
    detail = {"upstream": exc.url} if isinstance(exc, RegistryError) and exc.url else None
    if timed_out(exc):
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
