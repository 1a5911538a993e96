"""The optional parts of the install and what each needs: the bare install is the CLI (and the
Docker plugin); ``[proxy]`` brings what ``variant-proxy`` runs on, ``[scheduler]`` what
``variant-scheduler serve`` runs on, ``[kubernetes]`` the Kubernetes client the node agent
labels its Node with, ``[server]`` all three.

A server command started without its extra ends with one line naming the extra to install and
exit code 2 (bad input: the install is incomplete), never an ``ImportError`` traceback, once
its arguments are read (``--help`` and ``--version`` need no extra). The check looks the
modules up without importing them, so it costs no start-up time; this module loads nothing
for ``--help`` either (no dataclasses, no importlib.util until the check).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["KUBERNETES", "PROXY", "SCHEDULER", "Extra", "proxy_main"]


class Extra:
    """An optional part of the install: its name, as in ``pip install
    'docker-variant[NAME]'``, and the top-level modules it brings."""

    __slots__ = ("modules", "name")

    def __init__(self, name: str, modules: tuple[str, ...]) -> None:
        self.name = name
        self.modules = modules

    def missing(self) -> list[str]:
        import importlib.util

        return [m for m in self.modules if importlib.util.find_spec(m) is None]

    def require(self, program: str) -> None:
        """Exit 2 with one line when a module of the extra is not installed."""
        if missing := self.missing():
            print(
                f"{program}: needs the [{self.name}] extra ({', '.join(missing)} not "
                f"installed): pip install 'docker-variant[{self.name}]'",
                file=sys.stderr,
            )
            raise SystemExit(2)


PROXY = Extra("proxy", ("uvicorn", "starlette", "prometheus_client", "redis"))
SCHEDULER = Extra(
    "scheduler", ("uvicorn", "starlette", "jinja2", "prometheus_client", "sqlalchemy", "psycopg")
)
KUBERNETES = Extra("kubernetes", ("lightkube",))


def proxy_main(argv: Sequence[str] | None = None) -> int:
    """``variant-proxy``: reads its arguments, checks its extra, then runs it."""
    from docker_variant.proxy.__main__ import parse_arguments, serve

    parser, args = parse_arguments(None if argv is None else list(argv))
    PROXY.require("variant-proxy")  # not for --help and --version
    return serve(parser, args)
