"""The client-side index scan against a real registry, a broken one and a proxy-like one."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from conftest import RunningRegistry
from docker_variant.oci import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    RegistryClient,
    UpstreamUnavailableError,
    fetch_index,
    scan_index,
    scan_index_sync,
)
from docker_variant.oci.mediatypes import OCI_MANIFEST
from docker_variant.oci.reference import parse_reference
from docker_variant.oci.source import refresh_proxy_index
from docker_variant.variant import ImageRecord, VariantIndex, build_index
from fakeupstream import FakeUpstream, Reply, Seen
from imaging import ImageBuilder, push_index, push_raw_image, raw_manifest, sha256_digest

pytestmark = pytest.mark.e2e

LABEL = "dev.pep817.variant-label"
ORDER = "dev.pep817.default-priorities.namespace"
NV_LOWER = "dev.pep817.variant.nvidia.cuda_version_lower_bound"
NV_SM = "dev.pep817.variant.nvidia.sm_arch"
X86_LEVEL = "dev.pep817.variant.x86_64.level"

# tag -> labels; "1.0.0" is the version under test, the rest must be told apart from it
IMAGES: dict[str, dict[str, str]] = {
    "1.0.0-cu128": {LABEL: "cu128", NV_LOWER: "12.8", NV_SM: "90_real,100_real", ORDER: "nvidia"},
    "1.0.0-cu126": {LABEL: "cu126", NV_LOWER: "12.6"},
    "1.0.0-cpu": {LABEL: "cpu", X86_LEVEL: "v3", ORDER: "nvidia,x86_64"},
    "1.0.0-null": {LABEL: "null"},
    "1.0.0": {},
    "1.0.0-bad": {LABEL: "bad", NV_SM: "9.0 "},
    "1.0.0-mislabelled": {LABEL: "cu999", NV_LOWER: "12.8"},
    "1.0.0-ubuntu24.04-cu128": {LABEL: "cu128", NV_LOWER: "12.9"},
    "1.0.0-ubuntu24.04": {},
    "1.0.01-cpu": {LABEL: "cpu", X86_LEVEL: "v2"},
    "2.0.0-cu128": {LABEL: "cu128", NV_LOWER: "13.0"},
}


@pytest.fixture(scope="module")
def scanned_repo(registry: RunningRegistry, image_builder: ImageBuilder) -> dict[str, str]:
    """Repository ``scan/app`` with IMAGES, a config that is not JSON, and a multi-arch tag."""
    dest = f"{registry.host}/scan/app"
    digests = {
        tag: image_builder.build_and_push(f"{dest}:{tag}", labels, layers=2)
        for tag, labels in IMAGES.items()
    }
    digests["1.0.0-junk"] = push_raw_image(registry.url, "scan/app", "1.0.0-junk", b"\x00junk")
    gh200 = {LABEL: "gh200", NV_SM: "90_real"}
    arm = image_builder.build_and_push(f"{dest}:gh200-arm", gh200, architecture="arm64")
    amd = image_builder.build_and_push(f"{dest}:gh200-amd", gh200, architecture="amd64")
    digests["1.0.0-gh200"] = push_index(
        registry.url, "scan/app", "1.0.0-gh200", [(arm, "linux", "arm64"), (amd, "linux", "amd64")]
    )
    digests["gh200-amd"], digests["gh200-arm"] = amd, arm
    return digests


def _scan(
    url: str, repository: str, version: str, *, sync: bool = False, **kwargs: Any
) -> VariantIndex:
    """A scan by the async client, or with ``sync`` by the sync one (on its threads)."""
    if sync:
        return scan_index_sync(url, repository, version, **kwargs)

    async def go() -> VariantIndex:
        async with RegistryClient(url, **kwargs) as client:
            return await scan_index(client, repository, version)

    return asyncio.run(go())


def test_scan_version_index(registry: RunningRegistry, scanned_repo: dict[str, str]) -> None:
    index = _scan(registry.url, "scan/app", "1.0.0")
    assert sorted(index.variants) == ["cpu", "cu126", "cu128", "gh200", "null"]
    assert {label: (i.tag, i.digest) for label, i in index.images.items()} == {
        label: (tag, scanned_repo[tag])
        for label, tag in [
            ("cpu", "1.0.0-cpu"),
            ("cu126", "1.0.0-cu126"),
            ("cu128", "1.0.0-cu128"),  # not 1.0.0-ubuntu24.04-cu128
            ("null", "1.0.0-null"),
        ]
    } | {"gh200": ("1.0.0-gh200", scanned_repo["gh200-amd"])}  # the first platform's
    # every image lists its platforms; a multi-platform tag each platform's manifest
    assert index.images["gh200"].platforms == {
        "linux/amd64": scanned_repo["gh200-amd"],
        "linux/arm64": scanned_repo["gh200-arm"],
    }
    assert index.images["cpu"].platforms == {"linux/amd64": scanned_repo["1.0.0-cpu"]}
    # a feature's values are a set, written sorted (PEP 825)
    assert index.variants["cu128"].to_json() == {
        "nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["100_real", "90_real"]}
    }
    assert index.variants["null"].to_json() == {}
    assert index.bare is not None
    assert (index.bare.tag, index.bare.digest) == ("1.0.0", scanned_repo["1.0.0"])
    assert index.namespace_order == ["nvidia", "x86_64"]
    invalid = {i.tag: i.error for i in index.invalid}
    assert sorted(invalid) == ["1.0.0-bad", "1.0.0-junk", "1.0.0-mislabelled"]
    assert "sm_arch" in invalid["1.0.0-bad"]
    assert "config blob" in invalid["1.0.0-junk"] and "not JSON" in invalid["1.0.0-junk"]
    assert "expected 1.0.0-cu999" in invalid["1.0.0-mislabelled"]
    assert all("\n" not in e for e in invalid.values())


def test_scan_equals_build_index_on_the_same_records(
    registry: RunningRegistry, scanned_repo: dict[str, str]
) -> None:
    """The scan adds nothing of its own: it is build_index over what the registry holds."""
    index = _scan(registry.url, "scan/app", "1.0.0")
    gh200_labels = {LABEL: "gh200", NV_SM: "90_real"}
    records = [
        ImageRecord(tag, scanned_repo[tag], labels, platform="linux/amd64")
        for tag, labels in IMAGES.items()
    ] + [
        ImageRecord("1.0.0-gh200", scanned_repo[f"gh200-{arch}"], gh200_labels, platform=p)
        for arch, p in [("amd", "linux/amd64"), ("arm", "linux/arm64")]
    ]
    errors = {i.tag: i.error for i in index.invalid}
    records.append(
        ImageRecord("1.0.0-junk", scanned_repo["1.0.0-junk"], error=errors["1.0.0-junk"])
    )
    expected = build_index("1.0.0", records)
    got = index.to_json()
    assert got == expected.to_json()
    assert index.dumps() == expected.dumps()


def test_version_sharing_a_prefix(registry: RunningRegistry, scanned_repo: dict[str, str]) -> None:
    index = _scan(registry.url, "scan/app", "1.0.0-ubuntu24.04")
    assert list(index.variants) == ["cu128"]
    assert index.images["cu128"].digest == scanned_repo["1.0.0-ubuntu24.04-cu128"]
    assert index.bare is not None and index.bare.tag == "1.0.0-ubuntu24.04"
    assert index.invalid == []


def test_unknown_version_is_an_empty_index(
    registry: RunningRegistry, scanned_repo: dict[str, str]
) -> None:
    index = _scan(registry.url, "scan/app", "9.9.9")
    assert (index.variants, index.bare, index.invalid) == ({}, None, [])


def test_scan_sync(registry: RunningRegistry, scanned_repo: dict[str, str]) -> None:
    index = scan_index_sync(registry.url, "scan/app", "2.0.0", max_concurrency=1)
    assert index.images["cu128"].digest == scanned_repo["2.0.0-cu128"]


def test_fetch_index_scans_a_plain_registry(
    registry: RunningRegistry,
    scanned_repo: dict[str, str],
    docker_config: Callable[[Mapping[str, Any]], Path],
) -> None:
    ref, index = fetch_index(f"{registry.host}/scan/app:1.0.0")
    assert str(ref) == f"{registry.host}/scan/app:1.0.0"
    assert index.dumps() == _scan(registry.url, "scan/app", "1.0.0").dumps()


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_scan_errors_propagate(
    sync: bool,
    registry: RunningRegistry,
    htpasswd_registry: Callable[[Mapping[str, str]], RunningRegistry],
    image_builder: ImageBuilder,
) -> None:
    with pytest.raises(NotFoundError) as caught:
        _scan(registry.url, "scan/nothing", "1.0.0", sync=sync)
    assert caught.value.code == "NAME_UNKNOWN"

    private = htpasswd_registry({"u": "p"})
    image_builder.build_and_push(f"{private.host}/scan/app:1.0.0", {}, creds=("u", "p"))
    with pytest.raises(RegistryAuthError):
        _scan(private.url, "scan/app", "1.0.0", sync=sync)
    private.service.stop()
    with pytest.raises(UpstreamUnavailableError, match="unreachable"):
        _scan(private.url, "scan/app", "1.0.0", sync=sync)


# --- a scripted upstream -------------------------------------------------------------------


def _serve(fake: FakeUpstream, tag: str, labels: dict[str, str], **reply: Any) -> None:
    config = json.dumps({"config": {"Labels": labels}}).encode()
    fake.routes[f"/v2/app/manifests/{tag}"] = Reply(
        body=raw_manifest(config), headers={"Content-Type": OCI_MANIFEST}, **reply
    )
    fake.routes[f"/v2/app/blobs/{sha256_digest(config)}"] = Reply(body=config)


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_truncated_manifest_is_listed_invalid(sync: bool, fake_upstream: FakeUpstream) -> None:
    tags = ["1.0.0-cpu", "1.0.0-cut", "1.0.0-html", "1.0.0-gone"]
    fake_upstream.routes["/v2/app/tags/list"] = Reply(
        body=json.dumps({"name": "app", "tags": tags}).encode()
    )
    _serve(fake_upstream, "1.0.0-cpu", {LABEL: "cpu", X86_LEVEL: "v3"})
    _serve(fake_upstream, "1.0.0-cut", {LABEL: "cut"}, truncate_to=30)
    _serve(fake_upstream, "1.0.0-html", {LABEL: "html"})
    route = fake_upstream.routes["/v2/app/manifests/1.0.0-html"]
    assert isinstance(route, Reply)
    route.headers["Content-Type"] = "text/html"
    blob = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}
    fake_upstream.routes["/v2/app/manifests/1.0.0-gone"] = Reply(404, json.dumps(blob).encode())

    index = _scan(fake_upstream.url, "app", "1.0.0", sync=sync)
    assert list(index.variants) == ["cpu"]
    invalid = {i.tag: i.error for i in index.invalid}
    assert sorted(invalid) == ["1.0.0-cut", "1.0.0-gone", "1.0.0-html"]
    assert "incomplete" in invalid["1.0.0-cut"]
    assert "text/html" in invalid["1.0.0-html"]
    assert "MANIFEST_UNKNOWN" in invalid["1.0.0-gone"]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_scan_concurrency_is_bounded(sync: bool, fake_upstream: FakeUpstream) -> None:
    tags = [f"1.0.0-v{i}" for i in range(12)]
    fake_upstream.routes["/v2/app/tags/list"] = Reply(
        body=json.dumps({"name": "app", "tags": tags}).encode()
    )
    in_flight, peak, lock = [0], [0], threading.Lock()
    bound_reached = threading.Event()

    def slow(reply: Reply) -> Callable[[Seen], Reply]:
        def serve(seen: Seen) -> Reply:
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
                if in_flight[0] >= 3:
                    bound_reached.set()
            # The first requests are held until the client has its bound in flight: one
            # more arriving meanwhile would exceed it. The time-out only ends a failing run.
            bound_reached.wait(timeout=30)
            with lock:
                in_flight[0] -= 1
            return reply

        return serve

    for tag in tags:
        _serve(fake_upstream, tag, {LABEL: tag.removeprefix("1.0.0-"), X86_LEVEL: "v3"})
    for path, route in list(fake_upstream.routes.items()):
        if path != "/v2/app/tags/list":
            assert isinstance(route, Reply)
            fake_upstream.routes[path] = slow(route)

    index = _scan(fake_upstream.url, "app", "1.0.0", sync=sync, max_concurrency=3)
    assert len(index.variants) == 12
    assert bound_reached.is_set() and peak[0] == 3


def test_fetch_index_prefers_the_proxy_document(
    fake_upstream: FakeUpstream, docker_config: Callable[[Mapping[str, Any]], Path]
) -> None:
    document = {
        "variants": {"cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"]}}},
        "images": {"cu128": {"tag": "1.0.0-cu128", "digest": "sha256:" + "a" * 64}},
        "bare": None,
        "invalid": [],
    }
    fake_upstream.routes["/v2/app/_variants/1.0.0"] = Reply(body=json.dumps(document).encode())
    _, index = fetch_index(f"127.0.0.1:{fake_upstream.port}/app:1.0.0")
    assert index.images["cu128"].tag == "1.0.0-cu128"
    assert [r.path for r in fake_upstream.requests] == ["/v2/app/_variants/1.0.0"]

    fake_upstream.routes["/v2/app/_variants/1.0.0"] = Reply(body=b'{"variants": 3}')
    with pytest.raises(BadUpstreamResponseError, match="'variants' must be an object"):
        fetch_index(f"127.0.0.1:{fake_upstream.port}/app:1.0.0")


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b"404 page not found"),
        (404, b'{"errors": [{"code": "NOT_FOUND", "message": "no such route"}]}'),
        (404, b'{"errors": [{"code": "NAME_UNKNOWN", "message": "repository unknown"}]}'),
        (405, b'{"errors": [{"code": "UNSUPPORTED", "message": "method not allowed"}]}'),
        (400, b'{"errors": [{"code": "NAME_INVALID", "message": "invalid name"}]}'),
    ],
    ids=["plain-404", "coded-404", "name-unknown", "405", "400"],
)
def test_a_registry_without_the_extension_is_scanned_however_it_refuses_it(
    fake_upstream: FakeUpstream,
    docker_config: Callable[[Mapping[str, Any]], Path],
    status: int,
    body: bytes,
) -> None:
    fake_upstream.routes["/v2/app/_variants/1.0.0"] = Reply(status, body)
    fake_upstream.routes["/v2/app/tags/list"] = Reply(
        body=json.dumps({"name": "app", "tags": ["1.0.0-cpu"]}).encode()
    )
    _serve(fake_upstream, "1.0.0-cpu", {LABEL: "cpu", X86_LEVEL: "v3"})
    _, index = fetch_index(f"127.0.0.1:{fake_upstream.port}/app:1.0.0")
    assert list(index.variants) == ["cpu"]
    assert "/v2/app/tags/list" in [r.path for r in fake_upstream.requests]


def test_a_proxys_own_404_is_an_error_and_never_marks_the_host_as_plain(
    fake_upstream: FakeUpstream, docker_config: Callable[[Mapping[str, Any]], Path]
) -> None:
    """A host whose discovery answer lists _variants is a proxy: its 404 for a missing
    version is the answer (exit 3 in the CLI), not a sign to scan, and the next command
    asks its _variants again."""
    discover = {"extensions": [{"name": "_variants", "endpoints": ["_variants"]}]}
    fake_upstream.routes["/v2/_oci/ext/discover"] = Reply(body=json.dumps(discover).encode())
    missing = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "no image tagged 9.9"}]}
    fake_upstream.routes["/v2/app/_variants/9.9"] = Reply(404, json.dumps(missing).encode())
    for _ in range(2):
        with pytest.raises(NotFoundError, match=r"no image tagged 9\.9"):
            fetch_index(f"127.0.0.1:{fake_upstream.port}/app:9.9")
    asked = [r.path for r in fake_upstream.requests]
    assert asked.count("/v2/app/_variants/9.9") == 2 and "/v2/app/tags/list" not in asked


def test_refresh_proxy_index(
    fake_upstream: FakeUpstream,
    registry: RunningRegistry,
    docker_config: Callable[[Mapping[str, Any]], Path],
) -> None:
    document: dict[str, Any] = {
        "variants": {"null": {}},
        "images": {"null": {"tag": "1.0.0-null", "digest": "sha256:" + "a" * 64}},
        "bare": None,
        "invalid": [],
    }
    fake_upstream.routes["/v2/app/_variants/1.0.0"] = Reply(body=json.dumps(document).encode())
    ref = parse_reference(f"127.0.0.1:{fake_upstream.port}/app:1.0.0-cu128")
    assert refresh_proxy_index(ref, "1.0.0") is True
    assert fake_upstream.requests[-1].headers["cache-control"] == "no-cache"
    assert refresh_proxy_index(ref, "") is False
    fake_upstream.routes["/v2/app/_variants/1.0.0"] = Reply(500, b"down")
    assert refresh_proxy_index(ref, "1.0.0") is False  # best effort: never fails a push
    plain = parse_reference(f"{registry.host}/scan/app:1.0.0")
    assert refresh_proxy_index(plain, "1.0.0") is False  # no proxy in front
