"""The OCI error registry: every error code this package sends or reads, each with a
descriptor as distribution's ``errcode`` has them (HTTP status, message, description), in
groups: the distribution spec's, distribution's own, both servers' and the scheduler's. Every
answer takes its status from here (``server.errors.oci_error``), and the OpenAPI documents
their code enum. Also one writer of the error body and one reader that never raises.

The body is the distribution spec's ``{"errors": [{"code", "message", "detail"}]}``. Both
servers answer with it, and every client (the registry client, the node agent, the what-if
command) reads answers with ``read_error``, which takes any bytes: a body that is not JSON,
too large, too deep or of another shape reads as "no OCI error". Pure: no httpx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.jsondoc import load_json

__all__ = [
    "ERROR_BODY_LIMIT",
    "GROUPS",
    "ErrorCode",
    "ErrorDescriptor",
    "OciError",
    "descriptors",
    "error_body",
    "read_error",
    "registered",
]

#: Enough of an error body to find its first error; the rest is never read.
ERROR_BODY_LIMIT = 64 << 10


class ErrorCode(StrEnum):
    """An error code; ``descriptor`` says its HTTP status, message and meaning."""

    # The distribution spec's codes.
    BLOB_UNKNOWN = "BLOB_UNKNOWN"
    BLOB_UPLOAD_INVALID = "BLOB_UPLOAD_INVALID"
    BLOB_UPLOAD_UNKNOWN = "BLOB_UPLOAD_UNKNOWN"
    DIGEST_INVALID = "DIGEST_INVALID"
    MANIFEST_BLOB_UNKNOWN = "MANIFEST_BLOB_UNKNOWN"
    MANIFEST_INVALID = "MANIFEST_INVALID"
    MANIFEST_UNKNOWN = "MANIFEST_UNKNOWN"
    NAME_INVALID = "NAME_INVALID"
    NAME_UNKNOWN = "NAME_UNKNOWN"
    SIZE_INVALID = "SIZE_INVALID"
    UNAUTHORIZED = "UNAUTHORIZED"
    DENIED = "DENIED"
    UNSUPPORTED = "UNSUPPORTED"
    TOOMANYREQUESTS = "TOOMANYREQUESTS"
    # distribution's own, beyond the spec.
    TAG_INVALID = "TAG_INVALID"
    MANIFEST_UNVERIFIED = "MANIFEST_UNVERIFIED"
    RANGE_INVALID = "RANGE_INVALID"
    PAGINATION_NUMBER_INVALID = "PAGINATION_NUMBER_INVALID"
    QUERY_PARAMETER_INVALID = "QUERY_PARAMETER_INVALID"
    UNKNOWN = "UNKNOWN"
    UNAVAILABLE = "UNAVAILABLE"
    # Both servers' own (the proxy has none beyond these).
    INVALID_INPUT = "INVALID_INPUT"
    ROUTE_UNKNOWN = "ROUTE_UNKNOWN"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
    HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
    INTERNAL = "INTERNAL"
    REGISTRY_TIMEOUT = "REGISTRY_TIMEOUT"
    REGISTRY_UNAVAILABLE = "REGISTRY_UNAVAILABLE"
    # The scheduler's.
    NOT_FOUND = "NOT_FOUND"
    IMAGE_UNKNOWN = "IMAGE_UNKNOWN"
    REGISTRY_DENIED = "REGISTRY_DENIED"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"

    @property
    def descriptor(self) -> ErrorDescriptor:
        return _DESCRIPTORS[self]

    @property
    def status(self) -> int:
        """The HTTP status every answer with this code is sent with."""
        return _DESCRIPTORS[self].status


@dataclass(frozen=True)
class ErrorDescriptor:
    """What distribution's ``errcode.ErrorDescriptor`` says of a code: the HTTP status it
    is sent with, its usual message, what it means, and the group that registered it."""

    code: ErrorCode
    status: int
    message: str
    description: str
    group: str

    @property
    def value(self) -> str:
        return self.code.value


#: The groups, in the order they are listed (OpenAPI, docs).
SPEC, DISTRIBUTION, SERVERS, SCHEDULER = "distribution-spec", "distribution", "servers", "scheduler"
GROUPS = (SPEC, DISTRIBUTION, SERVERS, SCHEDULER)

_DESCRIPTORS: dict[ErrorCode, ErrorDescriptor] = {}


def _register(group: str, code: ErrorCode, status: int, message: str, description: str) -> None:
    if code in _DESCRIPTORS:
        raise ValueError(f"error code {code} is registered twice")
    _DESCRIPTORS[code] = ErrorDescriptor(code, status, message, description, group)


# fmt: off
_register(SPEC, ErrorCode.BLOB_UNKNOWN, 404, "blob unknown to registry",
          "The blob is unknown to the registry in this repository.")
_register(SPEC, ErrorCode.BLOB_UPLOAD_INVALID, 400, "blob upload invalid",
          "The upload id is not one a registry issues, or the upload can no longer proceed.")
_register(SPEC, ErrorCode.BLOB_UPLOAD_UNKNOWN, 404, "blob upload unknown to registry",
          "The blob upload was cancelled or never started.")
_register(SPEC, ErrorCode.DIGEST_INVALID, 400, "provided digest did not match uploaded content",
          "A digest is malformed, or does not match the content it names.")
_register(SPEC, ErrorCode.MANIFEST_BLOB_UNKNOWN, 404, "manifest references a blob unknown to registry",
          "A manifest names a blob or manifest the repository does not have.")
_register(SPEC, ErrorCode.MANIFEST_INVALID, 400, "manifest invalid",
          "A manifest, or a header describing the caller's host, failed validation; the "
          "message says which rule.")
_register(SPEC, ErrorCode.MANIFEST_UNKNOWN, 404, "manifest unknown",
          "No manifest of this name, tag or digest, or no variant of a version fits the host.")
_register(SPEC, ErrorCode.NAME_INVALID, 400, "invalid repository name",
          "The repository name, or the request path, breaks the distribution grammar.")
_register(SPEC, ErrorCode.NAME_UNKNOWN, 404, "repository name not known to registry",
          "The repository is unknown to the registry.")
_register(SPEC, ErrorCode.SIZE_INVALID, 400, "provided length did not match content length",
          "An uploaded size does not match the content.")
_register(SPEC, ErrorCode.UNAUTHORIZED, 401, "authentication required",
          "No credentials or invalid ones; the WWW-Authenticate header says how to authenticate.")
_register(SPEC, ErrorCode.DENIED, 403, "requested access to the resource is denied",
          "The credentials are valid but may not do this.")
_register(SPEC, ErrorCode.UNSUPPORTED, 405, "the operation is unsupported",
          "The method is not allowed on this route.")
_register(SPEC, ErrorCode.TOOMANYREQUESTS, 429, "too many requests",
          "A limit on the caller was reached: the registry's rate, or the placements a "
          "client may keep.")
_register(DISTRIBUTION, ErrorCode.TAG_INVALID, 400, "manifest tag did not match URI",
          "A tag (or a version) breaks the tag grammar.")
_register(DISTRIBUTION, ErrorCode.MANIFEST_UNVERIFIED, 400, "manifest failed signature verification",
          "A signed manifest failed verification.")
_register(DISTRIBUTION, ErrorCode.RANGE_INVALID, 416, "invalid content range",
          "An upload chunk's range is out of order.")
_register(DISTRIBUTION, ErrorCode.PAGINATION_NUMBER_INVALID, 400, "invalid number of results requested",
          "The n parameter is not an integer, negative, or over the maximum.")
_register(DISTRIBUTION, ErrorCode.QUERY_PARAMETER_INVALID, 400, "invalid query parameter value",
          "A query parameter has an unrecognised or unsupported value.")
_register(DISTRIBUTION, ErrorCode.UNKNOWN, 500, "unknown error",
          "An error with no API classification.")
_register(DISTRIBUTION, ErrorCode.UNAVAILABLE, 503, "service unavailable",
          "A service is not available now (an apiserver, or the proxy's upload pool); retry later.")
_register(SERVERS, ErrorCode.INVALID_INPUT, 400, "invalid input",
          "A body, header, id, reference or query breaks a rule the message names.")
_register(SERVERS, ErrorCode.ROUTE_UNKNOWN, 404, "route unknown",
          "No such route: not a distribution API route, or not one of the server's own.")
_register(SERVERS, ErrorCode.REQUEST_TOO_LARGE, 413, "request too large",
          "A request body, or what would be kept of it, is over the server's limit.")
_register(SERVERS, ErrorCode.REQUEST_TIMEOUT, 408, "request timeout",
          "The request body stalled, or came slower than the server's minimum rate.")
_register(SERVERS, ErrorCode.HEADERS_TOO_LARGE, 431, "request header fields too large",
          "The request's head is over the server's limit.")
_register(SERVERS, ErrorCode.INTERNAL, 500, "internal error",
          "A failure of the server itself; the server's log has the traceback.")
_register(SERVERS, ErrorCode.REGISTRY_TIMEOUT, 504, "the registry timed out",
          "The registry the server reads (the proxy's upstream) did not answer in time.")
_register(SERVERS, ErrorCode.REGISTRY_UNAVAILABLE, 502, "the registry is unavailable",
          "The registry the server reads could not be reached or answered garbage.")
_register(SCHEDULER, ErrorCode.NOT_FOUND, 404, "not found",
          "No agent or placement of that id.")
_register(SCHEDULER, ErrorCode.IMAGE_UNKNOWN, 404, "image unknown",
          "The registry does not have the image a placement names.")
_register(SCHEDULER, ErrorCode.REGISTRY_DENIED, 502, "the registry refused the scheduler",
          "The registry refused the scheduler's own credentials.")
_register(SCHEDULER, ErrorCode.DATABASE_UNAVAILABLE, 503, "database unavailable",
          "The scheduler's database does not answer.")
# fmt: on


def descriptors(*groups: str) -> list[ErrorDescriptor]:
    """The descriptors of ``groups`` (all without any), by group then value."""
    wanted = groups or GROUPS
    chosen = [d for d in _DESCRIPTORS.values() if d.group in wanted]
    return sorted(chosen, key=lambda d: (GROUPS.index(d.group), d.value))


def registered(value: str | None) -> ErrorCode | None:
    """``value`` as a registered code, or ``None`` (a registry may send codes of its own)."""
    return ErrorCode(value) if value is not None and value in ErrorCode.__members__ else None


@dataclass(frozen=True)
class OciError:
    """The first error of an error body. ``code`` is as sent (a registry may send codes of
    its own); ``message`` is one line."""

    code: str | None
    message: str | None
    detail: object = None


def error_body(code: ErrorCode | str, message: str, detail: object = None) -> bytes:
    """``{"errors": [{"code", "message", "detail"}]}`` with a one-line message."""
    body = {"errors": [{"code": str(code), "message": one_line(message), "detail": detail}]}
    return json.dumps(body, sort_keys=True).encode()


def read_error(body: bytes | str) -> OciError | None:
    """The first error of ``body``, or ``None`` when it is no OCI error body (not JSON,
    over ``ERROR_BODY_LIMIT``, nested too deep, another shape). Never raises."""
    if len(body) > ERROR_BODY_LIMIT:
        return None
    try:
        data = load_json(body, "error body")
    except InvalidInputError:
        return None
    errors = data.get("errors") if isinstance(data, dict) else None
    first = errors[0] if isinstance(errors, list) and errors else None
    if not isinstance(first, dict):
        return None
    code, message = first.get("code"), first.get("message")
    return OciError(
        code if isinstance(code, str) else None,
        one_line(message) if isinstance(message, str) else None,
        first.get("detail"),
    )
