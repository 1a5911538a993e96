"""The command-line options both servers (and the node agent) share, defined once: the
listen address, durations in seconds, the log level, TLS files and ``--version``; and a
parser whose errors are one line with exit code 2."""

from __future__ import annotations

import argparse
import math
import os
import sys

from docker_variant import __version__
from docker_variant.errors import InvalidInputError

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    from typing import Any, NoReturn

__all__ = [
    "LOG_LEVELS",
    "ServerArgumentParser",
    "add_client_tls_arguments",
    "add_connection_limit_arguments",
    "add_duration_argument",
    "add_listen_argument",
    "add_log_level_argument",
    "add_tls_arguments",
    "add_version_argument",
    "count",
    "seconds",
    "tls_options",
    "use_client_tls",
]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The connection limits' defaults (``server.limits``) that both servers share.
MAX_HEADER_FIELDS = 256
HEAD_TIMEOUT = 30.0
BODY_TIMEOUT = 60.0
MIN_BODY_RATE = 1024
MAX_CONNECTIONS = 1000


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` (``$COLUMNS``, else stdout's terminal, else 80)
    without importing shutil, which brings bz2, lzma and fnmatch: 4 ms of ``--help``."""
    try:
        if (columns := int(os.environ.get("COLUMNS", "0"))) > 0:
            return columns
    except ValueError:
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _HelpFormatter(argparse.HelpFormatter):
    def __init__(self, prog: str, **options: Any) -> None:
        # argparse's own width rule (the terminal's, less 2), handed in so that it needs no shutil
        options.setdefault("width", _terminal_columns() - 2)
        super().__init__(prog, **options)


class ServerArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **options: Any) -> None:
        options.setdefault("formatter_class", _HelpFormatter)  # subcommands' parsers too
        super().__init__(*args, **options)

    def error(self, message: str) -> NoReturn:
        # one line, not argparse's usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def seconds(what: str, minimum: float, strict: bool) -> type[float]:
    """An argparse ``type``: a finite number of seconds ``>= minimum`` (``> minimum`` when
    ``strict``), else an error naming ``what``."""

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


def count(what: str, minimum: int) -> type[int]:
    """An argparse ``type``: a whole number ``>= minimum``, else an error naming ``what``."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {text!r}")
        return value

    convert.__name__ = what
    return convert  # type: ignore[return-value]


def add_connection_limit_arguments(
    parser: argparse.ArgumentParser, *, max_head_bytes: int, keep_alive: float
) -> None:
    """What one connection may cost the server (``server.limits``: the head's size and
    fields, how long a head and a body may take, idle keep-alive, connections at once)."""
    parser.add_argument(
        "--max-head-bytes",
        type=count("max head bytes", 1024),
        default=max_head_bytes,
        metavar="BYTES",
        help="a request head (request line and header fields) over this is refused with 431 "
        "(default %(default)d)",
    )
    parser.add_argument(
        "--max-header-fields",
        type=count("max header fields", 1),
        default=MAX_HEADER_FIELDS,
        metavar="N",
        help="a request with more header fields is refused with 400 (default %(default)d)",
    )
    add_duration_argument(
        parser,
        "--head-timeout",
        what="head timeout",
        strict=True,
        default=HEAD_TIMEOUT,
        help="close a connection whose request head is not whole this long after its first "
        "byte, or after the connection opened (default %(default)g)",
    )
    add_duration_argument(
        parser,
        "--body-timeout",
        what="body timeout",
        strict=True,
        default=BODY_TIMEOUT,
        help="answer 408 and close when a request body is silent this long, or comes slower "
        "than --min-body-rate after that long (default %(default)g)",
    )
    parser.add_argument(
        "--min-body-rate",
        type=count("min body rate", 0),
        default=MIN_BODY_RATE,
        metavar="BYTES_PER_S",
        help="the least average rate of a request body past --body-timeout (default "
        "%(default)d; 0: silences alone are timed)",
    )
    add_duration_argument(
        parser,
        "--keep-alive",
        what="keep-alive",
        strict=False,
        default=keep_alive,
        help="close a connection idle this long between requests (default %(default)g)",
    )
    parser.add_argument(
        "--max-connections",
        type=count("max connections", 1),
        default=MAX_CONNECTIONS,
        metavar="N",
        help="with this many connections or requests open, new requests get 503 "
        "(default %(default)d)",
    )


def add_listen_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """``--listen HOST:PORT`` (checked later by ``net.parse_listen``)."""
    parser.add_argument(
        "--listen",
        default=default,
        metavar="HOST:PORT",
        help=f"address to listen on (default {default})",
    )


def add_duration_argument(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    what: str,
    default: float,
    help: str,
    strict: bool,
    minimum: float = 0,
) -> None:
    """``flag SECONDS``: a duration (see ``seconds``); ``help`` may use ``%(default)g``."""
    parser.add_argument(
        flag,
        type=seconds(what, minimum, strict=strict),
        default=default,
        metavar="SECONDS",
        help=help,
    )


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="default %(default)s"
    )


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


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


def add_client_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ca-file``, ``--client-cert``, ``--client-key``: a scheduler's clients (the agent,
    ``what-if``) as the CLI's registry commands and curl take them."""
    parser.add_argument(
        "--ca-file",
        metavar="FILE",
        help="also trust the CAs in FILE (PEM), e.g. the private CA of the scheduler's certificate",
    )
    parser.add_argument(
        "--client-cert",
        metavar="FILE",
        help="present this certificate (PEM) when the scheduler asks (its --tls-client-ca)",
    )
    parser.add_argument(
        "--client-key",
        metavar="FILE",
        help="the --client-cert's private key (PEM; default: in the certificate's file)",
    )


def use_client_tls(args: argparse.Namespace) -> None:
    """Make ``add_client_tls_arguments``' files every client's in this process, checked now
    (``InvalidInputError`` naming the file)."""
    from docker_variant.oci.http import TLSFiles, use_tls

    ca = args.ca_file
    use_tls(TLSFiles(() if ca is None else (ca,), args.client_cert, args.client_key))


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
    import ssl  # here: ``--help`` and the agent's parser need no TLS (about 10 ms)

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
