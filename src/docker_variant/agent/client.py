"""Talking to a scheduler as its clients do (the node agent, ``variant-scheduler what-if``):
its base URL and the bearer token file, checked once."""

from __future__ import annotations

from pathlib import Path

import httpx

from docker_variant.errors import InvalidInputError

__all__ = ["check_scheduler_url", "read_token"]


def check_scheduler_url(text: str) -> str:
    """``http(s)://HOST[:PORT][/PREFIX]``, without a trailing slash."""
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as exc:
        raise InvalidInputError(f"--scheduler {text!r}: not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidInputError(
            f"--scheduler {text!r}: expected http://HOST:PORT or https://HOST:PORT"
        )
    if url.query or url.fragment:
        raise InvalidInputError(f"--scheduler {text!r}: a base URL has no query or fragment")
    return str(url).rstrip("/")


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace ignored)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise InvalidInputError(f"--token-file {str(path)!r}: cannot read it ({reason})") from None
    if not token or any(c.isspace() for c in token):
        raise InvalidInputError(
            f"--token-file {str(path)!r}: expected one token (no spaces), "
            + ("the file is empty" if not token else "found whitespace inside")
        )
    return token
