"""The deployment around variant-proxy: the shipped nginx front (``deploy/nginx/``) passes
the distribution API as the registry alone does, and a pull-through cache (distribution's
proxy mode) between the proxy and a remote registry reads each blob from the remote on its first pull only."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
import ociconformance
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest, variant_labels
from proxyrunner import eventually

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, devstack.Service]]:
    """A registry, variant-proxy in front of it, and the nginx front before both."""
    root = tmp_path_factory.mktemp("front")
    registry = devstack.start_registry(root / "registry")
    proxy = devstack.start_proxy(registry.url, root / "proxy")
    front = devstack.start_nginx_front(registry.address, proxy.address, root / "nginx")
    yield {"registry": registry, "proxy": proxy, "nginx": front}
    for service in (front, proxy, registry):
        service.stop()


def test_conformance_fails_nothing_the_registry_passes(
    deployment: dict[str, devstack.Service],
) -> None:
    results = {
        name: ociconformance.run(service.url, f"conformance/{name}")
        for name, service in deployment.items()
    }
    direct = results["registry"]
    passed = sorted(check for check, outcome in direct.items() if outcome == "pass")
    assert len(passed) >= 14, direct  # the registry itself passes the workflows
    for name in ("proxy", "nginx"):
        lost = {check: results[name][check] for check in passed if results[name][check] != "pass"}
        assert not lost, f"through {name}: {lost}"


def test_a_pull_through_cache_behind_the_proxy_reads_the_remote_once(tmp_path: Path) -> None:
    remote = devstack.start_registry(tmp_path / "remote", access_log=True)
    mirror = devstack.start_registry(tmp_path / "mirror", remote=remote.url)
    proxy = devstack.start_proxy(mirror.url, tmp_path / "proxy")
    try:
        config = b'{"architecture": "amd64", "os": "linux", "config": {"Labels": %s}}'
        labels = variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8")
        body = config % json.dumps(labels).encode()
        layer = b"layer bytes " * 1000
        push_blob(remote.url, "far/app", body)
        digest = push_blob(remote.url, "far/app", layer)
        push_manifest(remote.url, "far/app", "1.0-cu128", raw_manifest(body, [layer]), OCI_MANIFEST)
        index = httpx.get(f"{proxy.url}/v2/far/app/_variants/1.0", timeout=30)
        assert index.status_code == 200, index.text
        assert list(index.json()["variants"]) == ["cu128"]
        hexdigest = digest.removeprefix("sha256:")
        # distribution commits a fetched blob in two steps, the data file and then the
        # repository's link, and serves it from its own storage only once the link exists
        link = mirror.root / "storage/docker/registry/v2/repositories/far/app/_layers/sha256"
        blob_path = f"/v2/far/app/blobs/{digest}"
        got = httpx.get(f"{proxy.url}{blob_path}", timeout=30)  # the first node's pull
        assert got.status_code == 200 and got.content == layer
        eventually(lambda: (link / hexdigest / "link").exists(), 20, "the blob stored")
        # Stopped, the remote has logged every read it served (a count taken while it runs
        # may miss the line of a read still finishing); the later pulls cannot reach it.
        remote.stop()
        first = devstack.registry_requests(remote).count(blob_path)
        # distribution's first fetch may read the remote twice (the caller's stream and the
        # copy it stores)
        assert 1 <= first <= 2
        for _node in range(2):  # two more nodes pull the layer: the mirror alone serves it
            got = httpx.get(f"{proxy.url}{blob_path}", timeout=30)
            assert got.status_code == 200 and got.content == layer
    finally:
        for service in (proxy, mirror, remote):
            service.stop()


def test_the_front_refuses_a_head_flood_and_times_what_the_proxy_times(
    deployment: dict[str, devstack.Service],
) -> None:
    """The shipped front bounds a request head (4 x 64k, the proxy's limit) and times heads,
    bodies and idle connections as variant-proxy does; a 100 MiB head is refused at once."""
    from docker_variant.proxy.__main__ import LIMITS

    text = devstack.NGINX_FRONT.read_text()
    assert f"client_header_timeout {LIMITS.head_timeout:g}s;" in text
    assert f"client_body_timeout {LIMITS.body_timeout:g}s;" in text
    assert f"keepalive_timeout {LIMITS.keep_alive:g}s;" in text
    assert "large_client_header_buffers 4 64k;" in text and LIMITS.max_head_bytes == 4 << 16
    assert "reset_timedout_connection on;" in text
    host, port = deployment["nginx"].address.rsplit(":", 1)
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v2/ HTTP/1.1\r\nHost: p\r\n")
        try:
            for _ in range(1600):  # 100 MiB of small header fields
                sock.sendall(b"X-A: b\r\n" * 8192)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := sock.recv(65536):
                answer += chunk
    # nginx's 400 (Request Header Or Cookie Too Large), or a reset that took it along
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert httpx.get(f"{deployment['nginx'].url}/healthz", timeout=10).status_code == 200
