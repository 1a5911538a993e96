"""Listen addresses: parsing ``HOST:PORT``, the loopback test, and a socket bound before the
server starts (so a busy port is told as a bad argument, not a start-up failure)."""

from __future__ import annotations

import ipaddress
import socket

from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import is_loopback as registry_is_loopback

__all__ = ["bind_socket", "is_loopback", "parse_listen"]


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
