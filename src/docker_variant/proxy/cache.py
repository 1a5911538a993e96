"""Where the proxy keeps variant indexes: one small interface, ``IndexStore``, with one local
implementation (this process, the default) and one Redis implementation that replicas share.
``VariantService`` does not know which one it has.

The interface holds what replicas must agree on:
- cached documents by (repository, version), for at most ``ttl`` seconds;
- a generation per repository, bumped by every invalidation, so that a scan that started
  before a change is never stored (``put`` takes the generation the scan started under);
- who scans a cold version (``claim``/``release``), so N replicas cost one upstream scan;
- invalidations, announced to every replica (``subscribe``).

``RedisIndexStore`` degrades to its local store when Redis is down: callers keep being served
(each replica scanning for itself), a warning is logged, and it goes back to Redis once Redis
answers again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from docker_variant.variant import VariantIndex

__all__ = ["CachedIndex", "IndexStore", "Key", "LocalIndexStore", "RedisIndexStore", "open_store"]

_log = logging.getLogger("docker_variant.proxy")

Key = tuple[str, str]  # (repository, version)
Listener = Callable[[str], None]


@dataclass(frozen=True)
class CachedIndex:
    index: VariantIndex
    body: bytes  # json.dumps(index.to_json(), sort_keys=True), encoded once
    expires: float
    anonymous: bool = False  # scanned without credentials: any anonymous caller may see it


class IndexStore(Protocol):
    ttl: float

    async def get(self, key: Key) -> CachedIndex | None: ...
    async def generation(self, name: str) -> int: ...
    async def put(self, key: Key, entry: CachedIndex, generation: int) -> None: ...
    async def invalidate(self, name: str) -> None: ...
    async def claim(self, key: Key, seconds: float) -> bool: ...
    async def release(self, key: Key) -> None: ...
    def subscribe(self, listener: Listener) -> None: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...


class LocalIndexStore:
    """This process's indexes, at most ``max_entries`` (LRU)."""

    def __init__(
        self,
        ttl: float,
        *,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[Key, CachedIndex] = OrderedDict()
        self._generations: dict[str, int] = {}
        self._listeners: list[Listener] = []

    async def get(self, key: Key) -> CachedIndex | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    async def generation(self, name: str) -> int:
        return self._generations.get(name, 0)

    async def put(self, key: Key, entry: CachedIndex, generation: int) -> None:
        # A stale scan (the repository changed while it ran) must not be stored.
        if self.ttl > 0 and self._generations.get(key[0], 0) == generation:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget(self, name: str) -> None:
        self._generations[name] = self._generations.get(name, 0) + 1
        for key in [k for k in self._entries if k[0] == name]:
            del self._entries[key]

    async def invalidate(self, name: str) -> None:
        self.forget(name)
        for listener in self._listeners:
            listener(name)

    async def claim(self, key: Key, seconds: float) -> bool:
        return True  # one process: its own in-flight scans are joined by the service

    async def release(self, key: Key) -> None:
        return None

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


_PREFIX = "variant-proxy"
_CHANNEL = f"{_PREFIX}:invalidate"
# SET the entry only while the repository's generation is the one the scan started under.
_PUT_IF_CURRENT = """
if (redis.call('GET', KEYS[1]) or '0') == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  redis.call('SADD', KEYS[3], KEYS[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
"""
_RETRY_AFTER = 5.0  # seconds between attempts to go back to Redis after it failed
_REDIS_CONNECTIONS = 32


class RedisIndexStore:
    """Indexes in Redis, shared by every replica; the local store while Redis is down."""

    def __init__(self, url: str, ttl: float, *, client: Any = None) -> None:
        import redis.asyncio as aioredis

        self.ttl = ttl
        self.url = url
        # A bounded pool that makes callers wait for a connection: hundreds of concurrent
        # requests must not open hundreds of connections (nor fail with "too many").
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=_REDIS_CONNECTIONS,
            timeout=1.0,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
        )
        self._redis = client or aioredis.Redis(connection_pool=pool)
        self._local = LocalIndexStore(ttl)
        self._listeners: list[Listener] = []
        self._down_since: float | None = None
        self._subscriber: asyncio.Task[None] | None = None
        self._put = self._redis.register_script(_PUT_IF_CURRENT)

    # ------------------------------------------------------------------ plumbing

    async def _call(self, what: str, op: Callable[[], Awaitable[Any]], fallback: Any) -> Any:
        """``op()`` on Redis; on failure (or while it is known down) ``fallback``."""
        import redis.exceptions

        now = time.monotonic()
        if self._down_since is not None and now - self._down_since < _RETRY_AFTER:
            return fallback
        try:
            result = await op()
        except (redis.exceptions.RedisError, OSError) as exc:
            if self._down_since is None:
                _log.warning(
                    "Redis at %s failed (%s: %s); serving from the local cache until it is back",
                    self._safe_url(),
                    what,
                    exc,
                )
            self._down_since = now
            return fallback
        if self._down_since is not None:
            _log.warning("Redis at %s is back; the cache is shared again", self._safe_url())
            self._down_since = None
        return result

    def _safe_url(self) -> str:
        scheme, sep, rest = self.url.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}"  # no password in the log

    @staticmethod
    def _entry_key(key: Key) -> str:
        return f"{_PREFIX}:index:{key[0]}:{key[1]}"

    @staticmethod
    def _generation_key(name: str) -> str:
        return f"{_PREFIX}:generation:{name}"

    # ------------------------------------------------------------------ the interface

    async def get(self, key: Key) -> CachedIndex | None:
        raw = await self._call("get", lambda: self._redis.get(self._entry_key(key)), False)
        if raw is False:
            return await self._local.get(key)
        if raw is None:
            return None
        try:
            stored = json.loads(raw)
            body = stored["body"].encode()
            index = VariantIndex.from_json(json.loads(body), "cached index")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not ours, or corrupt: scan again rather than serve it
        return CachedIndex(index, body, time.monotonic() + self.ttl, bool(stored.get("anonymous")))

    async def generation(self, name: str) -> int:
        value = await self._call(
            "generation", lambda: self._redis.get(self._generation_key(name)), False
        )
        if value is False:
            return await self._local.generation(name)
        return int(value or 0)

    async def put(self, key: Key, entry: CachedIndex, generation: int) -> None:
        if self.ttl <= 0:
            return
        payload = json.dumps({"body": entry.body.decode(), "anonymous": entry.anonymous})
        keys = [self._generation_key(key[0]), self._entry_key(key), f"{_PREFIX}:keys:{key[0]}"]
        args = [str(generation), payload, str(max(1, int(self.ttl * 1000)))]
        done = await self._call("put", lambda: self._put(keys=keys, args=args), False)
        if done is False:
            await self._local.put(key, entry, generation)

    async def invalidate(self, name: str) -> None:
        self._local.forget(name)

        async def announce() -> bool:
            members_key = f"{_PREFIX}:keys:{name}"
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.incr(self._generation_key(name))
                pipe.smembers(members_key)
                _, members = await pipe.execute()
            if members:
                await self._redis.delete(*members, members_key)
            await self._redis.publish(_CHANNEL, name)
            return True

        if await self._call("invalidate", announce, False) is False:
            for listener in self._listeners:  # no Redis: at least this replica knows
                listener(name)

    async def claim(self, key: Key, seconds: float) -> bool:
        lock = f"{_PREFIX}:scanning:{key[0]}:{key[1]}"
        ms = max(1, int(seconds * 1000))
        got = await self._call("claim", lambda: self._redis.set(lock, "1", nx=True, px=ms), True)
        return bool(got)

    async def release(self, key: Key) -> None:
        lock = f"{_PREFIX}:scanning:{key[0]}:{key[1]}"
        await self._call("release", lambda: self._redis.delete(lock), None)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        self._subscriber = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        """Invalidations from every replica (this one's too), for as long as the proxy runs;
        reconnects after Redis failures."""
        while True:
            try:
                pubsub = self._redis.pubsub()
                await pubsub.subscribe(_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    data = message.get("data")
                    name = data.decode() if isinstance(data, bytes) else str(data)
                    self._local.forget(name)
                    for listener in self._listeners:
                        listener(name)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis down: the local store serves; try again soon
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        if self._subscriber is not None:
            self._subscriber.cancel()
            await asyncio.gather(self._subscriber, return_exceptions=True)
        await self._redis.aclose()


def open_store(url: str | None, ttl: float) -> IndexStore:
    """``None``: this process's cache; ``redis://...`` (or ``rediss://``): a shared one."""
    if url is None:
        return LocalIndexStore(ttl)
    from docker_variant.errors import InvalidInputError

    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidInputError(f"--cache {url!r}: expected redis://HOST:PORT[/DB]")
    return RedisIndexStore(url, ttl)
