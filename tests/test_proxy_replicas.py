"""Proxy replicas sharing one cache in Redis, and the registry's notifications (issue 8):
two variant-proxy processes, one Redis, one registry whose webhook points at proxy A."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import devstack
from imaging import ImageBuilder, variant_labels
from proxyrunner import eventually

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

    def invalidations(self) -> float:
        return self.counter("variant_proxy_cache_invalidations_total")

    def stop(self) -> None:
        for service in (self.b, self.a, self.redis, self.registry):
            service.stop()


def _start_replicas(root: Path) -> Replicas:
    for tool in ("docker-registry", "redis-server"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
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
    return Replicas(registry, redis, a, b)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    started = _start_replicas(tmp_path_factory.mktemp("replicas"))
    yield started
    started.stop()


@pytest.fixture
def own_replicas(tmp_path: Path) -> Iterator[Replicas]:
    """Replicas of their own, for a test that freezes or restarts their Redis."""
    started = _start_replicas(tmp_path)
    yield started
    started.stop()


def _push(builder: ImageBuilder, host: str, repo: str, tag: str, level: str) -> None:
    label = tag.rsplit("-", 1)[1]
    builder.build_and_push(f"{host}/{repo}:{tag}", variant_labels(label, x86_64__level=level))


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
        eventually(
            lambda p=proxy: replicas.variants(p, repo, "1.0") == {"v1", "v3"},
            30.0,  # the webhook's delivery (1 s time-out, 1 s backoff) on a loaded machine
            f"the push through {proxy.address}",
        )


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

    async def storm() -> list[int]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as c:
            calls = [
                c.get(f"{proxy.url}/v2/{repo}/_variants/1.0")
                for _ in range(100)
                for proxy in (replicas.a, replicas.b)
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    # A notification of the pushes still on its way would (rightly) void the scan under way
    # and make the next caller scan again: a storm that saw one is not counted, and the
    # next storm is cold again (the registry sends a finite number of them).
    for _attempt in range(20):
        before, heard = replicas.scans(), replicas.invalidations()
        assert asyncio.run(storm()) == [200] * 200
        if replicas.invalidations() == heard:
            break
    else:
        pytest.fail("the registry kept notifying for 20 storms")
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
    eventually(lambda: answered >= 20 or bool(failures), 30.0, "20 answers under load")
    replicas.redis.stop()  # mid-load
    at_stop = answered
    eventually(
        lambda: (
            answered >= at_stop + 40
            and all(
                "serving from the local cache" in p.log.read_text()
                for p in (replicas.a, replicas.b)
            )
        ),
        30.0,
        "40 more answers with Redis gone, and both replicas on their local cache",
    )
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert failures == []
    assert answered > 20
    for proxy in (replicas.a, replicas.b):
        assert "serving from the local cache" in proxy.log.read_text()


def _wait_listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


class _History:
    """What each replica answered, in order, for one version."""

    def __init__(self, replicas: Replicas, repo: str) -> None:
        self.replicas, self.repo = replicas, repo
        self.seen: dict[str, list[frozenset[str]]] = {"a": [], "b": []}

    def look(self) -> dict[str, frozenset[str]]:
        now = {}
        for which, proxy in (("a", self.replicas.a), ("b", self.replicas.b)):
            now[which] = frozenset(self.replicas.variants(proxy, self.repo, "1.0"))
            self.seen[which].append(now[which])
        return now

    def went_back(self, old: frozenset[str], new: frozenset[str]) -> dict[str, list[str]]:
        """Replicas that answered ``old`` after having answered ``new``."""
        back = {}
        for which, answers in self.seen.items():
            if new in answers and old in answers[answers.index(new) :]:
                back[which] = [",".join(sorted(a)) for a in answers]
        return back


@pytest.mark.parametrize("outage", ["frozen", "restarted"])
def test_invalidations_survive_a_redis_blip(
    own_replicas: Replicas, image_builder: ImageBuilder, outage: str
) -> None:
    """Redis away (frozen with SIGSTOP, or killed and started again empty) while a push is
    notified: A, which heard it, republishes it once Redis is back, B follows (both probe
    Redis every 0.1 s), and neither goes back from the new index to the old."""
    replicas, repo = own_replicas, "rep/blip"
    old, new = frozenset({"v1"}), frozenset({"v1", "v2"})
    history = _History(replicas, repo)
    _push(image_builder, replicas.registry.address, repo, "1.0-v1", "v1")
    eventually(lambda: history.look() == {"a": old, "b": old}, 10.0, "v1 through both")
    redis = replicas.redis.process
    if outage == "frozen":
        os.kill(redis.pid, signal.SIGSTOP)
    else:
        redis.kill()
        redis.wait()
    try:
        # B's Redis read fails: B scans for itself (no push yet) and keeps that locally
        assert history.look()["b"] == old
        _push(image_builder, replicas.registry.address, repo, "1.0-v2", "v2")  # A is told
        eventually(lambda: history.look()["a"] == new, 30.0, "A serving its own scan of v2")
        assert history.look()["b"] == old  # B was not told: Redis is away
    finally:
        if outage == "frozen":
            os.kill(redis.pid, signal.SIGCONT)
        else:
            replicas.redis.process = subprocess.Popen(
                redis.args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
    if outage == "restarted":
        eventually(lambda: _wait_listening(replicas.redis.address), 15.0, "redis-server again")
    # a deadline for a loaded machine (Redis's restart, both probes, two HTTP answers per
    # look), not a measured duration: what is asserted is that B gets there and never back
    eventually(lambda: history.look() == {"a": new, "b": new}, 15.0, "v2 through both")
    for _ in range(20):
        history.look()
    assert history.went_back(old, new) == {}
    assert all(answer == new for answer in history.seen["a"][-21:])
    assert all(answer == new for answer in history.seen["b"][-21:])
