"""Talking to a scheduler as its clients do (the node agent, ``variant-scheduler what-if``):
its base URL and the bearer token file, checked once, and why a connection failed."""

from __future__ import annotations

from pathlib import Path

import httpx

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.oci.http import command_tls, tls_failure

__all__ = ["check_scheduler_url", "read_token", "scheduler_failure"]


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


def scheduler_failure(exc: httpx.HTTPError, scheduler: str) -> str:
    """Why a request to ``scheduler`` got no answer, in one line; a failed TLS handshake
    says which CAs were trusted and which options fix it."""
    files = command_tls()
    handshake = tls_failure(exc)
    why = one_line(str(exc)) or type(exc).__name__
    if handshake is None:
        # over TLS 1.3 a server that wants a client certificate hangs up after the handshake
        hung_up = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
        if hung_up and scheduler.startswith("https:") and files.client_cert is None:
            return (
                f"{why} (if it asks for a client certificate, --tls-client-ca: give --client-cert)"
            )
        return why
    if "certificate verify failed" in handshake:
        hint = f"trusting {files.describe()}; give --ca-file with the CA of its certificate"
    elif files.client_cert is None:
        hint = "if it asks for a client certificate, --tls-client-ca: give --client-cert"
    else:
        hint = f"did it refuse --client-cert {files.client_cert!r}?"
    return f"TLS: {handshake} ({hint})"
