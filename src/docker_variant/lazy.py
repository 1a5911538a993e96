"""Lazy package attributes: a package names where each of its public names lives, and a
module is imported only when one of its names is first asked for (``import docker_variant.oci``
must not load httpx, nor ``docker_variant.docker`` the engine client)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``homes`` maps a public name to the
    submodule that defines it; each name is imported once, then kept in the package."""

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)  # asked once
        return value

    return attribute
