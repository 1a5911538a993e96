"""Request bodies read with a size bound."""

from __future__ import annotations

from starlette.requests import Request

from docker_variant.errors import InvalidInputError

__all__ = ["BodyTooLargeError", "read_body"]


class BodyTooLargeError(InvalidInputError):
    """A request body over its limit (HTTP 413)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (``BodyTooLargeError``) past ``limit`` bytes: a declared
    ``Content-Length`` over it before anything is read, else as soon as the stream passes
    it, so no body over its limit is ever held whole."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BodyTooLargeError(
            f"request body of {declared} bytes is over the {limit} allowed"
            if declared.isdigit()
            else f"Content-Length {declared!r} is not a number"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"request body is over the {limit} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)
