"""The shared index cache on a protected Redis: TLS (``rediss://``) and an ACL user of its own
(credentials in the URL), as an operator should run it; Redis is inside the proxy's trust
boundary (whoever writes to it decides what every replica serves)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import devstack
from docker_variant.errors import InvalidInputError
from docker_variant.proxy.cache import CachedIndex, RedisIndexStore, open_store
from docker_variant.variant import VariantIndex
from proxyrunner import eventually
from tlsca import CertificateAuthority

PASSWORD = "proxy-password-for-tests-4521"
# The proxy's own user: its keys and channel only; the default user is off.
ACL = [
    "--user", "default", "off",
    "--user", "proxy", "on", f">{PASSWORD}", "~variant-proxy:*", "&variant-proxy:*",
    "+@all", "-@dangerous",
]  # fmt: skip


@dataclass
class ProtectedRedis:
    port: int
    ca: Path

    def url(self, user: str = "proxy", password: str = PASSWORD) -> str:
        return f"rediss://{user}:{password}@127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"


@pytest.fixture(scope="module")
def protected_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProtectedRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/setup installs it)")
    root = tmp_path_factory.mktemp("redis-tls")
    authority = CertificateAuthority(root / "ca")
    server = authority.server()
    port = devstack.free_port()
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(server.cert), "--tls-key-file", str(server.key),
         "--tls-ca-cert-file", str(authority.ca), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(root), *ACL],
        stdout=(root / "redis.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    protected = ProtectedRedis(port, authority.ca)
    try:
        eventually(lambda: _answers(protected.url()), 15.0, "redis-server on TLS")
        yield protected
    finally:
        process.terminate()
        process.wait(timeout=15)


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.exceptions.RedisError:
        return False


def _entry(ttl: float) -> CachedIndex:
    index = VariantIndex.from_json({"default-priorities": {"namespace": []}, "variants": {}}, "t")
    body = b'{"variants": {}}'
    return CachedIndex(index, body, time.monotonic() + ttl, True, time.time())


def test_replicas_share_the_cache_over_tls_as_their_own_acl_user(
    protected_redis: ProtectedRedis,
) -> None:
    async def scenario() -> None:
        one, two = open_store(protected_redis.url(), 60), open_store(protected_redis.url(), 60)
        heard: list[str] = []
        two.subscribe(heard.append)
        await one.start()
        await two.start()
        try:
            key = ("tls/app", "1.0")
            generation = await one.generation(key[0])
            await one.put(key, _entry(60), generation)
            shared = await two.get(key)
            assert shared is not None and shared.body == b'{"variants": {}}'
            await one.invalidate(key[0])
            deadline = time.monotonic() + 10
            while "tls/app" not in heard:  # published through Redis, over TLS
                assert time.monotonic() < deadline, "the invalidation did not reach replica two"
                await asyncio.sleep(0.01)
            assert await two.get(key) is None
            assert await two.generation(key[0]) == generation + 1
        finally:
            await one.close()
            await two.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("wrong", ["password", "plain-text", "user"])
def test_a_refused_connection_degrades_to_the_local_cache_and_logs_no_password(
    protected_redis: ProtectedRedis, wrong: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = {
        "password": protected_redis.url(password="not-the-password"),
        "plain-text": f"redis://proxy:{PASSWORD}@127.0.0.1:{protected_redis.port}/0",
        "user": protected_redis.url(user="default"),
    }[wrong]

    async def scenario() -> None:
        store = RedisIndexStore(url, 60)
        await store.start()
        try:
            key = ("tls/denied", "1.0")
            generation = await store.generation(key[0])
            await store.put(key, _entry(60), generation)
            assert await store.get(key) is not None  # from this replica's own cache
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="docker_variant.proxy"):
        asyncio.run(scenario())
    assert "serving from the local cache" in caplog.text
    assert "not-the-password" not in caplog.text and PASSWORD not in caplog.text


def test_an_option_redis_does_not_take_is_refused_at_start() -> None:
    with pytest.raises(InvalidInputError, match="ssl_ca_certs") as refused:
        open_store(f"redis://proxy:{PASSWORD}@127.0.0.1:1/0?ssl_ca_certs=/x", 60)
    assert PASSWORD not in str(refused.value)
