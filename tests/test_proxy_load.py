"""variant-proxy under concurrent load: bounded in time, no errors, intact blobs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time

import httpx
import pytest

from conftest import RunningRegistry
from docker_variant.oci import scan_index_sync
from imaging import ImageBuilder, push_blob
from proxyrunner import ProxyServer

pytestmark = pytest.mark.e2e

VARIANTS_REQUESTS = 500
BLOB_PULLS = 100
DEADLINE_S = 120


def test_concurrent_variants_requests(
    registry: RunningRegistry, image_builder: ImageBuilder
) -> None:
    repo = "load/app"
    for label, value in (("cu128", "12.8"), ("cu126", "12.6"), ("cu124", "12.4")):
        image_builder.build_and_push(
            f"{registry.host}/{repo}:5.0-{label}",
            {
                "dev.pep817.variant-label": label,
                "dev.pep817.variant.nvidia.cuda_version_lower_bound": value,
            },
        )
    expected = json.dumps(scan_index_sync(registry.url, repo, "5.0").to_json(), sort_keys=True)

    async def hammer(url: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=VARIANTS_REQUESTS)
        async with httpx.AsyncClient(limits=limits, timeout=DEADLINE_S) as client:
            calls = [client.get(url) for _ in range(VARIANTS_REQUESTS)]
            return await asyncio.wait_for(asyncio.gather(*calls), DEADLINE_S)

    with ProxyServer(registry.url, cache_ttl=3600) as proxy:  # a cold cache
        started = time.monotonic()
        answers = asyncio.run(hammer(f"{proxy.url}/v2/{repo}/_variants/5.0"))
        elapsed = time.monotonic() - started
        assert [a.status_code for a in answers] == [200] * VARIANTS_REQUESTS
        assert {a.text for a in answers} == {expected}
        # concurrent misses shared one scan of the upstream
        assert proxy.sample("variant_proxy_scans_total") == 1
        assert proxy.sample("variant_proxy_variants_seconds_count") == VARIANTS_REQUESTS
    assert elapsed < DEADLINE_S


def test_concurrent_blob_pulls(registry: RunningRegistry) -> None:
    blobs = {}
    for i in range(10):
        data = os.urandom((1 << 20) + i * 4099)
        blobs[push_blob(registry.url, "load/blobs", data)] = len(data)
    digests = list(blobs) * (BLOB_PULLS // len(blobs))

    async def pull(client: httpx.AsyncClient, digest: str) -> tuple[str, int, str]:
        hasher = hashlib.sha256()
        async with client.stream("GET", f"/v2/load/blobs/blobs/{digest}") as answer:
            async for chunk in answer.aiter_bytes():
                hasher.update(chunk)
            return "sha256:" + hasher.hexdigest(), answer.status_code, digest

    async def pull_all(url: str) -> list[tuple[str, int, str]]:
        limits = httpx.Limits(max_connections=BLOB_PULLS)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=DEADLINE_S) as client:
            calls = [pull(client, d) for d in digests]
            return await asyncio.wait_for(asyncio.gather(*calls), DEADLINE_S)

    with ProxyServer(registry.url) as proxy:
        started = time.monotonic()
        results = asyncio.run(pull_all(proxy.url))
        elapsed = time.monotonic() - started
    assert len(results) == BLOB_PULLS
    for got, status, digest in results:
        assert status == 200
        assert got == digest
    assert elapsed < DEADLINE_S
