"""The optional parts of the install and what each needs: the bare install is the CLI (and the
Docker plugin); ``[proxy]`` brings what ``variant-proxy`` runs on, ``[scheduler]`` what
``variant-scheduler serve`` runs on, ``[kubernetes]`` the Kubernetes client the node agent
labels its Node with, ``[server]`` all three.

A server command started without its extra ends with one line naming the extra to install and
exit code 2 (bad input: the install is incomplete), never an ``ImportError`` traceback. The
check looks the modules up without importing them, so it costs no start-up time.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KUBERNETES", "PROXY", "SCHEDULER", "Extra", "proxy_main"]


@dataclass(frozen=True)
class Extra:
    name: str  # as in pip install 'docker-variant[NAME]'
    modules: tuple[str, ...]  # top-level modules it brings

    def missing(self) -> list[str]:
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
    """``variant-proxy``: checks its extra, then runs it."""
    PROXY.require("variant-proxy")
    from docker_variant.proxy.__main__ import main

    return main(None if argv is None else list(argv))
