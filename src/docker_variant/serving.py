"""Plumbing shared by the two servers, ``variant-proxy`` and ``variant-scheduler``: one-line
argument errors (exit 2), listen addresses, a pre-bound socket (so a busy port is reported
before start-up), JSON log lines, and the OCI error body both answer with."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import socket
import ssl
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import httpx
from starlette.requests import Request
from starlette.responses import Response

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    UpstreamUnavailableError,
)
from docker_variant.oci.reference import is_loopback as registry_is_loopback

__all__ = [
    "JSON",
    "LOG_LEVELS",
    "BodyTooLargeError",
    "JsonFormatter",
    "ServerArgumentParser",
    "add_tls_arguments",
    "bearer_token",
    "bind_socket",
    "configure_logging",
    "error_kind",
    "is_loopback",
    "oci_error",
    "parse_listen",
    "read_body",
    "seconds",
    "timed_out",
    "tls_options",
]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
JSON = "application/json"


def oci_error(
    status: int,
    code: str,
    message: str,
    detail: object = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """``{"errors": [{"code", "message", "detail"}]}``, the distribution spec's error body."""
    body = {"errors": [{"code": code, "message": one_line(message), "detail": detail}]}
    return Response(
        json.dumps(body, sort_keys=True).encode(),
        status_code=status,
        headers=dict(headers or {}),
        media_type=JSON,
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (``InvalidInputError``) past ``limit`` bytes: a declared
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


class BodyTooLargeError(InvalidInputError):
    """A request body over its limit (HTTP 413)."""


def bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer TOKEN``; ``None`` without one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def timed_out(exc: BaseException) -> bool:
    # RegistryClient raises UpstreamUnavailableError "from" the httpx time-out; there is
    # no attribute that says "timed out", so follow the explicit causes.
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx.TimeoutException | TimeoutError):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def error_kind(exc: BaseException) -> str:
    """A short label for metrics: timeout, unreachable, bad_response, auth, not_found..."""
    if timed_out(exc):
        return "timeout"
    if isinstance(exc, RegistryAuthError):
        return "auth"
    if isinstance(exc, NotFoundError):
        return "not_found"
    if isinstance(exc, BadUpstreamResponseError):
        return "bad_response"
    if isinstance(exc, UpstreamUnavailableError):
        return "unreachable" if exc.status is None else "upstream_status"
    return "error"


class ServerArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, not argparse's usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port)."""
    host, colon, port_text = text.rpartition(":")
    if not colon or not host:
        raise InvalidInputError(f"invalid listen address {text!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise InvalidInputError(f"invalid listen address {text!r}: {exc}") from exc
    elif ":" in host:
        raise InvalidInputError(
            f"invalid listen address {text!r}: write an IPv6 host in brackets, e.g. [::1]:5080"
        )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidInputError(
            f"invalid listen address {text!r}: port {port_text!r} is not a number 0-65535"
        )
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen host) is reachable from this machine only."""
    return registry_is_loopback(f"[{host}]" if ":" in host else host)


def add_tls_arguments(parser: argparse.ArgumentParser, *, client_ca: bool) -> None:
    parser.add_argument(
        "--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)"
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    if client_ca:
        parser.add_argument(
            "--tls-client-ca",
            metavar="FILE",
            help="mutual TLS: require client certificates signed by this CA (PEM)",
        )


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn ``Config`` keywords for ``--tls-cert``/``--tls-key``/``--tls-client-ca``,
    checked now (``InvalidInputError`` naming the file) rather than at the first handshake."""
    cert, key = args.tls_cert, args.tls_key
    client_ca = getattr(args, "tls_client_ca", None)
    if (cert is None) != (key is None):
        raise InvalidInputError("--tls-cert and --tls-key go together")
    if cert is None:
        if client_ca is not None:
            raise InvalidInputError("--tls-client-ca needs --tls-cert and --tls-key")
        return {}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInputError(f"--tls-cert {cert!r} / --tls-key {key!r}: {exc}") from exc
    options: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    if client_ca is not None:
        try:
            context.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInputError(f"--tls-client-ca {client_ca!r}: {exc}") from exc
        options |= {"ssl_ca_certs": client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def seconds(what: str, minimum: float, strict: bool) -> type[float]:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not a number") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            raise argparse.ArgumentTypeError(f"{what} must be {bound} seconds, got {text!r}")
        return value

    convert.__name__ = what
    return convert  # type: ignore[return-value]


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class JsonFormatter(logging.Formatter):
    """One JSON object per line; request fields come in through ``extra={"fields": ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            text = self.formatException(record.exc_info)
            entry["error"] = text.splitlines()[-1]
            entry["traceback"] = text  # still one line: JSON escapes the newlines
        return json.dumps(entry, sort_keys=True)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Nothing here logs the caller's file and line, thread or process: not looking them up
    # saves a third of each access log line's cost (the logging HOWTO's "Optimization").
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # httpx logs every upstream request at INFO; the access log already has one line each
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
