"""The proxy's ``_variants`` extension and transparent resolution, against a real registry."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import pytest

from conftest import RunningRegistry
from docker_variant.oci import RegistryClient, scan_index_sync
from docker_variant.variant import VariantIndex, select
from fakeupstream import FakeUpstream, Reply, Seen
from imaging import (
    OCI_MANIFEST,
    ImageBuilder,
    push_raw_image,
    raw_manifest,
    sha256_digest,
    variant_labels,
)
from proxyrunner import FRONTS, FrontedProxy, ProxyServer, eventually, proxy_for

pytestmark = pytest.mark.e2e

REPO = "pv/app"
ACCEPT = {"Accept": f"{OCI_MANIFEST}, application/vnd.oci.image.index.v1+json"}
ORDER = "dev.pep817.default-priorities.namespace"


def _expected(base_url: str, repository: str, version: str, **kwargs: Any) -> bytes:
    index = scan_index_sync(base_url, repository, version, **kwargs)
    return json.dumps(index.to_json(), sort_keys=True).encode()


@pytest.fixture(scope="module")
def images(registry: RunningRegistry, image_builder: ImageBuilder) -> dict[str, str]:
    """Repository pv/app: version 1.0.0 with variants, null, bare, invalid and garbage
    images; 2.0 with one variant and no bare image. Returns tag -> digest."""
    dest = f"{registry.host}/{REPO}"
    pushed = {
        "1.0.0": image_builder.build_and_push(f"{dest}:1.0.0", {}, layers=2),
        "1.0.0-cu128": image_builder.build_and_push(
            f"{dest}:1.0.0-cu128",
            {
                **variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8"),
                ORDER: "nvidia,x86_64",
            },
        ),
        "1.0.0-cu126": image_builder.build_and_push(
            f"{dest}:1.0.0-cu126", variant_labels("cu126", nvidia__cuda_version_lower_bound="12.6")
        ),
        "1.0.0-v3": image_builder.build_and_push(
            f"{dest}:1.0.0-v3", variant_labels("v3", x86_64__level="v3")
        ),
        "1.0.0-null": image_builder.build_and_push(f"{dest}:1.0.0-null", variant_labels("null")),
        "1.0.0-bad": image_builder.build_and_push(
            f"{dest}:1.0.0-bad", variant_labels("bad", nvidia__sm_arch="9.0 ")
        ),
        # another version that shares the prefix: not part of 1.0.0
        "1.0.0-ubuntu24.04": image_builder.build_and_push(f"{dest}:1.0.0-ubuntu24.04", {}),
        "2.0-cu128": image_builder.build_and_push(
            f"{dest}:2.0-cu128", variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8")
        ),
        "plain": image_builder.build_and_push(f"{dest}:plain", {}),
    }
    # a config that is not JSON: listed under "invalid", never breaks the index
    pushed["1.0.0-garbage"] = push_raw_image(registry.url, REPO, "1.0.0-garbage", b"<html>")
    return pushed


@pytest.fixture(scope="module", params=FRONTS)
def proxy(registry: RunningRegistry, request: pytest.FixtureRequest) -> Iterator[ProxyServer]:
    """The proxy alone, and behind the shipped nginx front."""
    with proxy_for(registry.host, registry.url, request.param, cache_ttl=3600) as running:
        yield running


@pytest.mark.parametrize("version", ["1.0.0", "2.0", "plain"])
def test_variants_equals_client_scan(
    registry: RunningRegistry, proxy: ProxyServer, images: dict[str, str], version: str
) -> None:
    expected = _expected(registry.url, REPO, version)
    for _ in range(2):  # a miss, then a hit: the same bytes
        answer = httpx.get(f"{proxy.url}/v2/{REPO}/_variants/{version}")
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.content == expected


def test_a_version_without_images_is_404_as_a_missing_tag(
    registry: RunningRegistry, proxy: ProxyServer, images: dict[str, str]
) -> None:
    """The client's scan finds nothing for 9.9; the proxy answers what a registry answers
    for the manifest of a missing tag, a miss and a (cached) hit alike."""
    assert json.loads(_expected(registry.url, REPO, "9.9"))["variants"] == {}
    for _ in range(2):
        answer = httpx.get(f"{proxy.url}/v2/{REPO}/_variants/9.9")
        assert answer.status_code == 404, answer.text
        (error,) = answer.json()["errors"]
        assert error["code"] == "MANIFEST_UNKNOWN"
        assert error["message"] == f"{REPO}: no image tagged 9.9 or 9.9-<label>"


def test_variants_document_content(proxy: ProxyServer, images: dict[str, str]) -> None:
    hits = proxy.sample("variant_proxy_cache_hits_total")
    doc = httpx.get(f"{proxy.url}/v2/{REPO}/_variants/1.0.0").json()
    assert set(doc["variants"]) == {"cu128", "cu126", "v3", "null"}
    assert doc["default-priorities"] == {"namespace": ["nvidia", "x86_64"]}
    cu128, bare = images["1.0.0-cu128"], images["1.0.0"]
    assert doc["images"]["cu128"] == {
        "tag": "1.0.0-cu128",
        "digest": cu128,
        "platforms": {"linux/amd64": cu128},
    }
    assert doc["bare"] == {"tag": "1.0.0", "digest": bare, "platforms": {"linux/amd64": bare}}
    invalid = {i["tag"]: i["error"] for i in doc["invalid"]}
    assert set(invalid) == {"1.0.0-bad", "1.0.0-garbage"}
    assert "sm_arch" in invalid["1.0.0-bad"]
    assert "not JSON" in invalid["1.0.0-garbage"]
    # the path says which request; never the upstream's address
    assert f"/v2/{REPO}/blobs/" in invalid["1.0.0-garbage"] and "127.0.0.1" not in str(doc)
    # the client library reads the proxy's document as the same index
    index = asyncio.run(_via_client(proxy.url, REPO, "1.0.0"))
    assert index is not None and index.to_json() == doc
    assert proxy.sample("variant_proxy_cache_hits_total") >= hits + 1
    assert proxy.sample("variant_proxy_variants_seconds_count") >= 1


async def _via_client(url: str, repository: str, version: str) -> VariantIndex | None:
    async with RegistryClient(url) as client:
        return await client.get_variant_index(repository, version)


def test_unknown_repository_is_the_upstreams_404(proxy: ProxyServer) -> None:
    answer = httpx.get(f"{proxy.url}/v2/pv/none/_variants/1.0")
    assert answer.status_code == 404
    assert answer.json()["errors"][0]["code"] == "NAME_UNKNOWN"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/v2/PV/app/_variants/1.0.0", "NAME_INVALID"),
        ("/v2/pv/../app/_variants/1.0.0", "NAME_INVALID"),
        ("/v2/pv/%2e%2e/app/_variants/1.0.0", "NAME_INVALID"),
        ("/v2/pv/%2E/_variants/1.0.0", "NAME_INVALID"),
        ("/v2/pv//app/_variants/1.0.0", "NAME_INVALID"),
        ("/v2/pv/app/_variants/-1", "TAG_INVALID"),
        ("/v2/pv/app/_variants/a%2fb", "TAG_INVALID"),
    ],
)
def test_invalid_names_and_versions(proxy: ProxyServer, path: str, code: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    connection.request("GET", path)  # sent exactly as written, no normalisation
    answer = connection.getresponse()
    body = json.loads(answer.read())
    connection.close()
    assert answer.status == 400
    assert body["errors"][0]["code"] == code
    assert body["errors"][0]["message"]


def test_methods_other_than_get_are_refused(proxy: ProxyServer) -> None:
    assert httpx.delete(f"{proxy.url}/v2/{REPO}/_variants/1.0.0").status_code == 405


# --- transparent resolution -----------------------------------------------------------------


def _resolve(
    proxy: ProxyServer, version: str, host: Mapping[str, Any], method: str = "HEAD"
) -> httpx.Response:
    headers = {**ACCEPT, "X-Variant-Properties": json.dumps(host, separators=(",", ":"))}
    return httpx.request(method, f"{proxy.url}/v2/{REPO}/manifests/{version}", headers=headers)


@pytest.mark.parametrize(
    ("host", "label", "tag"),
    [
        ({"nvidia": {"cuda_version_lower_bound": ["12.8", "12.6"]}}, "cu128", "1.0.0-cu128"),
        ({"nvidia": {"cuda_version_lower_bound": ["12.6", "12.8"]}}, "cu126", "1.0.0-cu126"),
        ({"nvidia": {"cuda_version_lower_bound": ["12.6"]}}, "cu126", "1.0.0-cu126"),
        (
            {"nvidia": {"cuda_version_lower_bound": ["12.6"]}, "x86_64": {"level": ["v3"]}},
            "cu126",  # nvidia ranks before x86_64
            "1.0.0-cu126",
        ),
        ({"x86_64": {"level": ["v4", "v3"]}}, "v3", "1.0.0-v3"),
        ({}, "null", "1.0.0-null"),
    ],
)
def test_transparent_resolution(
    registry: RunningRegistry,
    proxy: ProxyServer,
    images: dict[str, str],
    host: dict[str, dict[str, list[str]]],
    label: str,
    tag: str,
) -> None:
    index = scan_index_sync(registry.url, REPO, "1.0.0")
    best = select(index, host).best
    assert best is not None and best.label == label  # the library agrees
    head = _resolve(proxy, "1.0.0", host)
    assert head.status_code == 200, head.text
    assert head.headers["x-variant-label"] == label
    assert head.headers["docker-content-digest"] == images[tag]
    assert head.content == b""
    got = _resolve(proxy, "1.0.0", host, "GET")
    assert got.status_code == 200
    assert got.headers["x-variant-label"] == label
    assert sha256_digest(got.content) == images[tag]
    assert got.headers["content-type"] == OCI_MANIFEST
    # containerd's next step: GET by the digest it was given, header still attached
    by_digest = _resolve(proxy, images[tag], host, "GET")
    assert by_digest.status_code == 200 and by_digest.content == got.content
    assert "x-variant-label" not in by_digest.headers


def test_without_header_is_plain_pass_through(proxy: ProxyServer, images: dict[str, str]) -> None:
    answer = httpx.head(f"{proxy.url}/v2/{REPO}/manifests/1.0.0", headers=ACCEPT)
    assert answer.headers["docker-content-digest"] == images["1.0.0"]
    assert "x-variant-label" not in answer.headers


def test_bare_image_has_no_label_header(proxy: ProxyServer, images: dict[str, str]) -> None:
    answer = _resolve(proxy, "plain", {"nvidia": {"sm_arch": ["90_real"]}})
    assert answer.status_code == 200
    assert answer.headers["docker-content-digest"] == images["plain"]
    assert "x-variant-label" not in answer.headers


def test_version_without_images_passes_through(proxy: ProxyServer, images: dict[str, str]) -> None:
    answer = _resolve(proxy, "9.9", {}, "GET")
    assert answer.status_code == 404
    assert answer.json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"  # the registry's own


def test_no_compatible_variant(proxy: ProxyServer, images: dict[str, str]) -> None:
    answer = _resolve(proxy, "2.0", {"x86_64": {"level": ["v2"]}}, "GET")
    assert answer.status_code == 404
    error = answer.json()["errors"][0]
    assert error["code"] == "MANIFEST_UNKNOWN"
    assert "cu128" in error["message"] and "nvidia" in error["message"]
    assert "\n" not in error["message"]


@pytest.mark.parametrize(
    "header",
    [
        "{not json",
        "[]",
        '{"nvidia": {"sm_arch": "90_real"}}',
        '{"NVIDIA": {"sm_arch": ["90_real"]}}',
        '{"nvidia": {"sm_arch": ["9.0 "]}}',
    ],
)
def test_invalid_properties_header(proxy: ProxyServer, images: dict[str, str], header: str) -> None:
    answer = httpx.get(
        f"{proxy.url}/v2/{REPO}/manifests/1.0.0",
        headers={**ACCEPT, "X-Variant-Properties": header},
    )
    assert answer.status_code == 400
    error = answer.json()["errors"][0]
    assert error["code"] == "MANIFEST_INVALID"
    assert "X-Variant-Properties" in error["message"]


# --- cache invalidation and staleness -------------------------------------------------------


def _labels_of(proxy: ProxyServer, repository: str, version: str) -> set[str]:
    answer = httpx.get(f"{proxy.url}/v2/{repository}/_variants/{version}")
    assert answer.status_code == 200, answer.text
    return set(answer.json()["variants"])


def test_manifest_put_and_delete_through_the_proxy_invalidate(
    registry: RunningRegistry, proxy: ProxyServer, image_builder: ImageBuilder
) -> None:
    repo = "pv/inval-front" if isinstance(proxy, FrontedProxy) else "pv/inval"  # both runs
    image_builder.build_and_push(
        f"{registry.host}/{repo}:2.0-cu128", variant_labels("cu128", nvidia__sm_arch="90_real")
    )
    assert _labels_of(proxy, repo, "2.0") == {"cu128"}
    # pushed behind the proxy's back: the long TTL keeps the cached index
    behind = image_builder.build_and_push(
        f"{registry.host}/{repo}:2.0-cpu", variant_labels("cpu", x86_64__level="v1")
    )
    assert _labels_of(proxy, repo, "2.0") == {"cu128"}
    # `Cache-Control: no-cache` (what `docker variant push` sends) forces a fresh scan
    fresh = httpx.get(f"{proxy.url}/v2/{repo}/_variants/2.0", headers={"Cache-Control": "no-cache"})
    assert set(fresh.json()["variants"]) == {"cu128", "cpu"}
    assert _labels_of(proxy, repo, "2.0") == {"cu128", "cpu"}, "and the fresh scan is cached"
    deleted = httpx.delete(f"{proxy.url}/v2/{repo}/manifests/{behind}")
    assert deleted.status_code == 202
    behind = image_builder.build_and_push(
        f"{registry.host}/{repo}:2.0-cpu", variant_labels("cpu", x86_64__level="v1")
    )
    # pushed through the proxy: seen at once
    image_builder.build_and_push(
        f"{proxy.host}/{repo}:2.0-cu126", variant_labels("cu126", nvidia__sm_arch="80_real")
    )
    assert _labels_of(proxy, repo, "2.0") == {"cu128", "cpu", "cu126"}
    # a manifest DELETE through the proxy too
    deleted = httpx.delete(f"{proxy.url}/v2/{repo}/manifests/{behind}")
    assert deleted.status_code == 202
    assert _labels_of(proxy, repo, "2.0") == {"cu128", "cu126"}
    assert proxy.sample("variant_proxy_cache_invalidations_total") >= 2
    # a failed PUT does not invalidate
    invalidations = proxy.sample("variant_proxy_cache_invalidations_total")
    bad = httpx.put(
        f"{proxy.url}/v2/{repo}/manifests/2.0-x",
        content=b"{}",
        headers={"Content-Type": OCI_MANIFEST},
    )
    assert bad.status_code >= 400
    assert proxy.sample("variant_proxy_cache_invalidations_total") == invalidations


def test_bounded_staleness(registry: RunningRegistry, image_builder: ImageBuilder) -> None:
    repo = "pv/stale"
    image_builder.build_and_push(
        f"{registry.host}/{repo}:1-a", variant_labels("a", x86_64__level="v1")
    )
    with ProxyServer(registry.url, cache_ttl=300) as proxy:
        skew = [0.0]  # the cache's clock, moved on by the test instead of waiting
        proxy.app.state.cache.clock = lambda: time.monotonic() + skew[0]
        assert _labels_of(proxy, repo, "1") == {"a"}
        image_builder.build_and_push(
            f"{registry.host}/{repo}:1-b", variant_labels("b", x86_64__level="v2")
        )
        assert _labels_of(proxy, repo, "1") == {"a"}  # stale, within its TTL
        skew[0] = 301.0
        assert _labels_of(proxy, repo, "1") == {"a", "b"}
    with ProxyServer(registry.url, cache_ttl=0) as proxy:  # no cache at all
        assert _labels_of(proxy, repo, "1") == {"a", "b"}
        assert proxy.sample("variant_proxy_cache_hits_total") == 0
        assert _labels_of(proxy, repo, "1") == {"a", "b"}
        assert proxy.sample("variant_proxy_cache_hits_total") == 0


# --- an upstream that needs credentials ------------------------------------------------------

USERS = {"alice": "wonderland", "bob": "builder"}


@pytest.fixture(scope="module")
def auth_setup(
    htpasswd_registry: Callable[[Mapping[str, str]], RunningRegistry],
    image_builder: ImageBuilder,
) -> Iterator[tuple[RunningRegistry, ProxyServer]]:
    upstream = htpasswd_registry(USERS)
    creds = ("alice", USERS["alice"])
    for label, value in (("cu128", "12.8"), ("cu126", "12.6")):
        image_builder.build_and_push(
            f"{upstream.host}/secret/app:1.0-{label}",
            variant_labels(label, nvidia__cuda_version_lower_bound=value),
            creds=creds,
        )
    with ProxyServer(upstream.url, cache_ttl=3600) as proxy:
        yield upstream, proxy


def _check_refused(answer: httpx.Response) -> None:
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == 'Basic realm="test-registry"'
    assert answer.json()["errors"][0]["code"] == "UNAUTHORIZED"
    assert "variants" not in answer.text


def test_auth_upstream(auth_setup: tuple[RunningRegistry, ProxyServer]) -> None:
    upstream, proxy = auth_setup
    url = f"{proxy.url}/v2/secret/app/_variants/1.0"
    alice = httpx.BasicAuth("alice", USERS["alice"])
    _check_refused(httpx.get(url))  # cold cache, no credentials
    good = httpx.get(url, auth=alice)
    assert good.status_code == 200, good.text
    assert set(good.json()["variants"]) == {"cu128", "cu126"}
    assert good.content == _expected(
        upstream.url, "secret/app", "1.0", headers={"Authorization": alice._auth_header}
    )
    hits = proxy.sample("variant_proxy_cache_hits_total")
    # the cache is full now: still refused without (or with wrong) credentials
    _check_refused(httpx.get(url))
    _check_refused(httpx.get(url, auth=httpx.BasicAuth("alice", "wrong")))
    _check_refused(httpx.get(url, auth=httpx.BasicAuth("mallory", "x")))
    again = httpx.get(url, auth=httpx.BasicAuth("bob", USERS["bob"]))
    assert again.content == good.content
    assert proxy.sample("variant_proxy_cache_hits_total") >= hits + 1
    # transparent resolution is refused the same way, and works with credentials
    headers = {**ACCEPT, "X-Variant-Properties": '{"nvidia":{"cuda_version_lower_bound":["12.6"]}}'}
    manifest = f"{proxy.url}/v2/secret/app/manifests/1.0"
    _check_refused(httpx.get(manifest, headers=headers))
    head = httpx.head(manifest, headers=headers)
    assert head.status_code == 401 and head.content == b""
    assert head.headers["www-authenticate"] == 'Basic realm="test-registry"'
    resolved = httpx.head(manifest, headers=headers, auth=alice)
    assert resolved.status_code == 200 and resolved.headers["x-variant-label"] == "cu126"
    # and plain pass-through forwards Authorization and WWW-Authenticate
    assert httpx.get(f"{proxy.url}/v2/secret/app/tags/list").status_code == 401
    assert httpx.get(f"{proxy.url}/v2/secret/app/tags/list", auth=alice).status_code == 200


# --- a broken upstream ---------------------------------------------------------------------------

GOOD_CONFIG = json.dumps(
    {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8")},
    }
).encode()


def _serve_good(fake: FakeUpstream, repo: str = "g/app") -> str:
    manifest = raw_manifest(GOOD_CONFIG)
    fake.routes[f"/v2/{repo}/tags/list"] = Reply(
        200, json.dumps({"name": repo, "tags": ["1.0-cu128"]}).encode()
    )
    fake.routes[f"/v2/{repo}/manifests/1.0-cu128"] = Reply(
        200, manifest, {"Content-Type": OCI_MANIFEST}
    )
    fake.routes[f"/v2/{repo}/blobs/{sha256_digest(GOOD_CONFIG)}"] = Reply(200, GOOD_CONFIG)
    return sha256_digest(manifest)


@pytest.fixture
def fake_proxy(fake_upstream: FakeUpstream) -> Iterator[tuple[FakeUpstream, ProxyServer]]:
    with ProxyServer(fake_upstream.url, cache_ttl=3600) as running:  # 30 s upstream time-out
        yield fake_upstream, running


@pytest.mark.parametrize(
    "garbage",
    [
        Reply(200, b'{"name": "g/app", "tags": ["1.0-cu1'),  # truncated JSON
        Reply(200, b"<html>hello</html>", {"Content-Type": "text/html"}),
        Reply(200, b'{"name": "g/app", "tags": ["1.0-cu128"]}', truncate_to=10),
        Reply(500, b"oops"),
    ],
)
def test_garbage_is_502_and_never_cached(
    fake_proxy: tuple[FakeUpstream, ProxyServer], garbage: Reply
) -> None:
    fake, proxy = fake_proxy
    digest = _serve_good(fake)
    fake.routes["/v2/g/app/tags/list"] = garbage
    url = f"{proxy.url}/v2/g/app/_variants/1.0"
    bad = httpx.get(url)
    assert bad.status_code == 502, bad.text
    assert bad.headers["content-type"] == "application/json"
    error = bad.json()["errors"][0]
    assert error["code"] == "REGISTRY_UNAVAILABLE"
    assert error["message"] and "\n" not in error["message"]
    _serve_good(fake)  # the upstream recovers: the failure was not cached
    good = httpx.get(url)
    assert good.status_code == 200, good.text
    assert good.json()["images"]["cu128"]["digest"] == digest


def test_per_image_garbage_lands_under_invalid(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    _serve_good(fake)
    fake.routes["/v2/g/app/tags/list"] = Reply(
        200, json.dumps({"name": "g/app", "tags": ["1.0-cu128", "1.0-html"]}).encode()
    )
    fake.routes["/v2/g/app/manifests/1.0-html"] = Reply(
        200, b"<html>", {"Content-Type": "text/html"}
    )
    doc = httpx.get(f"{proxy.url}/v2/g/app/_variants/1.0").json()
    assert set(doc["variants"]) == {"cu128"}
    (invalid,) = doc["invalid"]
    assert invalid["tag"] == "1.0-html" and "text/html" in invalid["error"]


def test_slow_upstream_is_504(fake_upstream: FakeUpstream) -> None:
    # a proxy of its own, with a short time-out (it bounds a whole scan); the other tests'
    # proxies wait as long as load needs (30 s)
    fake = fake_upstream
    with ProxyServer(fake.url, cache_ttl=3600, upstream_timeout=3.0) as proxy:
        _serve_good(fake)

        release, answered = threading.Event(), threading.Event()

        def slow(_seen: Seen) -> Reply:
            release.wait(30)  # an upstream that says nothing until the test is done
            answered.set()
            return Reply(200, b'{"name": "g/app", "tags": []}')

        fake.routes["/v2/g/app/tags/list"] = slow
        try:
            answer = httpx.get(f"{proxy.url}/v2/g/app/_variants/1.0", timeout=10)
            assert not answered.is_set()  # the proxy's own deadline answered
        finally:
            release.set()
        assert answer.status_code == 504
        error = answer.json()["errors"][0]
        assert "timed out" in error["message"] and not error["message"].endswith(":")
        _serve_good(fake)
        assert httpx.get(f"{proxy.url}/v2/g/app/_variants/1.0").status_code == 200


def test_upstream_refusal_after_cache_is_passed_on(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    """A token-auth upstream that starts refusing: the cached index is not handed out."""
    fake, proxy = fake_proxy
    _serve_good(fake)
    url = f"{proxy.url}/v2/g/app/_variants/1.0"
    assert httpx.get(url, headers={"Authorization": "Bearer good"}).status_code == 200
    challenge = 'Bearer realm="http://auth.test/token",service="reg",scope="repository:g/app:pull"'
    body = b'{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}'

    def gate(seen: Seen) -> Reply:
        if seen.headers.get("authorization") == "Bearer good":
            return Reply(200, raw_manifest(GOOD_CONFIG), {"Content-Type": OCI_MANIFEST})
        return Reply(403, body, {"WWW-Authenticate": challenge, "Content-Type": "application/json"})

    fake.routes["/v2/g/app/manifests/1.0-cu128"] = gate
    denied = httpx.get(url, headers={"Authorization": "Bearer other"})
    assert denied.status_code == 403
    assert denied.headers["www-authenticate"] == challenge
    assert denied.content == body  # the upstream's own answer
    assert httpx.get(url, headers={"Authorization": "Bearer good"}).status_code == 200
    sent = [r.headers.get("authorization") for r in fake.requests]
    assert "Bearer other" in sent


def test_concurrent_misses_share_one_scan_and_its_failure(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    _serve_good(fake)

    def slow_garbage(_seen: Seen) -> Reply:
        # answers once all 20 callers are in the proxy (each missed the cache)
        eventually(
            lambda: proxy.sample("variant_proxy_cache_misses_total") >= 20, 30.0, "20 callers"
        )
        return Reply(200, b'{"name": "g/app", "ta')

    fake.routes["/v2/g/app/tags/list"] = slow_garbage

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            return await asyncio.gather(*[client.get("/v2/g/app/_variants/1.0") for _ in range(20)])

    answers = asyncio.run(many())
    assert [a.status_code for a in answers] == [502] * 20
    assert len([r for r in fake.requests if r.path == "/v2/g/app/tags/list"]) == 1
    assert proxy.sample("variant_proxy_scans_total") == 1


def test_a_refused_owner_does_not_refuse_its_waiters(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    _serve_good(fake)
    listing = json.dumps({"name": "g/app", "tags": ["1.0-cu128"]}).encode()

    def gate(seen: Seen) -> Reply:
        if seen.headers.get("authorization") == "Bearer good":
            return Reply(200, listing)
        # the anonymous owner's refusal comes once the good caller has joined its scan
        eventually(
            lambda: proxy.sample("variant_proxy_cache_misses_total") >= 2, 30.0, "the joiner"
        )
        return Reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": "Basic"})

    fake.routes["/v2/g/app/tags/list"] = gate

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            anonymous = asyncio.ensure_future(client.get("/v2/g/app/_variants/1.0"))
            while proxy.sample("variant_proxy_scans_total") < 1:  # the owner's scan is on
                assert not anonymous.done(), anonymous
                await asyncio.sleep(0.01)
            good = await client.get(
                "/v2/g/app/_variants/1.0", headers={"Authorization": "Bearer good"}
            )
            return await anonymous, good

    anonymous, good = asyncio.run(both())
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Basic"
    assert good.status_code == 200, good.text
    assert set(good.json()["variants"]) == {"cu128"}


def test_rate_limited_upstream_is_waited_out_briefly_then_passed_on(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    digest = _serve_good(fake)
    limited = json.dumps({"errors": [{"code": "TOOMANYREQUESTS", "message": "slow down"}]})
    calls: list[int] = []

    def once(_: object) -> Reply:
        calls.append(1)
        if len(calls) == 1:
            return Reply(429, limited.encode(), {"Retry-After": "0"})
        return Reply(200, json.dumps({"name": "g/app", "tags": ["1.0-cu128"]}).encode())

    fake.routes["/v2/g/app/tags/list"] = once
    good = httpx.get(f"{proxy.url}/v2/g/app/_variants/1.0")
    assert good.status_code == 200, good.text
    assert good.json()["images"]["cu128"]["digest"] == digest and len(calls) == 2
    # a wait beyond the bound: the caller gets the 429 and its Retry-After, nothing cached
    fake.routes["/v2/g/app/tags/list"] = Reply(429, limited.encode(), {"Retry-After": "3600"})
    refused = httpx.get(
        f"{proxy.url}/v2/g/app/_variants/1.0", headers={"Cache-Control": "no-cache"}
    )
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "3600"
    assert refused.json()["errors"][0]["code"] == "TOOMANYREQUESTS"
    assert "rate limited" in refused.json()["errors"][0]["message"]
