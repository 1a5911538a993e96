"""The OpenAPI 3.1 documents of the servers' own HTTP APIs, shipped as package data and
served at ``GET /openapi.json`` by ``variant-scheduler serve`` and ``variant-proxy``.

Their ``ErrorBody.code`` is the error registry's (``oci.errcode``): ``error_code_schema``
writes it, ``devtools/openapi_codes.py`` puts it in the JSON files, and a test fails when
they drift."""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Any, Literal

from docker_variant import __version__
from docker_variant.jsondoc import load_json
from docker_variant.oci.errcode import DISTRIBUTION, SCHEDULER, SERVERS, SPEC, descriptors

__all__ = ["CODE_GROUPS", "Server", "document", "error_code_schema", "error_code_slot"]

Server = Literal["scheduler", "proxy"]

#: The error code groups each server's answers may carry (the proxy's include the
#: upstream registry's, passed on).
CODE_GROUPS: dict[Server, tuple[str, ...]] = {
    "proxy": (SPEC, DISTRIBUTION, SERVERS),
    "scheduler": (SPEC, DISTRIBUTION, SERVERS, SCHEDULER),
}


def error_code_schema(server: Server) -> dict[str, object]:
    """``ErrorBody``'s ``code``: one ``const`` a registered code, with its status and
    description."""
    return {
        "type": "string",
        "description": "The error code; each one is always sent with the same HTTP status.",
        "oneOf": [
            {"const": d.value, "description": f"{d.status} {d.message}: {d.description}"}
            for d in descriptors(*CODE_GROUPS[server])
        ],
    }


def error_code_slot(loaded: dict[str, Any]) -> dict[str, Any]:
    """The properties of ``ErrorBody``'s items in a loaded document, where ``code`` is."""
    body = loaded["components"]["schemas"]["ErrorBody"]
    properties: dict[str, Any] = body["properties"]["errors"]["items"]["properties"]
    return properties


@functools.cache
def document(server: Server) -> bytes:
    """``server``'s document as JSON bytes, its ``info.version`` this package's version."""
    source = files(__package__).joinpath(f"{server}.json")
    loaded = load_json(source.read_bytes(), f"OpenAPI document {server}.json", max_depth=64)
    loaded["info"]["version"] = __version__
    return json.dumps(loaded, separators=(",", ":")).encode()
