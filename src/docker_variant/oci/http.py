"""The one way this package makes HTTP clients: one trust policy, one User-Agent, time-outs
always set.

Every client (the registry client, the engine client, the proxy's upstream pools, the node
agent, the what-if command, ``--index URL``) is built here, so all of them trust the same
certificates (the system's store, as Docker does, plus a command's ``--ca-file`` and a
registry's own CAs where Docker keeps them), present the same client certificate when a
server asks (``--client-cert``), and say the same ``User-Agent``.
"""

from __future__ import annotations

import functools
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from docker_variant import __version__
from docker_variant.errors import InvalidInputError, UnreachableError
from docker_variant.oci.bodies import BodyLimit, read_bounded

__all__ = [
    "DEFAULT_TIMEOUT",
    "OPTION_NAMES",
    "USER_AGENT",
    "TLSFiles",
    "async_client",
    "async_transport",
    "client_tls",
    "command_tls",
    "default_tls",
    "read_response",
    "sync_client",
    "sync_transport",
    "system_tls",
    "tls_failure",
    "use_tls",
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


#: How errors name a command's TLS files: its options, the same on every command.
OPTION_NAMES = ("--ca-file", "--client-cert", "--client-key")


@dataclass(frozen=True)
class TLSFiles:
    """What a client trusts besides the system's CAs (PEM bundles) and the certificate it
    presents when a server asks for one (mutual TLS), as curl's ``--cacert``/``--cert``/
    ``--key`` and Docker's ``certs.d`` give them. ``names``: how errors name each kind of
    file (a command's options, or certs.d's files)."""

    ca_files: tuple[str, ...] = ()
    client_cert: str | None = None
    client_key: str | None = None  # None: the key is in client_cert's file, as curl allows
    names: tuple[str, str, str] = field(default=OPTION_NAMES, compare=False)

    def __bool__(self) -> bool:
        return bool(self.ca_files or self.client_cert or self.client_key)

    def describe(self) -> str:
        """Which CAs a client trusts, for a log line or an error: "the system's CAs and
        --ca-file '/etc/ssl/site.pem'"."""
        cas = " ".join(repr(p) for p in self.ca_files)
        return "the system's CAs" + (f" and {self.names[0]} {cas}" if cas else "")


def _read_pem(path: str, name: str, what: str, marker: re.Pattern[str]) -> str:
    """The text of ``path``, or one line naming it (``name``: the option or the file's role)
    and why it holds no ``what`` (PEM: a ``marker`` line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InvalidInputError(f"{name} {path!r}: cannot read it ({reason})") from None
    except UnicodeDecodeError:
        text = ""
    if not marker.search(text):
        raise InvalidInputError(f"{name} {path!r}: no PEM {what} in it (no -----BEGIN line)")
    return text


_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")


@functools.cache
def client_tls(files: TLSFiles) -> ssl.SSLContext:
    """The system's trust store plus ``files``' CAs, presenting their client certificate
    when a server asks; every file checked now (``InvalidInputError``: one line naming it).
    One context per set of files: every client of a process shares it."""
    ca_name, cert_name, key_name = files.names
    context = ssl.create_default_context()
    for path in files.ca_files:
        text = _read_pem(path, ca_name, "certificate", _CERTIFICATE)
        try:
            context.load_verify_locations(cadata=text)
        except ssl.SSLError as exc:
            raise InvalidInputError(f"{ca_name} {path!r}: not a CA bundle ({exc})") from None
    cert, key = files.client_cert, files.client_key
    if cert is None:
        if key is not None:
            raise InvalidInputError(f"{key_name} {key!r}: give {cert_name} too")
        return context
    text = _read_pem(cert, cert_name, "certificate", _CERTIFICATE)
    if key is None and not _PRIVATE_KEY.search(text):
        raise InvalidInputError(f"{cert_name} {cert!r}: no private key in it; give {key_name}")
    if key is not None:
        _read_pem(key, key_name, "private key", _PRIVATE_KEY)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise InvalidInputError(
            f"{cert_name} {cert!r} / {key_name} {key or cert!r}: the key does not fit the "
            f"certificate ({exc.reason or exc})"
        ) from None
    return context


class _CommandTLS:
    """The TLS files of the command this process runs (``use_tls``)."""

    files = TLSFiles()


def use_tls(files: TLSFiles) -> None:
    """Make ``files`` (a command's ``--ca-file``, ``--client-cert``, ``--client-key``) what
    every client this process makes from now on trusts and presents, checked now. A command
    sets it once at its start, given or not, so that nothing is left of an earlier one."""
    if files:
        client_tls(files)  # a bad file is bad input now, not at the first handshake
    _CommandTLS.files = files


def command_tls() -> TLSFiles:
    """The TLS files ``use_tls`` was given (none: the system's CAs alone)."""
    return _CommandTLS.files


def default_tls() -> ssl.SSLContext:
    """What a client trusts unless told otherwise: the command's files, else the system's."""
    files = _CommandTLS.files
    return client_tls(files) if files else system_tls()


def tls_failure(exc: BaseException) -> str | None:
    """Why a TLS handshake behind ``exc`` failed, in OpenSSL's words ("certificate verify
    failed: unable to get local issuer certificate"); None when no handshake failed."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {cause.verify_message}"
        if isinstance(cause, ssl.SSLError):
            return str(cause.reason or cause).replace("_", " ").lower()
        cause = cause.__cause__ or cause.__context__
    return None


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {"User-Agent": USER_AGENT, **(headers or {})}


def sync_transport(
    *, uds: str | None = None, tls: ssl.SSLContext | None = None, limits: httpx.Limits | None = None
) -> httpx.HTTPTransport:
    """A transport over TCP (or the Unix socket ``uds``) trusting ``tls``, else
    ``default_tls()``."""
    extra: dict[str, Any] = {"limits": limits} if limits is not None else {}
    return httpx.HTTPTransport(uds=uds, verify=tls or default_tls(), **extra)


def async_transport(
    *, tls: ssl.SSLContext | None = None, limits: httpx.Limits | None = None
) -> httpx.AsyncHTTPTransport:
    """An asyncio transport trusting ``tls``, else ``default_tls()``."""
    extra: dict[str, Any] = {"limits": limits} if limits is not None else {}
    return httpx.AsyncHTTPTransport(verify=tls or default_tls(), **extra)


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


def read_response(response: httpx.Response, limit: int, what: str) -> bytes:
    """The body of a streamed ``response``, refused (``UnreachableError``: the server
    answered garbage) once it passes ``limit`` bytes, so no answer is buffered whole."""

    def too_large(declared: str | None) -> UnreachableError:
        if declared is not None:
            return UnreachableError(
                f"{what}: an answer of {declared} bytes, over the {limit} allowed"
            )
        return UnreachableError(f"{what}: an answer over the {limit} bytes allowed")

    declared = response.headers.get("content-length")
    return read_bounded(response.iter_bytes(), BodyLimit(limit, too_large, declared=declared))
