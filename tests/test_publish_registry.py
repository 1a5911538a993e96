"""Publishing against the real Debian registry (docs/reference/image-index.md): the variant image index,
one-request resolution counted in the registry's own access log, the same document three
ways, refusals, idempotency, and 429s from a rate-limited upstream."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from conftest import RunningRegistry, start_registry
from docker_variant.oci.client import MANIFEST_ACCEPT, RegistryClient
from docker_variant.oci.scan import read_version, scan_index
from docker_variant.providers.nvidia import nvidia_features
from fakeupstream import FakeUpstream, Reply, Seen
from imaging import ImageBuilder, push_index, variant_labels
from proxyrunner import eventually

pytestmark = pytest.mark.e2e

H200 = {"nvidia": nvidia_features((12, 8), (9, 0)), "x86_64": {"level": ["v4", "v3", "v2", "v1"]}}
GH200 = {"nvidia": nvidia_features((12, 8), (9, 0)), "aarch64": {"version": ["9.0a", "8a"]}}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "docker_variant", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "NV_VARIANT"))}
    env |= {"DOCKER_CONFIG": str(tmp_path / "dc"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return env


def _document(url: str, repository: str, version: str, *, scan: bool = False) -> str:
    async def go() -> str:
        async with RegistryClient(url) as client:
            read = scan_index if scan else read_version
            index = await read(client, repository, version)
            return json.dumps(index.to_json(), sort_keys=True)

    return asyncio.run(go())


def _push_two_platform_set(
    registry: RunningRegistry, builder: ImageBuilder, repo: str
) -> dict[str, str]:
    """10 variants over linux/amd64 and linux/arm64: single-platform images of each, two
    multi-platform tags (an index per tag), a bare amd64 image. Returns tag -> digest."""
    dest = f"{registry.host}/{repo}"
    pushed: dict[str, str] = {}
    amd = {
        "cpu": variant_labels("cpu", x86_64__level="v1"),
        "v3": variant_labels("v3", x86_64__level="v3"),
        "cu126": variant_labels("cu126", nvidia__cuda_version_lower_bound="12.6"),
        "cu128": variant_labels(
            "cu128", nvidia__cuda_version_lower_bound="12.8", nvidia__sm_arch="90_real"
        ),
    }
    arm = {
        "armv8": variant_labels("armv8", aarch64__version="8a"),
        "gh200": variant_labels(
            "gh200", nvidia__cuda_version_lower_bound="12.8", nvidia__sm_arch="90_real"
        ),
        "armcu126": variant_labels("armcu126", nvidia__cuda_version_lower_bound="12.6"),
        "armv9": variant_labels("armv9", aarch64__version="9.0a"),
    }
    for label, labels in amd.items():
        pushed[f"1.0.0-{label}"] = builder.build_and_push(f"{dest}:1.0.0-{label}", labels)
    for label, labels in arm.items():
        pushed[f"1.0.0-{label}"] = builder.build_and_push(
            f"{dest}:1.0.0-{label}", labels, architecture="arm64"
        )
    for label, labels in [
        ("null", variant_labels("null")),
        ("cu130", variant_labels("cu130", nvidia__cuda_version_lower_bound="13.0")),
    ]:
        parts = [
            (builder.build_and_push(f"{dest}:part-{label}-{arch}", labels, architecture=arch), arch)
            for arch in ("amd64", "arm64")
        ]
        for digest, arch in parts:
            pushed[f"{label}-{arch}"] = digest
        pushed[f"1.0.0-{label}"] = push_index(
            registry.url, repo, f"1.0.0-{label}", [(d, "linux", a) for d, a in parts]
        )
    pushed["1.0.0"] = builder.build_and_push(f"{dest}:1.0.0", {})
    return pushed


@pytest.fixture(scope="module")
def proxy(
    registry: RunningRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[devstack.Service]:
    service = devstack.start_proxy(registry.url, tmp_path_factory.mktemp("publish-proxy"))
    yield service
    service.stop()


def test_same_document_from_scan_index_and_proxy(
    registry: RunningRegistry,
    image_builder: ImageBuilder,
    proxy: devstack.Service,
    cli_env: dict[str, str],
) -> None:
    repo = "three/app"
    pushed = _push_two_platform_set(registry, image_builder, repo)
    scanned = _document(registry.url, repo, "1.0.0", scan=True)
    done = cli("publish", f"{registry.host}/{repo}:1.0.0", env=cli_env)
    assert done.returncode == 0, done.stderr
    from_index = _document(registry.url, repo, "1.0.0")
    through_proxy = httpx.get(f"{proxy.url}/v2/{repo}/_variants/1.0.0")
    assert through_proxy.status_code == 200, through_proxy.text
    assert json.dumps(through_proxy.json(), sort_keys=True) == from_index == scanned

    document = json.loads(from_index)
    assert len(document["variants"]) == 10
    assert document["images"]["null"]["platforms"] == {
        "linux/amd64": pushed["null-amd64"],
        "linux/arm64": pushed["null-arm64"],
    }
    assert document["images"]["gh200"]["platforms"] == {"linux/arm64": pushed["1.0.0-gh200"]}
    assert document["bare"]["digest"] == pushed["1.0.0"]

    # The index: every entry one platform's manifest, with exactly the variant labels.
    raw = subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            f"docker://{registry.host}/{repo}:1.0.0",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    index = json.loads(raw)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert index["annotations"] == {
        "dev.pep817.default-priorities.namespace": "nvidia,aarch64,x86_64"
    }
    entries = index["manifests"]
    assert len(entries) == 13  # 8 single, 2 x 2 platforms, the bare image
    first = {}
    for entry in entries:
        first.setdefault(entry["platform"]["architecture"], entry)
    # what variant-unaware clients get: the bare image on amd64; on arm64 (no bare) null
    assert first["amd64"]["digest"] == pushed["1.0.0"]
    assert first["amd64"]["annotations"] == {"org.opencontainers.image.ref.name": "1.0.0"}
    assert first["arm64"]["digest"] == pushed["null-arm64"]
    gh200 = next(e for e in entries if e["digest"] == pushed["1.0.0-gh200"])
    assert gh200["annotations"] == {
        "dev.pep817.variant-label": "gh200",
        "dev.pep817.variant.nvidia.cuda_version_lower_bound": "12.8",
        "dev.pep817.variant.nvidia.sm_arch": "90_real",
        "org.opencontainers.image.ref.name": "1.0.0-gh200",
    }
    assert gh200["platform"] == {"architecture": "arm64", "os": "linux"}

    # Selection from the published index: per platform, and the platform's manifest.
    def resolve(host: dict[str, object], platform: str) -> dict[str, str]:
        path = Path(cli_env["XDG_CACHE_HOME"]).parent / f"host-{platform.replace('/', '-')}.json"
        path.write_text(json.dumps(host))
        ref = f"{registry.host}/{repo}:1.0.0"
        done = cli(
            "--json", "resolve", ref, "--providers-file", str(path), "--platform", platform,
            env=cli_env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer: dict[str, str] = json.loads(done.stdout)
        return answer

    assert resolve(H200, "linux/amd64")["label"] == "cu128"
    assert resolve(GH200, "linux/arm64")["label"] == "gh200"
    cu130 = resolve({"nvidia": nvidia_features((13, 0), (10, 0))}, "linux/arm64")
    assert (cu130["label"], cu130["digest"]) == ("cu130", pushed["cu130-arm64"])


def test_publish_is_idempotent_and_dry_run_changes_nothing(
    registry: RunningRegistry, image_builder: ImageBuilder, cli_env: dict[str, str]
) -> None:
    repo = "idem/app"
    dest = f"{registry.host}/{repo}"
    image_builder.build_and_push(f"{dest}:2.0-cpu", variant_labels("cpu", x86_64__level="v1"))
    bare = image_builder.build_and_push(f"{dest}:2.0", {})
    dry = cli("publish", "--dry-run", f"{dest}:2.0", env=cli_env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["manifests"][0]["digest"] == bare
    still = cli("--json", "resolve", f"{dest}:2.0", env=cli_env)
    assert json.loads(still.stdout)["digest"]  # the version is still a plain scan
    first = json.loads(cli("--json", "publish", f"{dest}:2.0", env=cli_env).stdout)
    again = json.loads(cli("--json", "publish", f"{dest}:2.0", env=cli_env).stdout)
    assert first["changed"] is True and again["changed"] is False
    assert first["digest"] == again["digest"]
    assert again["index"]["manifests"][0]["digest"] == bare  # the bare image is kept


@pytest.mark.parametrize(
    ("images", "named", "rule"),
    [
        (
            {"3.0-cpu": variant_labels("cpu", x86_64__level="v1"),
             "3.0-bad": variant_labels("bad", nvidia__sm_arch="9.0 ")},
            "3.0-bad",
            "does not match",
        ),
        (
            {"3.0-a": variant_labels("a", x86_64__level="v1")
             | {"dev.pep817.default-priorities.namespace": "nvidia,x86_64"},
             "3.0-b": variant_labels("b", x86_64__level="v2")
             | {"dev.pep817.default-priorities.namespace": "x86_64,nvidia"}},
            "3.0-b",
            "conflicts with",
        ),
        ({"3.0": {}}, "3.0", "no variant images"),
    ],
    ids=["invalid-label", "namespace-orders", "nothing-to-publish"],
)  # fmt: skip
def test_publish_refuses_what_the_index_would_misrepresent(
    registry: RunningRegistry,
    image_builder: ImageBuilder,
    cli_env: dict[str, str],
    images: dict[str, dict[str, str]],
    named: str,
    rule: str,
    request: pytest.FixtureRequest,
) -> None:
    repo = f"refuse/{request.node.callspec.id}"
    for tag, labels in images.items():
        image_builder.build_and_push(f"{registry.host}/{repo}:{tag}", labels)
    done = cli("publish", f"{registry.host}/{repo}:3.0", env=cli_env)
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert named in message and rule in message
    # nothing was written at 3.0: no tag, or still the bare image's manifest
    answer = httpx.get(
        f"{registry.url}/v2/{repo}/manifests/3.0", headers={"Accept": MANIFEST_ACCEPT}
    )
    if "3.0" in images:
        assert "index" not in answer.headers["content-type"]
    else:
        assert answer.status_code == 404


def test_resolve_request_counts_from_the_registry_access_log(
    tmp_path: Path, image_builder: ImageBuilder, cli_env: dict[str, str]
) -> None:
    """docs/reference/image-index.md: a published index costs at most 2 manifest/blob GETs, a scan 2N+1."""
    start_registry(tmp_path / "probe").service.stop()  # skips where the binary is missing
    service = devstack.start_registry(tmp_path / "counted", access_log=True)
    try:
        variants = 50
        dest = f"{service.address}/count/app"
        for i in range(variants):
            labels = variant_labels(f"cu12{i:02d}", nvidia__cuda_version_lower_bound=f"12.{i}")
            image_builder.build_and_push(f"{dest}:1.0.0-cu12{i:02d}", labels)

        def gets_for_resolve() -> tuple[int, int]:
            before = len(devstack.registry_requests(service))
            done = cli("resolve", f"{dest}:1.0.0", "--providers-file", str(host), env=cli_env)
            assert done.returncode == 0, done.stderr
            paths = devstack.registry_requests(service)[before:]
            counted = [p for p in paths if "/manifests/" in p or "/blobs/" in p]
            return len(counted), len(paths)

        host = tmp_path / "h200.json"
        host.write_text(json.dumps(H200))
        scan_gets, scan_all = gets_for_resolve()
        assert scan_gets == 2 * variants + 1  # the 1.0.0 probe, a manifest and config each
        published = cli("publish", f"{dest}:1.0.0", env=cli_env)
        assert published.returncode == 0, published.stderr
        index_gets, index_all = gets_for_resolve()
        assert index_gets <= 2
        # the index alone: no tag list, and no _variants probe either, since the first
        # resolve found this registry has no proxy and remembered it (PLAIN_REGISTRY_TTL)
        assert index_all == 1
        # plus the _variants probe, the discovery request that tells a registry's 404 from
        # a proxy's, and the tag list
        assert scan_all == scan_gets + 3
    finally:
        service.stop()


@pytest.mark.parametrize("retry_after", ["0", "1"])
def test_a_short_retry_after_is_waited_out(
    fake_upstream: FakeUpstream, cli_env: dict[str, str], retry_after: str
) -> None:
    seen: list[Seen] = []
    body = json.dumps({"errors": [{"code": "TOOMANYREQUESTS", "message": "slow down"}]})

    def limited(request: Seen) -> Reply:
        seen.append(request)
        if len(seen) == 1:
            return Reply(429, body.encode(), {"Retry-After": retry_after})
        return Reply(200, json.dumps({"name": "rl/app", "tags": []}).encode())

    fake_upstream.routes["/v2/rl/app/tags/list"] = limited
    done = cli("resolve", f"127.0.0.1:{fake_upstream.port}/rl/app:1.0", env=cli_env)
    assert len(seen) == 2  # one retry, then the answer
    assert done.returncode == 3 and "no image tagged 1.0" in done.stderr


def test_a_long_rate_limit_fails_naming_it(
    fake_upstream: FakeUpstream, cli_env: dict[str, str]
) -> None:
    body = json.dumps({"errors": [{"code": "TOOMANYREQUESTS", "message": "pull rate limit"}]})
    fake_upstream.routes["/v2/rl/app/manifests/1.0"] = Reply(
        429, body.encode(), {"Retry-After": "3600"}
    )
    done = cli("resolve", f"127.0.0.1:{fake_upstream.port}/rl/app:1.0", env=cli_env)
    assert done.returncode == 3
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "429" in line and "TOOMANYREQUESTS" in line and "rate limited" in line
    assert "3600 s" in line
    requests = [r for r in fake_upstream.requests if r.path.endswith("/manifests/1.0")]
    assert len(requests) == 1  # no retry when the wait is beyond the bound


def test_a_header_without_a_platform_gets_a_multi_platform_bare_image_whole(
    registry: RunningRegistry, image_builder: ImageBuilder, proxy: devstack.Service
) -> None:
    """X-Variant-Properties with no CPU namespace names no platform: where the bare image
    wins and has two platforms, the caller gets its index, not one platform's manifest."""
    repo = "mpbare/app"
    dest = f"{registry.host}/{repo}"
    parts = [
        (image_builder.build_and_push(f"{dest}:part-{arch}", {}, architecture=arch), arch)
        for arch in ("amd64", "arm64")
    ]
    bare = push_index(registry.url, repo, "1.0.0", [(d, "linux", a) for d, a in parts])
    labels = variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8")
    image_builder.build_and_push(f"{dest}:1.0.0-cu128", labels)
    accept = {"Accept": MANIFEST_ACCEPT}
    old_gpu = json.dumps({"nvidia": {"cuda_version_lower_bound": ["12.4"]}})
    for method in ("HEAD", "GET"):
        answer = httpx.request(
            method,
            f"{proxy.url}/v2/{repo}/manifests/1.0.0",
            headers={**accept, "X-Variant-Properties": old_gpu},
        )
        assert answer.status_code == 200, answer.text
        assert "X-Variant-Label" not in answer.headers  # the bare image
        assert answer.headers["Docker-Content-Digest"] == bare
    # with the platform said, that platform's manifest
    arm = json.dumps({**json.loads(old_gpu), "aarch64": {"version": ["8a"]}})
    answer = httpx.get(
        f"{proxy.url}/v2/{repo}/manifests/1.0.0", headers={**accept, "X-Variant-Properties": arm}
    )
    assert answer.headers["Docker-Content-Digest"] == dict((a, d) for d, a in parts)["arm64"]


def test_proxy_reads_a_published_index_in_one_request_and_invalidates_on_its_put(
    tmp_path: Path, image_builder: ImageBuilder, cli_env: dict[str, str]
) -> None:
    start_registry(tmp_path / "probe").service.stop()  # skips where the binary is missing
    upstream = devstack.start_registry(tmp_path / "counted", access_log=True)
    proxy = devstack.start_proxy(upstream.url, tmp_path / "proxy", cache_ttl=300)
    try:
        dest = f"{upstream.address}/pp/app"
        for label, level in [("v1", "v1"), ("v2", "v2")]:
            labels = variant_labels(label, x86_64__level=level)
            image_builder.build_and_push(f"{dest}:1.0.0-{label}", labels)
        url = f"{proxy.url}/v2/pp/app/_variants/1.0.0"
        assert sorted(httpx.get(url).json()["variants"]) == ["v1", "v2"]  # scanned, cached
        image_builder.build_and_push(f"{dest}:1.0.0-v3", variant_labels("v3", x86_64__level="v3"))
        assert sorted(httpx.get(url).json()["variants"]) == ["v1", "v2"]  # still cached
        done = cli("publish", f"{proxy.address}/pp/app:1.0.0", env=cli_env)
        assert done.returncode == 0, done.stderr
        before = len(devstack.registry_requests(upstream))
        fresh = httpx.get(url)
        assert sorted(fresh.json()["variants"]) == ["v1", "v2", "v3"]  # the PUT invalidated
        index = "/v2/pp/app/manifests/1.0.0"
        # the registry's log line, awaited: it may land after the proxy has answered
        eventually(
            lambda: index in devstack.registry_requests(upstream)[before:], 20, "the index GET"
        )
        cold = devstack.registry_requests(upstream)[before:]
        assert cold == [index]  # one request: the index
    finally:
        proxy.stop()
        upstream.stop()
