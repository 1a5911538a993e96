"""The bearer token a request carries."""

from __future__ import annotations

from starlette.requests import Request

__all__ = ["bearer_token"]


def bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer TOKEN``; ``None`` without one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
