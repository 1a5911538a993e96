"""The OpenAPI documents (``docker_variant/openapi/``) against the running servers: every
answer schemathesis provokes, and the documented refusals provoked on purpose, must have a
documented status, content type and body shape.

The scheduler runs as its own process (``variant-scheduler serve`` with tokens); the proxy in
this process's thread in front of Debian's registry."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conftest import RunningRegistry
from docker_variant import __version__, openapi
from imaging import push_raw_image
from proxyrunner import ProxyServer, eventually

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 8  # per operation: CI stays short; each run draws new ones
TOKENS = {
    "admin": "admin-token-0123456789",
    "client": "client-token-0123456789",
    "agent": "agent-token-0123456789",
    "wrong": "wrong-token-0123456789",
}  # fmt: skip (the last is in no tokens file)
NOTIFY_SECRET = "notify-secret-0123456789"
INDEX = json.loads((Path(__file__).parent.parent / "examples/pytorch-2.12.0.json").read_text())
HOST = json.loads((Path(__file__).parent.parent / "examples/hosts/h200-r570.json").read_text())


def _fuzz(schema: Any, headers: dict[str, str] | None = None) -> list[str]:
    """``EXAMPLES`` generated requests per documented operation, each answer checked;
    returns the operations run (so that a test sees none was left out)."""
    labels = []
    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS)

        run()
    return labels


def _schema(server: openapi.Server, base_url: str) -> Any:
    schema = schemathesis.openapi.from_dict(json.loads(openapi.document(server)))
    schema.config.update(base_url=base_url)
    schema.config.generation.update(modes=[GenerationMode.POSITIVE], max_examples=EXAMPLES)
    return schema


# ------------------------------------------------------------------------------ scheduler


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``variant-scheduler serve`` with admin, client and agent tokens, on SQLite."""
    root = tmp_path_factory.mktemp("openapi-scheduler")
    tokens = root / "tokens.toml"
    tokens.write_text(
        f'[[token]]\nrole = "admin"\nname = "ops"\ntoken = "{TOKENS["admin"]}"\n'
        f'[[token]]\nrole = "client"\nname = "ci"\ntoken = "{TOKENS["client"]}"\n'
        f'[[token]]\nrole = "agent"\nagent_id = "h200-a"\ntoken = "{TOKENS["agent"]}"\n'
    )
    port = _free_port()
    argv = [sys.executable, "-m", "docker_variant.scheduler", "serve", "--log-level",
            "warning", "--db", f"sqlite:///{root / 's.db'}", "--listen",
            f"127.0.0.1:{port}", "--tokens", str(tokens)]  # fmt: skip
    log = (root / "scheduler.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert process.poll() is None, (root / "scheduler.log").read_text()
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(answers, 30, "variant-scheduler serve answering /healthz")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def test_scheduler_answers_as_documented(scheduler: str) -> None:
    labels = _fuzz(_schema("scheduler", scheduler), _bearer("admin"))
    assert "POST /v1/placements" in labels and "POST /v1/what-if" in labels
    assert len(labels) == 15, labels


def _validate(schema: Any, path: str, method: str, response: httpx.Response) -> None:
    schema[path][method].validate_response(response)


def test_scheduler_documented_answers(scheduler: str) -> None:
    """Each documented shape provoked once: 200/201/204, 401 (no token, a wrong one), 403
    (a wrong role), 404, 409 (cannot be placed; nothing to replace), 400, and /openapi.json
    itself."""
    schema = _schema("scheduler", scheduler)
    heartbeat = {"resource_group": "gpu", "host": {"x86_64": HOST["x86_64"]},
                 "devices": {"nvidia": {"GPU-0": {"nvidia": HOST["nvidia"]}}},
                 "platform": "linux/amd64", "capacity": {"nvidia": {"GPU-0": 2}},
                 "unhealthy": {"nvidia": []}}  # fmt: skip
    with httpx.Client(base_url=scheduler, timeout=30) as http:
        seen: list[tuple[str, str, httpx.Response]] = []

        def call(method: str, path: str, doc_path: str, role: str | None, **kw: Any) -> int:
            headers = _bearer(role) if role else {}
            response = http.request(method, path, headers=headers, **kw)
            seen.append((doc_path, method, response))
            return response.status_code

        agent = "/v1/agents/{agent_id}"
        placements, one = "/v1/placements", "/v1/placements/{placement_id}"
        assert call("PUT", "/v1/agents/h200-a", agent, "agent", json=heartbeat) == 200
        assert call("PUT", "/v1/agents/h200-b", agent, "agent", json=heartbeat) == 403
        assert call("PUT", "/v1/agents/h200-a", agent, None, json=heartbeat) == 401
        assert call("PUT", "/v1/agents/h200-a", agent, "wrong", json=heartbeat) == 401
        assert call("PUT", "/v1/agents/h200-a", agent, "agent", json={"hots": {}}) == 400
        assert call("GET", "/v1/agents", "/v1/agents", "client") == 200
        assert call("GET", "/v1/agents/h200-a", agent, "client") == 200
        assert call("GET", "/v1/agents/nobody", agent, "client") == 404
        request = {"index": INDEX, "nodes": 1, "devices_per_node": 1, "shares_per_device": 0.5}
        assert call("POST", placements, placements, "client", json=request) == 201
        placement_id = seen[-1][2].json()["id"]
        assert call("POST", placements, placements, "agent", json=request) == 403
        assert call("POST", placements, placements, "client", json={**request, "nodes": 3}) == 409
        assert call("GET", f"{placements}?state=active", placements, "client") == 200
        assert call("GET", f"{placements}?state=gone", placements, "client") == 400
        assert call("GET", f"{placements}/{placement_id}", one, "client") == 200
        replace = "/v1/placements/{placement_id}/replace"
        assert call("POST", f"{placements}/{placement_id}/replace", replace, "client") == 409
        question = {"request": {"index": INDEX, "nodes": 2, "devices_per_node": 1},
                    "templates": [{"name": "h200", "host": {"x86_64": HOST["x86_64"]},
                                   "devices": {"nvidia": {"GPU-0": {"nvidia": HOST["nvidia"]}}},
                                   "cost": 1}]}  # fmt: skip
        assert call("POST", "/v1/what-if", "/v1/what-if", "client", json=question) == 200
        assert seen[-1][2].json()["options"][0]["template"] == "h200"
        assert call("DELETE", f"{placements}/{placement_id}", one, "client") == 204
        assert call("GET", f"{placements}/{'0' * 32}", one, "client") == 404
        assert call("DELETE", "/v1/agents/h200-a", agent, "client") == 403
        assert call("DELETE", "/v1/agents/h200-a", agent, "admin") == 200
        assert call("GET", "/metrics", "/metrics", None) == 401
        assert call("GET", "/metrics", "/metrics", "client") == 200
        assert call("GET", "/healthz", "/healthz", None) == 200
        assert call("GET", "/openapi.json", "/openapi.json", None) == 200
    for doc_path, method, response in seen:
        _validate(schema, doc_path, method, response)
    assert seen[-1][2].json()["info"]["version"] == __version__
    unauthorized = [r for _, _, r in seen if r.status_code == 401]
    assert all(r.headers["WWW-Authenticate"].startswith("Bearer") for r in unauthorized)


# ---------------------------------------------------------------------------------- proxy

REPO = "openapi/app"


@pytest.fixture(scope="module")
def proxy(registry: RunningRegistry) -> Iterator[ProxyServer]:
    """The proxy with notifications on, in front of a registry holding one variant version."""

    def labels(label: str, **props: str) -> bytes:
        config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers",
                  "diff_ids": []}, "config": {"Labels": {"dev.pep817.variant-label": label,
                  **{f"dev.pep817.variant.{k.replace('__', '.')}": v for k, v in props.items()}}}}  # fmt: skip
        return json.dumps(config).encode()

    push_raw_image(registry.url, REPO, "1.0.0-cu128", labels("cu128", nvidia__sm_arch="90_real"))
    push_raw_image(registry.url, REPO, "1.0.0-null", labels("null"))
    with ProxyServer(registry.url, notify_secret=NOTIFY_SECRET) as running:
        yield running


def test_proxy_answers_as_documented(proxy: ProxyServer) -> None:
    labels = _fuzz(_schema("proxy", proxy.url))
    assert "GET /v2/{name}/_variants/{version}" in labels and "POST /_notify" in labels
    assert len(labels) == 8, labels


def test_proxy_documented_answers(proxy: ProxyServer) -> None:
    """_variants (200, 404 for a version without images and for a repository, 400), X-Variant-Properties resolution (200 with the label, 400,
    404 with reasons), discovery, /_notify (200, 401, 400), /healthz both ways, /metrics."""
    schema = _schema("proxy", proxy.url)
    host = json.dumps({"nvidia": {"sm_arch": ["90_real"]}, "x86_64": {"level": ["v1"]}})
    cpu_only = json.dumps({"x86_64": {"level": ["v1"]}})
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    variants, manifests = "/v2/{name}/_variants/{version}", "/v2/{name}/manifests/{version}"
    notify_ok = {"Authorization": f"Bearer {NOTIFY_SECRET}"}
    event = {"events": [{"action": "push", "target": {"repository": REPO}}]}
    calls: list[tuple[str, str, str, dict[str, str], Any, int]] = [
        ("GET", f"/v2/{REPO}/_variants/1.0.0", variants, {}, None, 200),
        ("GET", f"/v2/{REPO}/_variants/9.9", variants, {}, None, 404),  # no images
        ("GET", "/v2/openapi/nothing/_variants/1.0.0", variants, {}, None, 404),
        ("GET", f"/v2/{REPO}/_variants/bad%20tag", variants, {}, None, 400),
        ("GET", f"/v2/{REPO}/manifests/1.0.0", manifests,
         {"X-Variant-Properties": host, **accept}, None, 200),
        ("GET", f"/v2/{REPO}/manifests/1.0.0", manifests,
         {"X-Variant-Properties": "{not json", **accept}, None, 400),
        ("GET", f"/v2/{REPO}/manifests/1.0.0", manifests,
         {"X-Variant-Properties": cpu_only, **accept}, None, 200),
        ("GET", "/v2/_oci/ext/discover", "/v2/_oci/ext/discover", {}, None, 200),
        ("POST", "/_notify", "/_notify", notify_ok, event, 200),
        ("POST", "/_notify", "/_notify", {}, event, 401),
        ("POST", "/_notify", "/_notify", notify_ok, {"events": "none"}, 400),
        ("GET", "/healthz", "/healthz", {}, None, 200),
        ("GET", "/healthz?upstream=1", "/healthz", {}, None, 200),
        ("GET", "/metrics", "/metrics", {}, None, 200),
        ("GET", "/openapi.json", "/openapi.json", {}, None, 200),
    ]  # fmt: skip
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        for method, path, doc_path, headers, body, status in calls:
            response = http.request(method, path, headers=headers, json=body)
            assert response.status_code == status, (path, response.text)
            schema[doc_path][method].validate_response(response)
            if path.startswith(f"/v2/{REPO}/manifests") and status == 200:
                label = response.headers["X-Variant-Label"]
                assert label == ("cu128" if "nvidia" in headers["X-Variant-Properties"] else "null")
            if path.endswith("/_variants/9.9"):
                assert response.json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"
                assert "no image tagged 9.9 or 9.9-<label>" in response.text
            if doc_path == "/_notify" and status == 200:
                assert response.json() == {"invalidated": [REPO]}
