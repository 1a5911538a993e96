"""How both servers start: one uvicorn configuration, a socket bound before start-up (a
busy port is a bad argument, exit 2), JSON logs, one line saying what listens where, and
a clean stop on Ctrl-C."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

import uvicorn
from starlette.types import ASGIApp

from docker_variant import __version__
from docker_variant.server.limits import ConnectionLimits, limited, uvicorn_limits
from docker_variant.server.logs import configure_logging
from docker_variant.server.net import bind_socket

__all__ = ["serve", "uvicorn_config"]


def uvicorn_config(
    app: ASGIApp, log_level: str, limits: ConnectionLimits, **options: Any
) -> uvicorn.Config:
    """``app`` under uvicorn within ``limits``: our JSON logging (not uvicorn's), no
    ``Server`` header; ``options``: the server's own (``tls_options``, lifespan, ...)."""
    return uvicorn.Config(
        limited(app, limits),
        log_config=None,  # our JSON logging (server.logs)
        log_level=log_level,
        server_header=False,
        **uvicorn_limits(limits),  # clients pulling layer after layer reuse connections
        **options,
    )


def serve(
    config: uvicorn.Config,
    listen: str,
    address: tuple[str, int],
    *,
    program: str,
    details: str,
    error: Callable[[str], NoReturn],
    close: Callable[[], object] = lambda: None,
) -> int:
    """Run ``config`` on ``address`` (``listen`` as given: for the error) until stopped,
    saying so in one log line: ``program``, its version, where it listens and ``details``
    (", database ..."). ``close`` runs after the server stopped or could not listen; a
    busy or bad address is ``error``."""
    try:
        sock = bind_socket(*address)
    except (OSError, OverflowError) as exc:
        close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        error(f"cannot listen on {listen}: {reason}")
    configure_logging(str(config.log_level))
    host, port = sock.getsockname()[:2]
    logger = logging.getLogger(f"docker_variant.{program.removeprefix('variant-')}")
    logger.info("%s %s on %s:%s%s", program, __version__, host, port, details)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        close()
    return 0
