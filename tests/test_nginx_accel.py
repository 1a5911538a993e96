"""Resolved manifests behind the shipped nginx front: variant-proxy picks the image and
answers ``X-Accel-Redirect``; nginx fetches the manifest from the registry itself. A caller
gets what variant-proxy alone answers (status, the registry's headers, the body, the label),
HEAD and GET, with and without credentials; no request from outside reaches the internal
location; no upstream answer steers the front."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

import devstack
from conftest import RunningRegistry
from fakeupstream import FakeUpstream, Reply
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest, variant_labels
from proxyrunner import FrontedProxy, ProxyServer

pytestmark = pytest.mark.e2e

REPO = "accel/app"
ACCEPT = f"{OCI_MANIFEST}, application/vnd.oci.image.index.v1+json"
CUDA_HOST = {"nvidia": {"cuda_version_lower_bound": ["12.8"]}, "x86_64": {"level": ["v1"]}}
PLAIN_HOST = {"x86_64": {"level": ["v1"]}}
# what a caller compares: the registry's headers and the proxy's own
COMPARED = ("docker-content-digest", "content-type", "content-length", "x-variant-label", "vary")
USER, PASSWORD = "alice", "accel-secret"


def _push(base_url: str, tag: str, labels: Mapping[str, str], auth: object = None) -> str:
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels}})
    push_blob(base_url, REPO, config.encode(), auth)
    return push_manifest(base_url, REPO, tag, raw_manifest(config.encode()), OCI_MANIFEST, auth)


def _publish(base_url: str, auth: object = None) -> dict[str, str]:
    """1.0 (cu128 variant and a bare image), 2.0 (cu128 only), plain (no variants)."""
    return {
        "1.0-cu128": _push(
            base_url,
            "1.0-cu128",
            variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8"),
            auth,
        ),
        "1.0": _push(base_url, "1.0", {}, auth),
        "2.0-cu128": _push(
            base_url,
            "2.0-cu128",
            variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8"),
            auth,
        ),
        "plain": _push(base_url, "plain", {}, auth),
    }


@pytest.fixture(scope="module")
def fronted(registry: RunningRegistry) -> Iterator[tuple[FrontedProxy, dict[str, str]]]:
    digests = _publish(registry.url)
    with FrontedProxy(registry.host, registry.url, cache_ttl=3600) as front:
        yield front, digests


def _headers(host: object, **more: str) -> dict[str, str]:
    text = host if isinstance(host, str) else json.dumps(host, separators=(",", ":"))
    return {"Accept": ACCEPT, "X-Variant-Properties": text, **more}


def _alike(
    front: FrontedProxy, method: str, path: str, headers: Mapping[str, str]
) -> httpx.Response:
    """The answer through the front, checked equal to variant-proxy's alone; returned."""
    alone = httpx.request(method, f"http://{front.proxy_host}{path}", headers=headers)
    through = httpx.request(method, f"{front.url}{path}", headers=headers)
    assert (through.status_code, through.content) == (alone.status_code, alone.content)
    for name in COMPARED:
        assert through.headers.get(name) == alone.headers.get(name), name
    assert not [name for name in through.headers if name.lower().startswith("x-accel")]
    return through


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_resolved_manifest_through_the_front_is_what_the_proxy_alone_answers(
    fronted: tuple[FrontedProxy, dict[str, str]], method: str
) -> None:
    front, digests = fronted
    cuda = _alike(front, method, f"/v2/{REPO}/manifests/1.0", _headers(CUDA_HOST))
    assert cuda.status_code == 200
    assert cuda.headers["docker-content-digest"] == digests["1.0-cu128"]
    assert cuda.headers["x-variant-label"] == "cu128"
    assert cuda.headers["vary"] == "X-Variant-Properties, X-Variant-Devices"
    bare = _alike(front, method, f"/v2/{REPO}/manifests/1.0", _headers(PLAIN_HOST))
    assert bare.headers["docker-content-digest"] == digests["1.0"]
    assert "x-variant-label" not in bare.headers  # the bare image has no label
    plain = _alike(front, method, f"/v2/{REPO}/manifests/plain", _headers(CUDA_HOST))
    assert plain.headers["docker-content-digest"] == digests["plain"]
    by_digest = _alike(
        front, method, f"/v2/{REPO}/manifests/{digests['2.0-cu128']}", _headers(PLAIN_HOST)
    )
    assert by_digest.headers["docker-content-digest"] == digests["2.0-cu128"]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_refusals_through_the_front_are_the_proxy_s_own(
    fronted: tuple[FrontedProxy, dict[str, str]], method: str
) -> None:
    front, _ = fronted
    no_fit = _alike(front, method, f"/v2/{REPO}/manifests/2.0", _headers(PLAIN_HOST))
    assert no_fit.status_code == 404
    bad = _alike(front, method, f"/v2/{REPO}/manifests/1.0", _headers('{"nvidia": 1}'))
    assert bad.status_code == 400
    missing = _alike(front, method, f"/v2/{REPO}/manifests/9.9", _headers(CUDA_HOST))
    assert missing.status_code == 404  # the registry's answer for a missing tag, passed on


def test_the_proxy_hands_the_front_the_digest_to_fetch(
    fronted: tuple[FrontedProxy, dict[str, str]],
) -> None:
    """What nginx gets from variant-proxy: no body, the internal path and the label."""
    front, digests = fronted
    headers = _headers(CUDA_HOST, **{"X-Variant-Front": "accel-redirect"})
    answer = httpx.get(f"http://{front.proxy_host}/v2/{REPO}/manifests/1.0", headers=headers)
    assert answer.status_code == 200 and answer.content == b""
    assert answer.headers["x-accel-redirect"] == (
        f"/_variant_manifest/v2/{REPO}/manifests/{digests['1.0-cu128']}"
    )
    assert answer.headers["x-variant-label"] == "cu128"


@pytest.mark.parametrize(
    "path",
    [
        f"/_variant_manifest/v2/{REPO}/manifests/1.0",
        f"/%5Fvariant_manifest/v2/{REPO}/manifests/1.0",
        f"/v2/../_variant_manifest/v2/{REPO}/manifests/1.0",
        f"/_variant_manifest/v2/{REPO}/blobs/sha256:{'0' * 64}",
    ],
)
def test_no_request_from_outside_reaches_the_internal_location(
    fronted: tuple[FrontedProxy, dict[str, str]], path: str
) -> None:
    front, _ = fronted
    with httpx.Client() as client:
        request = client.build_request("GET", f"{front.url}/", headers={"Accept": ACCEPT})
        request.url = request.url.copy_with(raw_path=path.encode())
        answer = client.send(request)
    assert answer.status_code in (400, 404), (path, answer.status_code)
    assert "docker-content-digest" not in answer.headers


def test_a_caller_s_own_front_header_redirects_nothing(
    fronted: tuple[FrontedProxy, dict[str, str]],
) -> None:
    """nginx replaces X-Variant-Front: a caller who sends it gets the usual answer."""
    front, digests = fronted
    headers = _headers(CUDA_HOST, **{"X-Variant-Front": "nothing"})
    answer = httpx.get(f"{front.url}/v2/{REPO}/manifests/1.0", headers=headers)
    assert answer.status_code == 200
    assert answer.headers["docker-content-digest"] == digests["1.0-cu128"]
    plain = httpx.get(f"{front.url}/v2/{REPO}/manifests/plain", headers={"Accept": ACCEPT})
    assert plain.headers["docker-content-digest"] == digests["plain"]


def test_credentials_pass_through_the_redirect(htpasswd_registry: object, tmp_path: Path) -> None:
    """A registry that needs Basic auth: the fetch nginx makes carries the caller's
    Authorization, so a caller with none is refused as the registry refuses it, and one
    with credentials gets the variant's manifest; both as variant-proxy alone answers."""
    registry: RunningRegistry = htpasswd_registry({USER: PASSWORD})  # type: ignore[operator]
    auth = (USER, PASSWORD)
    digests = _publish(registry.url, auth)
    good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    bad = "Basic " + base64.b64encode(f"{USER}:wrong".encode()).decode()
    with FrontedProxy(registry.host, registry.url, cache_ttl=3600) as front:
        path = f"/v2/{REPO}/manifests/1.0"
        for method in ("GET", "HEAD"):
            refused = _alike(front, method, path, _headers(CUDA_HOST))
            assert refused.status_code == 401
            allowed = _alike(front, method, path, _headers(CUDA_HOST, Authorization=good))
            assert allowed.status_code == 200
            assert allowed.headers["docker-content-digest"] == digests["1.0-cu128"]
            # the index is cached now: a wrong password is still refused by the registry
            wrong = _alike(front, method, path, _headers(CUDA_HOST, Authorization=bad))
            assert wrong.status_code == 401


def test_no_x_accel_header_of_an_upstream_is_passed_on(tmp_path: Path) -> None:
    """A registry answer carrying X-Accel-Redirect is relayed without it: it could otherwise
    send the front to any of its locations."""
    upstream = FakeUpstream()
    upstream.routes["/v2/"] = Reply(200, b"{}")
    upstream.routes["/v2/a/blobs/sha256:" + "0" * 64] = Reply(
        200, b"blob", {"X-Accel-Redirect": "/_variant_manifest/v2/a/manifests/x"}
    )
    upstream.start()
    try:
        with ProxyServer(upstream.url) as proxy:
            answer = httpx.get(f"{proxy.url}/v2/a/blobs/sha256:{'0' * 64}")
        assert answer.status_code == 200 and answer.content == b"blob"
        assert "x-accel-redirect" not in answer.headers
    finally:
        upstream.stop()


def test_the_shipped_front_names_the_internal_location_once() -> None:
    """The prefix variant-proxy redirects to is the location the shipped file declares."""
    from docker_variant.proxy.passthrough import ACCEL_PREFIX

    shipped = devstack.NGINX_FRONT.read_text()
    assert shipped.count(f"location ~ ^{ACCEL_PREFIX}(/v2/") == 1
    assert "proxy_set_header X-Variant-Front accel-redirect;" in shipped
