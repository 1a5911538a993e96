"""``variant-proxy --upstream URL [--listen HOST:PORT]``: run the proxy under uvicorn.

Bad arguments (a bad URL, a bad or busy listen address) end with one line on stderr and
exit code 2, never a traceback.

``--help`` and ``--version`` load argparse and this package's option helpers only
(tests/test_startup_imports.py): uvicorn, Starlette, httpx and the app are imported by
``main`` once the arguments are read.
"""

from __future__ import annotations

import argparse
import os
import sys

from docker_variant.errors import InvalidInputError
from docker_variant.proxy.limits import (
    DEFAULT_CACHE_TTL,
    DEFAULT_UPSTREAM_TIMEOUT,
    ProxyLimits,
    names,
    parse_limit,
)
from docker_variant.server.options import (
    ServerArgumentParser,
    add_connection_limit_arguments,
    add_duration_argument,
    add_listen_argument,
    add_log_level_argument,
    add_tls_arguments,
    add_version_argument,
    tls_options,
)

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    from typing import Any

    import uvicorn
    from starlette.applications import Starlette

    from docker_variant.server.limits import ConnectionLimits

__all__ = ["main", "parse_arguments", "serve", "server_config"]

DEFAULT_LISTEN = "127.0.0.1:5080"
#: The proxy's connection limits beyond ``ConnectionLimits``' defaults (``LIMITS``). A head
#: may carry a 64 KiB X-Variant-Properties; the nginx front takes 4 x 64k of header lines.
MAX_HEAD_BYTES = 256 << 10
KEEP_ALIVE = 30.0
CACHE_ENV = "VARIANT_PROXY_CACHE"
NOTIFY_ENV = "VARIANT_PROXY_NOTIFY_SECRET"


def _notify_secret(path: str | None) -> str | None:
    if path is None:
        return os.environ.get(NOTIFY_ENV) or None
    from pathlib import Path

    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"--notify-secret-file {path!r}: cannot read it ({exc})") from exc
    if len(secret) < 16:
        raise InvalidInputError(f"--notify-secret-file {path!r}: use at least 16 characters")
    return secret


def _parser() -> argparse.ArgumentParser:
    parser = ServerArgumentParser(
        prog="variant-proxy",
        description="OCI registry proxy that adds the PEP 817/825 _variants extension "
        "and X-Variant-Properties manifest resolution to an upstream registry.",
    )
    parser.add_argument("--upstream", required=True, metavar="URL", help="upstream registry")
    add_listen_argument(parser, DEFAULT_LISTEN)
    add_duration_argument(
        parser,
        "--cache-ttl",
        what="cache TTL",
        strict=False,
        default=DEFAULT_CACHE_TTL,
        help="how long an index may be served from the cache (default %(default)g; 0: never)",
    )
    add_duration_argument(
        parser,
        "--upstream-timeout",
        what="upstream timeout",
        strict=True,
        default=DEFAULT_UPSTREAM_TIMEOUT,
        help="deadline for an index scan and for upstream response headers "
        "(default %(default)g; blob bodies are never timed)",
    )
    add_log_level_argument(parser)
    parser.add_argument(
        "--cache",
        default=os.environ.get(CACHE_ENV),
        metavar="URL",
        help=f"redis://HOST:PORT[/DB]: share the index cache with other replicas "
        f"(default ${CACHE_ENV}; none: this process only)",
    )
    parser.add_argument(
        "--notify-secret-file",
        metavar="FILE",
        help="enable POST /_notify for the registry's notification webhook; callers send "
        f"'Authorization: Bearer <the file's content>' (or set ${NOTIFY_ENV})",
    )
    defaults = ProxyLimits()
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change one bound, repeatable; NAME (default): "
        + ", ".join(f"{n} ({getattr(defaults, n.replace('-', '_'))})" for n in names())
        + "; see docs/security.md",
    )
    add_tls_arguments(parser, client_ca=False)
    add_connection_limit_arguments(parser, max_head_bytes=MAX_HEAD_BYTES, keep_alive=KEEP_ALIVE)
    add_version_argument(parser)
    return parser


def __getattr__(name: str) -> ConnectionLimits:
    """``LIMITS``, the proxy's ``ConnectionLimits``, made when first asked for: their module
    loads uvicorn, which ``--help`` does without."""
    if name != "LIMITS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from docker_variant.server.limits import ConnectionLimits

    return ConnectionLimits(max_head_bytes=MAX_HEAD_BYTES, keep_alive=KEEP_ALIVE)


def _logs_info(level: str) -> bool:
    import logging

    return logging.getLevelName(level.upper()) in (logging.DEBUG, logging.INFO)


def server_config(
    app: Starlette, log_level: str = "info", limits: ConnectionLimits | None = None, **tls: Any
) -> uvicorn.Config:
    """How the proxy runs under uvicorn (also used by the tests); ``tls``: ``tls_options``;
    ``limits``: ``LIMITS`` when not given."""
    from docker_variant.server.serve import uvicorn_config

    return uvicorn_config(
        app,
        log_level,
        limits if limits is not None else __getattr__("LIMITS"),
        access_log=False,  # AccessLog writes one JSON line per request instead
        lifespan="on",
        date_header=False,  # pass the upstream's Date; AccessLog adds ours where none
        **tls,
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    return serve(parser, parser.parse_args(argv))


def parse_arguments(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and what it read: ``--help`` and ``--version`` end here, before anything
    the proxy runs on is imported (``extras.proxy_main`` then checks the extra)."""
    parser = _parser()
    return parser, parser.parse_args(argv)


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the proxy the arguments describe, importing what it runs on only now."""
    from docker_variant.proxy.app import check_upstream_url, create_app
    from docker_variant.proxy.metrics import AccessLines
    from docker_variant.server import serve as server
    from docker_variant.server.limits import ConnectionLimits
    from docker_variant.server.net import parse_listen

    try:
        upstream = check_upstream_url(args.upstream)
        host, port = parse_listen(args.listen)
        tls = tls_options(args)
        secret = _notify_secret(args.notify_secret_file)
        limits = ProxyLimits()
        for text in args.limit:
            limits = parse_limit(limits, text)
        app = create_app(
            upstream,
            args.cache_ttl,
            upstream_timeout=args.upstream_timeout,
            cache_url=args.cache,
            notify_secret=secret,
            limits=limits,
            # the access log straight to stderr in batches, when INFO lines are wanted
            access_lines=AccessLines(sys.stderr) if _logs_info(args.log_level) else None,
        )
    except InvalidInputError as exc:
        parser.error(str(exc))
    config = server_config(app, args.log_level, ConnectionLimits.from_args(args), **tls)
    details = f" for {upstream}, cache {'shared (Redis)' if args.cache else 'local'}"
    return server.serve(
        config,
        args.listen,
        (host, port),
        program="variant-proxy",
        details=details,
        error=parser.error,
    )


if __name__ == "__main__":
    sys.exit(main())
