"""The OCI error registry: every error code this package sends or reads, with its usual HTTP
status, one writer of the error body and one reader that never raises.

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

__all__ = ["ERROR_BODY_LIMIT", "ErrorCode", "OciError", "error_body", "read_error"]

#: Enough of an error body to find its first error; the rest is never read.
ERROR_BODY_LIMIT = 64 << 10


class ErrorCode(StrEnum):
    """An error code and, as ``status``, the HTTP status it is usually sent with."""

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
    UNKNOWN = "UNKNOWN"
    UNAVAILABLE = "UNAVAILABLE"
    # The scheduler's.
    NOT_FOUND = "NOT_FOUND"
    INVALID_INPUT = "INVALID_INPUT"
    INTERNAL = "INTERNAL"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    IMAGE_UNKNOWN = "IMAGE_UNKNOWN"
    REGISTRY_TIMEOUT = "REGISTRY_TIMEOUT"
    REGISTRY_DENIED = "REGISTRY_DENIED"
    REGISTRY_UNAVAILABLE = "REGISTRY_UNAVAILABLE"

    @property
    def status(self) -> int:
        return _STATUS[self]


_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BLOB_UNKNOWN: 404,
    ErrorCode.BLOB_UPLOAD_INVALID: 400,
    ErrorCode.BLOB_UPLOAD_UNKNOWN: 404,
    ErrorCode.DIGEST_INVALID: 400,
    ErrorCode.MANIFEST_BLOB_UNKNOWN: 404,
    ErrorCode.MANIFEST_INVALID: 400,
    ErrorCode.MANIFEST_UNKNOWN: 404,
    ErrorCode.NAME_INVALID: 400,
    ErrorCode.NAME_UNKNOWN: 404,
    ErrorCode.SIZE_INVALID: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.DENIED: 403,
    ErrorCode.UNSUPPORTED: 405,
    ErrorCode.TOOMANYREQUESTS: 429,
    ErrorCode.TAG_INVALID: 400,
    ErrorCode.UNKNOWN: 500,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.DATABASE_UNAVAILABLE: 503,
    ErrorCode.IMAGE_UNKNOWN: 404,
    ErrorCode.REGISTRY_TIMEOUT: 504,
    ErrorCode.REGISTRY_DENIED: 502,
    ErrorCode.REGISTRY_UNAVAILABLE: 502,
}


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
