"""The token a request carries: a bearer token, or a browser's Basic password."""

from __future__ import annotations

import base64
import binascii

from starlette.requests import Request

__all__ = ["basic_token", "bearer_token"]


def bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer TOKEN``; ``None`` without one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def basic_token(request: Request) -> str | None:
    """The password of ``Authorization: Basic ...``: how a browser sends the token."""
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon and password else None
