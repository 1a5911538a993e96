"""The one way this package makes HTTP clients: one trust policy, one User-Agent, time-outs
always set.

Every client (the registry client, the engine client, the proxy's upstream pools, the node
agent, the what-if command, ``--index URL``) is built here, so all of them trust the same
certificates (the system's store, as Docker does, plus a registry's own CAs where Docker
keeps them) and say the same ``User-Agent``.
"""

from __future__ import annotations

import functools
import ssl
import threading
from collections.abc import Mapping
from typing import Any

import httpx

from docker_variant import __version__
from docker_variant.errors import InvalidInputError, UnreachableError
from docker_variant.numtext import is_number

__all__ = [
    "DEFAULT_TIMEOUT",
    "USER_AGENT",
    "async_client",
    "async_transport",
    "read_bounded",
    "sync_client",
    "sync_transport",
    "system_tls",
    "tls_with",
]

USER_AGENT = f"docker-variant/{__version__}"
#: Seconds for connecting, each read and each write, unless a caller says otherwise.
DEFAULT_TIMEOUT = 30.0


class _DeferredTrustContext(ssl.SSLContext):
    """A client context whose trust store is loaded by its first TLS handshake.

    Reading the system's CA certificates is not free. A loopback registry spoken to over
    plain HTTP, and the engine's socket, never shake hands, so they never pay it; a redirect
    to HTTPS (blobs on a CDN) or an HTTPS proxy still verifies as usual. httpcore and
    asyncio start every handshake through ``wrap_socket`` (sync) or ``wrap_bio``."""

    _trust_loaded = False
    _trust_lock = threading.Lock()

    def _load_trust(self) -> None:
        if not self._trust_loaded:
            with self._trust_lock:
                if not self._trust_loaded:
                    self.load_default_certs(ssl.Purpose.SERVER_AUTH)
                    self._trust_loaded = True

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self._load_trust()
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self._load_trust()
        return super().wrap_bio(*args, **kwargs)


@functools.cache
def system_tls() -> ssl.SSLContext:
    """The system's trust store, as Docker uses, read only when a connection first uses
    TLS. One per process: every client shares it."""
    # PROTOCOL_TLS_CLIENT verifies certificates and host names, as create_default_context does
    return _DeferredTrustContext(ssl.PROTOCOL_TLS_CLIENT)


@functools.cache
def tls_with(cafiles: tuple[str, ...]) -> ssl.SSLContext:
    """The system's trust store plus a registry's own CAs (``certs.d/<host>/*.crt``)."""
    context = ssl.create_default_context()
    for cafile in cafiles:
        try:
            context.load_verify_locations(cafile)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInputError(f"CA certificate {cafile!r}: cannot load it ({exc})") from exc
    return context


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {"User-Agent": USER_AGENT, **(headers or {})}


def sync_transport(
    *, uds: str | None = None, tls: ssl.SSLContext | None = None, limits: httpx.Limits | None = None
) -> httpx.HTTPTransport:
    """A transport over TCP (or the Unix socket ``uds``) trusting ``tls`` or the system."""
    extra: dict[str, Any] = {"limits": limits} if limits is not None else {}
    return httpx.HTTPTransport(uds=uds, verify=tls or system_tls(), **extra)


def async_transport(
    *, tls: ssl.SSLContext | None = None, limits: httpx.Limits | None = None
) -> httpx.AsyncHTTPTransport:
    """An asyncio transport trusting ``tls`` or the system."""
    extra: dict[str, Any] = {"limits": limits} if limits is not None else {}
    return httpx.AsyncHTTPTransport(verify=tls or system_tls(), **extra)


def sync_client(
    *,
    base_url: str = "",
    timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
    transport: httpx.BaseTransport | None = None,
    auth: httpx.Auth | None = None,
    follow_redirects: bool = False,
) -> httpx.Client:
    """A client with the package's trust, User-Agent and ``timeout``; ``transport`` (else
    ``sync_transport(tls=tls)``) carries its requests."""
    return httpx.Client(
        base_url=base_url,
        auth=auth,
        headers=_headers(headers),
        timeout=timeout,
        follow_redirects=follow_redirects,
        transport=transport or sync_transport(tls=tls),
    )


def async_client(
    *,
    base_url: str = "",
    timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    limits: httpx.Limits | None = None,
    auth: httpx.Auth | None = None,
    follow_redirects: bool = False,
) -> httpx.AsyncClient:
    """An asyncio client with the package's trust, User-Agent and ``timeout``;
    ``transport`` (else ``async_transport(tls=tls, limits=limits)``) carries its requests."""
    return httpx.AsyncClient(
        base_url=base_url,
        auth=auth,
        headers=_headers(headers),
        timeout=timeout,
        follow_redirects=follow_redirects,
        transport=transport or async_transport(tls=tls, limits=limits),
    )


def read_bounded(response: httpx.Response, limit: int, what: str) -> bytes:
    """The body of a streamed ``response``, refused (``UnreachableError``: the server
    answered garbage) once it passes ``limit`` bytes, so no answer is buffered whole."""
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and (not is_number(declared) or int(declared) > limit):
        raise UnreachableError(f"{what}: an answer of {declared} bytes, over the {limit} allowed")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise UnreachableError(f"{what}: an answer over the {limit} bytes allowed")
    return bytes(body)
