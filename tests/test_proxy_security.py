"""variant-proxy as an attacker and a careless user meet it: no-cache storms, upstream
addresses kept out of answers, malformed references, TLS end to end."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

import devstack
from conftest import start_registry
from fakeupstream import FakeUpstream, Reply
from imaging import ImageBuilder, variant_labels
from proxyrunner import ProxyServer

pytestmark = pytest.mark.e2e


def test_a_no_cache_storm_costs_one_scan_per_version(
    tmp_path: Path, image_builder: ImageBuilder
) -> None:
    start_registry(tmp_path / "probe").service.stop()
    upstream = devstack.start_registry(tmp_path / "counted", access_log=True)
    proxy = devstack.start_proxy(upstream.url, tmp_path / "proxy", cache_ttl=300)
    try:
        versions = ["1.0", "2.0"]
        for version in versions:
            for label, level in [("v1", "v1"), ("v2", "v2"), ("v3", "v3")]:
                image_builder.build_and_push(
                    f"{upstream.address}/storm/app:{version}-{label}",
                    variant_labels(label, x86_64__level=level),
                )
        before = len(devstack.registry_requests(upstream))

        async def storm() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                calls = [
                    client.get(
                        f"{proxy.url}/v2/storm/app/_variants/{version}",
                        headers={"Cache-Control": "no-cache"},
                    )
                    for version in versions
                    for _ in range(20)
                ]
                return [r.status_code for r in await asyncio.gather(*calls)]

        assert asyncio.run(storm()) == [200] * 40
        upstream_requests = devstack.registry_requests(upstream)[before:]
        per_scan = 1 + 1 + 2 * 3  # VERSION probe, tag list, manifest and config per variant
        assert len(upstream_requests) <= 2 * per_scan * len(versions), upstream_requests
    finally:
        proxy.stop()
        upstream.stop()


def test_upstream_addresses_never_reach_callers(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    dead = f"127.0.0.1:{devstack.free_port()}"
    fake_upstream.routes["/v2/g/app/tags/list"] = Reply(200, b"<html>not json</html>")
    for upstream in (f"http://{dead}", fake_upstream.url):
        proxy = devstack.start_proxy(
            upstream, tmp_path / f"p{len(upstream)}", extra=["--upstream-timeout", "2"]
        )
        try:
            answers = [
                httpx.get(f"{proxy.url}/v2/g/app/_variants/1.0"),
                httpx.get(f"{proxy.url}/v2/g/app/manifests/1.0"),
                httpx.get(f"{proxy.url}/v2/g/app/blobs/sha256:{'a' * 64}"),
            ]
            health = httpx.get(f"{proxy.url}/healthz?upstream=1")
        finally:
            proxy.stop()
        host = upstream.removeprefix("http://")
        # the health probe answers anyone: whether the upstream answers, never where it is
        assert health.status_code == 503, health.text  # the fake has no /v2/ (404)
        assert host not in health.text and str(host.rsplit(":", 1)[1]) not in health.text
        assert set(health.json()["upstream"]) <= {"reachable", "status", "error", "latency_ms"}
        for answer in answers:
            assert answer.status_code in (404, 502, 504), answer.text
            assert host not in answer.text and str(host.rsplit(":", 1)[1]) not in answer.text
            if answer.status_code >= 500:
                assert answer.json()["errors"][0]["message"]
        assert host in proxy.log_tail(200_000)  # the operator still sees it


def test_a_malformed_manifest_reference_is_404_and_traversal_400(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    proxy = devstack.start_proxy(fake_upstream.url, tmp_path / "p")
    try:
        for method in ("GET", "HEAD"):
            answer = httpx.request(method, f"{proxy.url}/v2/a/manifests/.INVALID_MANIFEST_NAME")
            assert answer.status_code == 404
            if method == "GET":
                assert answer.json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"
        traversal = httpx.get(f"{proxy.url}/v2/a/manifests/..%2f..%2fx")
        assert traversal.status_code == 400
    finally:
        proxy.stop()
    assert fake_upstream.requests == []


def test_pull_through_the_proxy_over_https(tmp_path: Path, image_builder: ImageBuilder) -> None:
    """`docker variant pull` through variant-proxy over HTTPS, the CA trusted as Docker's
    certs.d says; a client that does not trust it is refused."""
    from tlsca import CertificateAuthority

    for tool in ("docker", "dockerd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.server()
    with devstack.local_stack("dv-tls-", proxy=False) as stack:
        port = devstack.free_port()
        proxy = devstack.start_proxy(
            stack.registry.url,
            stack.root / "proxy",
            port=port,
            extra=["--tls-cert", str(server.cert), "--tls-key", str(server.key)],
            scheme="https",
        )
        try:
            env = stack.client_env()
            image_builder.build_and_push(
                f"{stack.registry.address}/tls/app:1.0-v1", variant_labels("v1", x86_64__level="v1")
            )
            ref = f"{proxy.address}/tls/app:1.0"
            # the CA, where Docker and docker-variant look for a registry's CA
            certs = Path(env["DOCKER_CONFIG"]) / "certs.d" / proxy.address
            certs.mkdir(parents=True)
            shutil.copy(ca.ca, certs / "ca.crt")
            subprocess.run(["docker-variant", "install-plugin"], env=env, check=True)
            done = subprocess.run(
                ["docker", "variant", "pull", ref], env=env, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert (
                done.stdout.splitlines()[0]
                == f'Selected variant "v1" of {proxy.address}/tls/app version 1.0'
            )
            shutil.rmtree(certs)
            untrusted = subprocess.run(
                ["docker-variant", "resolve", ref], env=env, capture_output=True, text=True
            )
            assert untrusted.returncode == 3  # plain HTTP to a TLS port: refused
            assert untrusted.stderr.count("\n") == 1 and "Traceback" not in untrusted.stderr
        finally:
            proxy.stop()


@pytest.mark.parametrize(
    "body",
    [
        b'{"events": [1]}',
        b'{"events": [null]}',
        b'{"events": ["push"]}',
        b'{"events": [{"target": {"repository": "x"}}]}',
        b'{"events": [{"action": 7, "target": {"repository": "x"}}]}',
        b'{"events": [{"action": "push"}]}',
        b'{"events": [{"action": "push", "target": 5}]}',
        b'{"events": [{"action": "push", "target": {"repository": ["x"]}}]}',
        b'{"events": [{"action": "delete", "target": {"repository": ""}}]}',
        b'{"events": [{"action": "push", "target": {"repository": "Not/A:Name"}}]}',
        b'{"events": {"action": "push"}}',
        b"[]",
        b"not json",
    ],
)
def test_a_malformed_notification_is_400_with_one_line(
    fake_upstream: FakeUpstream, body: bytes
) -> None:
    secret = "s" * 24
    with ProxyServer(fake_upstream.url, notify_secret=secret) as proxy:
        answer = httpx.post(
            f"{proxy.url}/_notify",
            content=body,
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        )
        assert answer.status_code == 400, answer.text
        (error,) = answer.json()["errors"]
        assert error["code"] == "INVALID_INPUT" and "\n" not in error["message"]
        assert proxy.sample("variant_proxy_cache_invalidations_total") == 0
        # a well-formed one still works; actions other than push and delete are ignored
        fine = b'{"events": [{"action": "pull", "target": {}}, {"action": "push", "target": {"repository": "a/b"}}]}'
        answer = httpx.post(
            f"{proxy.url}/_notify", content=fine, headers={"Authorization": f"Bearer {secret}"}
        )
        assert answer.status_code == 200 and answer.json() == {"invalidated": ["a/b"]}
    assert fake_upstream.requests == []
