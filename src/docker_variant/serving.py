"""Process plumbing shared by the two servers, ``variant-proxy`` and ``variant-scheduler``:
one-line argument errors (exit 2), listen addresses, a pre-bound socket (so a busy port is
reported before start-up), and JSON log lines."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import socket
import sys
from typing import Any, NoReturn

from docker_variant.errors import InvalidInputError

__all__ = [
    "LOG_LEVELS",
    "JsonFormatter",
    "ServerArgumentParser",
    "bind_socket",
    "configure_logging",
    "parse_listen",
    "seconds",
]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


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
    # httpx logs every upstream request at INFO; the access log already has one line each
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
