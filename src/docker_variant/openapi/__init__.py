"""The OpenAPI 3.1 documents of the servers' own HTTP APIs, shipped as package data and
served at ``GET /openapi.json`` by ``variant-scheduler serve`` and ``variant-proxy``."""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Literal

from docker_variant import __version__
from docker_variant.jsondoc import load_json

__all__ = ["Server", "document"]

Server = Literal["scheduler", "proxy"]


@functools.cache
def document(server: Server) -> bytes:
    """``server``'s document as JSON bytes, its ``info.version`` this package's version."""
    source = files(__package__).joinpath(f"{server}.json")
    loaded = load_json(source.read_bytes(), f"OpenAPI document {server}.json", max_depth=64)
    loaded["info"]["version"] = __version__
    return json.dumps(loaded, separators=(",", ":")).encode()
