"""One caller, one tenant or one upstream answer cannot take the proxy from the others: slow
uploads hold no connection that reads need, a tenant's huge image config is refused before
it is parsed, and an upstream answer longer than its framing reaches no other caller."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

import devstack
from conftest import RunningRegistry
from docker_variant.proxy.cache import CachedIndex, LocalIndexStore
from docker_variant.proxy.limits import ProxyLimits, parse_limit
from docker_variant.variant import VariantIndex
from fakeupstream import FakeUpstream, Reply
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest
from proxyrunner import FrontedProxy, ProxyServer, eventually

pytestmark = pytest.mark.e2e

# An answer of 5 bytes with a second answer behind it, in one write: the second must never be
# taken for the answer to another caller's request.
POISONED = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Poison: 1\r\n\r\nEVIL"
)


def _tags(fake: FakeUpstream, repository: str, tags: list[str]) -> None:
    body = json.dumps({"name": repository, "tags": tags}).encode()
    fake.routes[f"/v2/{repository}/tags/list"] = Reply(
        body=body, headers={"Content-Type": "application/json"}
    )


def _config(labels: dict[str, str]) -> bytes:
    return json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {"Labels": labels}}
    ).encode()


@pytest.mark.parametrize(
    "path", ["/v2/app/blobs/sha256:" + "a" * 64, "/v2/app/manifests/sha256:" + "b" * 64]
)
def test_an_over_long_upstream_answer_reaches_no_other_caller(
    fake_upstream: FakeUpstream, path: str
) -> None:
    fake_upstream.routes[path] = Reply(raw=POISONED)
    with ProxyServer(fake_upstream.url) as proxy:
        for _ in range(4):
            with httpx.Client(timeout=10) as http:  # each its own caller
                answer = http.get(f"{proxy.url}{path}")
            assert "x-poison" not in answer.headers
            assert answer.content != b"EVIL"
            assert (answer.status_code, answer.content) == (200, b"hello")
    assert [m for m, p in fake_upstream.heads if p == path] == ["GET"] * 4


def test_a_scan_never_reads_bytes_left_after_an_answer(fake_upstream: FakeUpstream) -> None:
    """A tag list followed, in the same write, by a made-up manifest answer: the scan's next
    request (the manifest of tag 1) gets the registry's own answer, not the made-up one."""
    honest = fake_upstream.serve_image("app", "1", _config({}))
    forged_config = _config(
        {"dev.pep817.variant-label": "evil", "dev.pep817.variant.acme.flavour": "x"}
    )
    fake_upstream.serve_image("forged", "1", forged_config)  # its config blob, for the scan
    fake_upstream.routes["/v2/app/blobs/" + _sha256(forged_config)] = Reply(body=forged_config)
    forged = fake_upstream.routes["/v2/forged/manifests/1"]
    assert isinstance(forged, Reply)
    tags = json.dumps({"name": "app", "tags": ["1"]}).encode()
    fake_upstream.routes["/v2/app/tags/list"] = Reply(
        raw=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(tags)}\r\n\r\n".encode()
        + tags
        + b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n"
        + f"Content-Length: {len(forged.body)}\r\n\r\n".encode()
        + forged.body
    )
    with ProxyServer(fake_upstream.url) as proxy:
        for _ in range(2):
            answer = httpx.get(
                f"{proxy.url}/v2/app/_variants/1", headers={"Cache-Control": "no-cache"}
            )
            assert answer.status_code == 200, answer.text
            document = answer.json()
            assert document["variants"] == {}, document
            assert document["bare"]["digest"] == honest


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _hog(port: int, head: str) -> socket.socket:
    """A caller that sends a request head announcing a big body, one byte of it, and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head.encode() + b"{")
    return sock


def test_hanging_uploads_leave_reads_their_connections(fake_upstream: FakeUpstream) -> None:
    """A handful of callers that never finish their manifest PUTs or blob PATCHes: reads
    (``_variants`` scans, manifest and blob GETs) are still answered, manifest bodies never
    reach the upstream unfinished, and uploads past the cap are refused in one line."""
    fake_upstream.serve_image("app", "1", _config({}))
    _tags(fake_upstream, "app", ["1"])
    blob = "/v2/app/blobs/sha256:" + "c" * 64
    fake_upstream.routes[blob] = Reply(body=b"layer")
    pool, uploads, hogs = 2, 2, 6
    with (
        ProxyServer(
            fake_upstream.url,
            upstream_timeout=3,
            max_connections=pool,
            limits=ProxyLimits(upload_connections=uploads),
        ) as proxy,
        ExitStack() as held,
    ):
        for number in range(hogs):
            for head in (
                f"PUT /v2/app/manifests/hog{number} HTTP/1.1\r\nHost: {proxy.host}\r\n"
                "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n"
                "Content-Length: 4000000\r\n\r\n",
                f"PATCH /v2/app/blobs/uploads/hog{number} HTTP/1.1\r\nHost: {proxy.host}\r\n"
                "Content-Length: 4000000\r\n\r\n",
            ):
                held.enter_context(_hog(proxy.port, head))
        # the hogs have taken whatever upstream connections they can get
        eventually(
            lambda: sum(path.startswith("/v2/app/") for _, path in fake_upstream.heads) >= pool,
            10,
            "the hanging uploads reached the upstream",
        )
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            variants = http.get("/v2/app/_variants/1", headers={"Cache-Control": "no-cache"})
            assert variants.status_code == 200, variants.text
            assert variants.json()["bare"]["tag"] == "1"
            manifest = http.get("/v2/app/manifests/1")
            assert manifest.status_code == 200, manifest.text
            assert http.get(blob).content == b"layer"
            # an upload past the cap waits its turn, then is told why
            refused = http.patch("/v2/app/blobs/uploads/late", content=b"x")
            assert refused.status_code == 503, refused.text
            message = refused.json()["errors"][0]["message"]
            assert f"{uploads} uploads" in message and "\n" not in message
        unfinished = [(m, p) for m, p in fake_upstream.heads if "/manifests/hog" in p]
        assert unfinished == []  # a manifest goes up only once it is whole
        patches = [p for m, p in fake_upstream.heads if m == "PATCH"]
        assert len(patches) == uploads


def _accepted(port: int) -> int:
    """Established connections that 127.0.0.1:``port`` accepted (this network namespace)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[1].split(":")[1], 16) == port:
            count += 1
    return count


def test_the_nginx_front_reads_manifests_whole_before_passing_them_on(
    registry: RunningRegistry,
) -> None:
    """Behind the shipped front, hanging manifest PUTs stay in nginx: they reach neither
    variant-proxy nor the registry, and a manifest over the registry's limit is 413."""
    push_blob(registry.url, "isolation/front", b"{}")
    push_manifest(registry.url, "isolation/front", "1", raw_manifest(b"{}"), OCI_MANIFEST)
    hogs = 6
    with (
        FrontedProxy(registry.host, registry.url) as front,
        ExitStack() as held,
    ):
        proxy_port = int(front.proxy_host.rsplit(":", 1)[1])
        for number in range(hogs):
            held.enter_context(
                _hog(
                    front.port,
                    f"PUT /v2/isolation/front/manifests/hog{number} HTTP/1.1\r\n"
                    f"Host: {front.host}\r\nContent-Type: {OCI_MANIFEST}\r\n"
                    "Content-Length: 4000000\r\n\r\n",
                )
            )
        with httpx.Client(base_url=front.url, timeout=30) as http:
            variants = http.get("/v2/isolation/front/_variants/1")
            assert variants.status_code == 200, variants.text
            assert http.get("/v2/isolation/front/_variants/1").status_code == 200
            too_big = http.put(
                "/v2/isolation/front/manifests/2",
                content=b" " * ((4 << 20) + 1),
                headers={"Content-Type": OCI_MANIFEST},
            )
            assert too_big.status_code == 413
        # the hogs' bodies are still coming: nginx has not opened a connection for them
        assert _accepted(proxy_port) < hogs


def test_a_manifest_over_the_limit_is_413(fake_upstream: FakeUpstream) -> None:
    with ProxyServer(fake_upstream.url, limits=ProxyLimits(manifest_bytes=1000)) as proxy:
        answer = httpx.put(f"{proxy.url}/v2/app/manifests/1", content=b"{" * 1001)
        assert answer.status_code == 413
        assert "1000" in answer.json()["errors"][0]["message"]
        fake_upstream.routes["/v2/app/manifests/1"] = Reply(201, headers={"Location": "/x"})
        assert httpx.put(f"{proxy.url}/v2/app/manifests/1", content=b"{}").status_code == 201
    assert [(m, p) for m, p in fake_upstream.heads] == [("PUT", "/v2/app/manifests/1")]


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def huge_tenant(fake_upstream: FakeUpstream) -> Iterator[FakeUpstream]:
    """``evil``: versions whose variant images hold millions of label values (a 21 MiB
    config, and one just under the proxy's config cap); ``honest``: an ordinary image."""
    many = ",".join(f"v{n}" for n in range(3_000_000))  # 24 MiB of values
    fits = ",".join(f"v{n}" for n in range(100_000))  # 680 KiB: under the config cap
    tags = []
    for number, values in enumerate((many, many, fits)):
        tag = f"1-big{number}"
        labels = {
            "dev.pep817.variant-label": f"big{number}",
            "dev.pep817.variant.acme.flavour": values,
        }
        fake_upstream.serve_image("evil", tag, _config(labels))
        tags.append(tag)
    _tags(fake_upstream, "evil", tags)
    fake_upstream.serve_image("honest", "1", _config({}))
    _tags(fake_upstream, "honest", ["1"])
    return fake_upstream


def test_a_tenants_huge_config_costs_the_others_nothing(
    huge_tenant: FakeUpstream, tmp_path: Path
) -> None:
    proxy = devstack.start_proxy(huge_tenant.url, tmp_path / "proxy", cache_ttl=3600)
    try:
        with httpx.Client(base_url=proxy.url, timeout=60) as http:
            assert http.get("/v2/honest/_variants/1").status_code == 200
        before = _peak_rss(proxy.process.pid)

        async def storm() -> tuple[list[httpx.Response], list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=proxy.url, timeout=120) as client:
                fresh = {"Cache-Control": "no-cache"}
                evil = [client.get("/v2/evil/_variants/1", headers=fresh) for _ in range(4)]
                honest = [client.get("/v2/honest/_variants/1") for _ in range(20)]
                answers = await asyncio.gather(*evil, *honest)
                return answers[:4], answers[4:]

        evil, honest = asyncio.run(storm())
        assert [a.status_code for a in honest] == [200] * len(honest)
        assert {a.json()["bare"]["tag"] for a in honest} == {"1"}
        assert len({a.status_code for a in evil}) == 1
        document = evil[0].json()
        reasons = {entry["tag"]: entry["error"] for entry in document["invalid"]}
        assert sorted(reasons) == ["1-big0", "1-big1", "1-big2"], document
        assert "bytes" in reasons["1-big0"] and "\n" not in reasons["1-big0"]
        assert "values" in reasons["1-big2"], reasons["1-big2"]
        assert document["variants"] == {}
        # the huge configs were never held whole, nor their values split
        assert _peak_rss(proxy.process.pid) - before < 64 << 20
    finally:
        proxy.stop()


def test_limits_are_set_by_name() -> None:
    limits = parse_limit(parse_limit(ProxyLimits(), "config-bytes=2048"), "labels = 10")
    assert (limits.config_bytes, limits.labels) == (2048, 10)
    assert limits.reads().config_bytes == 2048
    assert limits.upload_connections == ProxyLimits().upload_connections


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("config-bytes", "expected NAME=VALUE"),
        ("nonsense=1", "expected NAME=VALUE with NAME one of upload-connections"),
        ("labels=-1", "not a whole number"),
        ("labels=1e3", "not a whole number"),
        ("labels=0", "labels must be a whole number >= 1"),
        ("index-bytes=" + "9" * 40, "not a whole number"),
    ],
)
def test_a_bad_limit_is_one_line_and_exit_2(value: str, needle: str) -> None:
    proxy = [sys.executable, "-m", "docker_variant.proxy", "--upstream", "http://127.0.0.1:1"]
    done = subprocess.run(
        [*proxy, "--limit", value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _entry(size: int) -> CachedIndex:
    return CachedIndex(VariantIndex.from_json(EMPTY_INDEX, "index"), b" " * size, 1e18)


EMPTY_INDEX = {"variants": {}, "images": {}, "bare": None, "invalid": []}


def test_the_local_cache_keeps_to_its_byte_budget() -> None:
    store = LocalIndexStore(60, max_bytes=1000)

    async def fill() -> list[bool]:
        for number in range(5):
            await store.put(("big", str(number)), _entry(400), 0)
        await store.put(("huge", "1"), _entry(1001), 0)  # more than the whole budget
        return [await store.get(("big", str(n))) is not None for n in range(5)] + [
            await store.get(("huge", "1")) is not None
        ]

    # the two newest fit; the one larger than the budget is never kept
    assert asyncio.run(fill()) == [False, False, False, True, True, False]
