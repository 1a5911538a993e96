"""The error registry (``oci.errcode``): every code used in src is registered with a
description, every error answer takes its status from its code's descriptor, and the OpenAPI
documents list exactly the registry's codes."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path
from typing import get_args

import pytest
from starlette.requests import Request

import docker_variant
from docker_variant import openapi
from docker_variant.errors import InvalidInputError, UnreachableError
from docker_variant.oci.errcode import GROUPS, ErrorCode, descriptors, registered
from docker_variant.oci.errors import NotFoundError, RegistryAuthError
from docker_variant.scheduler.database import DatabaseUnavailableError
from docker_variant.server.bodies import BodyTooLargeError
from docker_variant.server.errors import handler_for, oci_error

PACKAGE = Path(docker_variant.__file__).parent


def _trees(*packages: str) -> list[tuple[Path, ast.Module]]:
    roots = [PACKAGE / p for p in packages] if packages else [PACKAGE]
    paths = sorted(p for root in roots for p in root.rglob("*.py"))
    return [(path, ast.parse(path.read_text(), str(path))) for path in paths]


def test_every_code_has_a_descriptor_with_a_status_message_and_description() -> None:
    assert {d.code for d in descriptors()} == set(ErrorCode)
    for code in ErrorCode:
        described = code.descriptor
        assert code.name == code.value == described.value  # registered() relies on it
        assert 400 <= described.status < 600, code
        assert described.message and described.description.endswith("."), code
        assert described.group in GROUPS, code
    # the distribution spec's codes keep distribution's statuses where clients rely on them
    assert ErrorCode.UNSUPPORTED.status == 405 and ErrorCode.SIZE_INVALID.status == 400


def test_every_code_used_in_src_is_registered() -> None:
    used = {
        (path.name, node.attr)
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ErrorCode"
        and not node.attr.startswith("_")
    }
    assert len(used) > 30  # the walk found the call sites
    unknown = {(name, attr) for name, attr in used if attr not in ErrorCode.__members__}
    assert not unknown


def test_an_answer_has_its_codes_status() -> None:
    for code in ErrorCode:
        answer = oci_error(code, "why")
        assert answer.status_code == code.status, code
        assert json.loads(answer.body)["errors"][0]["code"] == code.value


def test_no_server_picks_an_error_status_by_hand() -> None:
    """``oci_error`` takes no status, and the only literal statuses the servers write are
    no error bodies: health (200/503), distribution's plain 404 page off ``/v2/``, 499 for a
    caller gone, 204 for a delete."""
    literals = set()
    for path, tree in _trees("proxy", "scheduler"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in ("oci_error", "upstream_error"):
                first = node.args[0] if node.args else None
                assert not isinstance(first, ast.Constant), (path.name, node.lineno)
            for keyword in node.keywords:
                if keyword.arg == "status_code":
                    literals |= {
                        (path.name, c.value)
                        for c in ast.walk(keyword.value)
                        if isinstance(c, ast.Constant)
                    }
    assert literals == {
        ("app.py", 200),
        ("app.py", 503),
        ("app.py", 404),
        ("app.py", 204),
        ("passthrough.py", 499),
    }


def test_upstream_codes_are_read_only_when_registered() -> None:
    assert registered("DENIED") is ErrorCode.DENIED
    assert registered("ACME_QUOTA") is None and registered(None) is None


@pytest.mark.parametrize("server", get_args(openapi.Server))
def test_the_openapi_documents_list_the_registrys_codes(server: openapi.Server) -> None:
    # the file as shipped (regenerate with devtools/openapi_codes.py) and as served
    shipped = json.loads((PACKAGE / "openapi" / f"{server}.json").read_text())
    for loaded in (shipped, json.loads(openapi.document(server))):
        schema = openapi.error_code_slot(loaded)["code"]
        assert schema == openapi.error_code_schema(server), "run devtools/openapi_codes.py"
    listed = {entry["const"]: entry["description"] for entry in schema["oneOf"]}
    assert ("NOT_FOUND" in listed) is (server == "scheduler")
    for code in ("ROUTE_UNKNOWN", "REQUEST_TOO_LARGE", "UNSUPPORTED"):
        assert listed[code].startswith(f"{ErrorCode(code).status} "), code


def _status_for(exc: Exception) -> int | None:
    from docker_variant.scheduler.app import _HANDLERS

    handler = handler_for(exc, _HANDLERS)
    if handler is None:
        return None
    request = Request({"type": "http", "method": "GET", "path": "/x", "headers": []})
    return asyncio.run(handler(request, exc)).status_code


def test_the_scheduler_answers_a_subclass_by_its_own_handler() -> None:
    """Starlette picks handlers along the MRO: the subclasses the old except-chain listed
    first are still answered as themselves."""
    assert _status_for(NotFoundError("no such image")) == 404  # a RegistryError, not 503
    assert _status_for(RegistryAuthError("refused", status=401)) == 502
    assert _status_for(DatabaseUnavailableError("down")) == 503
    assert _status_for(UnreachableError("apiserver")) == 503
    assert _status_for(BodyTooLargeError("big")) == 413  # not InvalidInputError's 400
    assert _status_for(InvalidInputError("bad")) == 400
    assert _status_for(RuntimeError("bug")) is None  # Starlette's outer 500
