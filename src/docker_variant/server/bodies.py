"""Request bodies read with a size bound (``oci.bodies``, the one bounded reader)."""

from __future__ import annotations

from starlette.requests import Request

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.numtext import header_number
from docker_variant.oci.bodies import BodyLimit, aread_bounded

__all__ = ["BodyTooLargeError", "read_body"]


class BodyTooLargeError(InvalidInputError):
    """A request body over its limit (HTTP 413)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (``BodyTooLargeError``) past ``limit`` bytes: a declared
    ``Content-Length`` over it (or no number: RFC 9110's ASCII digits) before anything is
    read, else as soon as the stream passes it, so no body over its limit is ever held
    whole."""
    declared = request.headers.get("content-length")
    if declared is not None and header_number(declared) is None:
        shown = one_line(declared, 40)
        raise BodyTooLargeError(f"Content-Length {shown!r} is not a number (ASCII digits)")

    def too_large(declared: str | None) -> BodyTooLargeError:
        if declared is not None:
            return BodyTooLargeError(
                f"request body of {declared} bytes is over the {limit} allowed"
            )
        return BodyTooLargeError(f"request body is over the {limit} bytes allowed")

    return await aread_bounded(request.stream(), BodyLimit(limit, too_large, declared=declared))
