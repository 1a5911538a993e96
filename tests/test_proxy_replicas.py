"""Proxy replicas sharing one cache in Redis, and the registry's notifications (issue 8):
two variant-proxy processes, one Redis, one registry whose webhook points at proxy A."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import devstack
from imaging import ImageBuilder, variant_labels

pytestmark = pytest.mark.e2e
SECRET = "notify-secret-for-tests-0123"


@dataclass
class Replicas:
    registry: devstack.Service
    redis: devstack.Service
    a: devstack.Service
    b: devstack.Service

    def variants(self, proxy: devstack.Service, repo: str, version: str) -> set[str]:
        answer = httpx.get(f"{proxy.url}/v2/{repo}/_variants/{version}", timeout=30)
        assert answer.status_code == 200, answer.text
        return set(answer.json()["variants"])

    def counter(self, name: str) -> float:
        """A counter summed over both replicas (their Prometheus /metrics)."""
        total = 0.0
        for proxy in (self.a, self.b):
            for line in httpx.get(f"{proxy.url}/metrics").text.splitlines():
                if line.startswith(f"{name} "):
                    total += float(line.split()[1])
        return total

    def scans(self) -> float:
        return self.counter("variant_proxy_scans_total")

    def settle(self, quiet: float = 1.0) -> None:
        """Wait until no notification has arrived for ``quiet`` seconds."""
        last, since = self.counter("variant_proxy_cache_invalidations_total"), time.monotonic()
        while time.monotonic() - since < quiet:
            time.sleep(0.1)
            now = self.counter("variant_proxy_cache_invalidations_total")
            if now != last:
                last, since = now, time.monotonic()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    for tool in ("docker-registry", "redis-server"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    root = tmp_path_factory.mktemp("replicas")
    port_a = devstack.free_port()
    registry = devstack.start_registry(
        root / "registry", notify=(f"http://127.0.0.1:{port_a}/_notify", SECRET)
    )
    redis = devstack.start_redis(root / "redis")
    secret = root / "secret"
    secret.write_text(SECRET)
    shared = ["--cache", f"redis://{redis.address}/0"]
    a = devstack.start_proxy(
        registry.url, root / "a", 300, port=port_a,
        extra=[*shared, "--notify-secret-file", str(secret)],
    )  # fmt: skip
    b = devstack.start_proxy(registry.url, root / "b", 300, extra=shared)
    yield Replicas(registry, redis, a, b)
    for service in (b, a, redis, registry):
        service.stop()


def _push(builder: ImageBuilder, host: str, repo: str, tag: str, level: str) -> None:
    label = tag.rsplit("-", 1)[1]
    builder.build_and_push(f"{host}/{repo}:{tag}", variant_labels(label, x86_64__level=level))


def _eventually(check: callable, seconds: float = 5.0) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.05)


def test_a_push_through_one_replica_is_seen_through_the_other(
    replicas: Replicas, image_builder: ImageBuilder
) -> None:
    repo = "rep/through"
    _push(image_builder, replicas.registry.address, repo, "1.0-v1", "v1")
    assert replicas.variants(replicas.b, repo, "1.0") == {"v1"}  # cached in Redis
    assert replicas.variants(replicas.a, repo, "1.0") == {"v1"}
    _push(image_builder, replicas.a.address, repo, "1.0-v2", "v2")  # through A
    assert replicas.variants(replicas.b, repo, "1.0") == {"v1", "v2"}  # at once, through B


def test_a_push_straight_to_the_registry_is_seen_through_both(
    replicas: Replicas, image_builder: ImageBuilder
) -> None:
    repo = "rep/straight"
    _push(image_builder, replicas.registry.address, repo, "1.0-v1", "v1")
    assert replicas.variants(replicas.a, repo, "1.0") == {"v1"}
    assert replicas.variants(replicas.b, repo, "1.0") == {"v1"}
    _push(image_builder, replicas.registry.address, repo, "1.0-v3", "v3")  # behind both
    # the registry's webhook reaches A, which tells B through Redis (TTL here is 300 s)
    for proxy in (replicas.a, replicas.b):
        _eventually(lambda p=proxy: replicas.variants(p, repo, "1.0") == {"v1", "v3"})


def test_the_notify_endpoint_needs_the_secret(replicas: Replicas) -> None:
    url = f"{replicas.a.url}/_notify"
    body = {"events": [{"action": "push", "target": {"repository": "x"}}]}
    assert httpx.post(url, json=body).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.post(url, json=body, headers={"Authorization": f"Bearer {SECRET}"})
    assert ok.status_code == 200 and ok.json() == {"invalidated": ["x"]}
    assert httpx.post(f"{replicas.b.url}/_notify", json=body).status_code == 404  # not enabled


def test_200_cold_requests_through_both_replicas_cost_one_scan(
    replicas: Replicas, image_builder: ImageBuilder
) -> None:
    repo = "rep/cold"
    for tag, level in [("1.0-v1", "v1"), ("1.0-v2", "v2"), ("1.0-v3", "v3")]:
        _push(image_builder, replicas.registry.address, repo, tag, level)
    replicas.settle()  # the pushes' notifications would (rightly) void a scan under way
    before = replicas.scans()

    async def storm() -> list[int]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as c:
            calls = [
                c.get(f"{proxy.url}/v2/{repo}/_variants/1.0")
                for _ in range(100)
                for proxy in (replicas.a, replicas.b)
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    assert asyncio.run(storm()) == [200] * 200
    assert replicas.scans() - before == 1


def test_redis_dying_mid_load_fails_no_request(
    replicas: Replicas, image_builder: ImageBuilder, tmp_path: Path
) -> None:
    repo = "rep/dying"
    _push(image_builder, replicas.registry.address, repo, "1.0-v1", "v1")
    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def load(proxy: devstack.Service) -> None:
        nonlocal answered
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                answer = client.get(f"{proxy.url}/v2/{repo}/_variants/1.0")
                if answer.status_code != 200 or answer.json()["variants"].keys() != {"v1"}:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")
                answered += 1

    threads = [threading.Thread(target=load, args=(p,)) for p in (replicas.a, replicas.b) * 2]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    replicas.redis.stop()  # mid-load
    time.sleep(1.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert failures == []
    assert answered > 20
    for proxy in (replicas.a, replicas.b):
        assert "serving from the local cache" in proxy.log.read_text()
