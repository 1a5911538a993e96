"""The registry's notifications through the shipped nginx front (issue 41): as the Helm chart
runs it, each replica is a front and a variant-proxy on the pod's loopback, the replicas share
one Redis, and the registry (configured as the operators' guide says) notifies one front's
``/_notify``. A push behind the proxies' back is then seen through every replica at once,
with a TTL (an hour) that nothing else could explain; and the front lets through only a POST
carrying the secret."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

import devstack
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest, variant_labels
from proxyrunner import eventually

pytestmark = pytest.mark.e2e
SECRET = "notify-secret-for-the-front-0123"
TTL_S = 3600  # longer than any test: only an invalidation refreshes an index
# the registry delivers at once, or retries each second (backoff 1s): well under the TTL
DELIVERY_S = 30.0
ACCEPT = {"Accept": f"{OCI_MANIFEST}, application/vnd.oci.image.index.v1+json"}
# a host whose CUDA takes both variants below, 12.8 first: it is given the best there is
HOST = json.dumps({"nvidia": {"cuda_version_lower_bound": ["12.8", "12.6"]}}, separators=(",", ":"))


@dataclass
class Site:
    registry: devstack.Service
    redis: devstack.Service
    proxies: list[devstack.Service]
    fronts: list[devstack.Service]  # fronts[i] before proxies[i]; the registry notifies 0

    def stop(self) -> None:
        for service in (*self.fronts, *self.proxies, self.redis, self.registry):
            service.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    for tool in ("docker-registry", "redis-server"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    if devstack.nginx_binary() is None:
        pytest.skip("nginx is not installed (scripts/setup installs it)")
    root = tmp_path_factory.mktemp("notify")
    front_port = devstack.free_port()
    started: list[devstack.Service] = []
    try:
        registry = devstack.start_registry(
            root / "registry", notify=(f"http://127.0.0.1:{front_port}/_notify", SECRET)
        )
        started.append(registry)
        redis = devstack.start_redis(root / "redis")
        started.append(redis)
        secret = root / "notify-secret"
        secret.write_text(SECRET)
        extra = ["--cache", f"redis://{redis.address}/0", "--notify-secret-file", str(secret)]
        proxies = []
        for name in ("a", "b"):
            proxies.append(devstack.start_proxy(registry.url, root / name, TTL_S, extra=extra))
            started.append(proxies[-1])
        fronts = []
        for index, proxy in enumerate(proxies):
            fronts.append(
                devstack.start_nginx_front(
                    registry.address,
                    proxy.address,
                    root / f"nginx-{index}",
                    port=front_port if index == 0 else None,
                )
            )
            started.append(fronts[-1])
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    running = Site(registry, redis, proxies, fronts)
    yield running
    running.stop()


def _push(base_url: str, repo: str, label: str, cuda: str) -> None:
    labels = variant_labels(label, nvidia__cuda_version_lower_bound=cuda)
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {"Labels": labels}}
    ).encode()
    push_blob(base_url, repo, config)
    push_manifest(base_url, repo, f"1.0-{label}", raw_manifest(config), OCI_MANIFEST)


def _variants(front: devstack.Service, repo: str) -> set[str]:
    answer = httpx.get(f"{front.url}/v2/{repo}/_variants/1.0", timeout=30)
    assert answer.status_code == 200, answer.text
    return set(answer.json()["variants"])


def _resolved(front: devstack.Service, repo: str) -> str:
    headers = {**ACCEPT, "X-Variant-Properties": HOST}
    answer = httpx.get(f"{front.url}/v2/{repo}/manifests/1.0", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-variant-label"]


@pytest.mark.parametrize("where", ["front", "registry"])
def test_a_push_is_seen_through_every_replica_before_the_ttl(site: Site, where: str) -> None:
    """Through the front, the manifest PUT passes variant-proxy, which invalidates at once;
    straight to the registry, only the registry's notification, through the front, can."""
    repo = f"notified/{where}"
    _push(site.fronts[0].url, repo, "cu126", "12.6")
    for front in site.fronts:  # both replicas cache the one variant
        assert _variants(front, repo) == {"cu126"}
        assert _resolved(front, repo) == "cu126"
    target = site.fronts[0].url if where == "front" else site.registry.url
    _push(target, repo, "cu128", "12.8")
    if where == "registry":  # the notification's arrival at replica A, through the front
        eventually(
            lambda: _variants(site.fronts[0], repo) == {"cu126", "cu128"},
            DELIVERY_S,
            "the registry's notification at /_notify",
        )
    # A has dropped the repository's indexes in Redis: the next answers of both are fresh
    for front in site.fronts:
        assert _variants(front, repo) == {"cu126", "cu128"}, front.address
        assert _resolved(front, repo) == "cu128", front.address


def test_the_front_lets_through_only_a_post_with_the_secret(site: Site) -> None:
    front = site.fronts[0]
    url = f"{front.url}/_notify"
    body = {"events": [{"action": "push", "target": {"repository": "notified/x"}}]}
    assert httpx.get(url, timeout=10).status_code == 403  # nginx: a POST only
    assert httpx.put(url, json=body, timeout=10).status_code == 403
    assert httpx.post(url, json=body, timeout=10).status_code == 401  # variant-proxy's
    wrong = {"Authorization": "Bearer not-the-secret-at-all"}
    assert httpx.post(url, json=body, headers=wrong, timeout=10).status_code == 401
    # nginx's 1 MiB, refused before variant-proxy reads a byte of it
    headers = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"}
    too_big = b"{" + b" " * (2 << 20) + b"}"
    refused = httpx.post(url, content=too_big, headers=headers, timeout=30)
    assert refused.status_code == 413 and "nginx" in refused.text, refused.text[:200]
    # a longer path is no /_notify: the exact-match location alone passes it on
    for path in ("/_notify/", "/_notifyx", "/_notify/x"):
        answer = httpx.post(f"{front.url}{path}", json=body, headers=headers, timeout=10)
        assert answer.status_code in (403, 404, 405), (path, answer.status_code)
    good = httpx.post(url, json=body, headers=headers, timeout=10)
    assert good.status_code == 200, good.text
    assert good.json() == {"invalidated": ["notified/x"]}
