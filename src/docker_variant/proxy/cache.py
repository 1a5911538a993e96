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
(each replica scanning for itself), a warning is logged, and it goes back to Redis once a
background probe finds Redis answering again. Across an outage it guarantees:
- an invalidation this replica saw while Redis was away is republished (generation bumped,
  shared entries deleted, every replica told) before this replica reads Redis again;
- a repository's generation never goes backwards in a replica: a replica that knows a newer
  generation than Redis (Redis restarted empty, say) raises Redis's to it and distrusts the
  shared entries until then, and one that finds Redis ahead drops what it holds locally;
- a replica never replaces an index it scanned itself while Redis was away with an older
  shared one (entries carry the wall-clock time of their scan).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import load_json
from docker_variant.variant import VariantIndex

__all__ = ["CachedIndex", "IndexStore", "Key", "LocalIndexStore", "RedisIndexStore", "open_store"]

_log = logging.getLogger("docker_variant.proxy")

Key = tuple[str, str]  # (repository, version)
DEFAULT_MAX_BYTES = 256 << 20  # ProxyLimits.cache_bytes
_INLINE_DECODE = 64 << 10  # a larger shared entry is decoded off the event loop
Listener = Callable[[str], None]


@dataclass(frozen=True)
class CachedIndex:
    index: VariantIndex
    body: bytes  # json.dumps(index.to_json(), sort_keys=True), encoded once
    expires: float
    anonymous: bool = False  # scanned without credentials: any anonymous caller may see it
    scanned_at: float = 0.0  # wall-clock time of the scan (time.time()), comparable across replicas


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
    """This process's indexes, at most ``max_entries`` whose documents take at most
    ``max_bytes`` together (LRU): one tenant's large indexes evict, they do not grow."""

    def __init__(
        self,
        ttl: float,
        *,
        max_entries: int = 4096,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self._bytes = 0
        self._entries: OrderedDict[Key, CachedIndex] = OrderedDict()
        self._generations: dict[str, int] = {}
        self._listeners: list[Listener] = []

    async def get(self, key: Key) -> CachedIndex | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry

    async def generation(self, name: str) -> int:
        return self._generations.get(name, 0)

    async def put(self, key: Key, entry: CachedIndex, generation: int) -> None:
        # A stale scan (the repository changed while it ran) must not be stored.
        if self.ttl > 0 and self._generations.get(key[0], 0) == generation:
            if len(entry.body) > self.max_bytes:
                return  # served, never kept
            self._remove(key)
            self._entries[key] = entry
            self._bytes += len(entry.body)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._remove(next(iter(self._entries)))

    def _remove(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry.body)

    def known(self, name: str) -> int:
        """The repository's generation as this process knows it."""
        return self._generations.get(name, 0)

    def forget(self, name: str) -> None:
        """An invalidation: the next generation, and the repository's entries dropped."""
        self.observe(name, self.known(name) + 1)

    def observe(self, name: str, generation: int) -> None:
        """Another store says the repository is at ``generation``: never go backwards, and
        drop the entries of an older one."""
        if generation > self.known(name):
            self._generations[name] = generation
            self.drop(name)

    def drop(self, name: str) -> None:
        for key in [k for k in self._entries if k[0] == name]:
            self._remove(key)

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
if tonumber(redis.call('GET', KEYS[1]) or '0') == tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  redis.call('SADD', KEYS[3], KEYS[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
"""
# Move the repository's generation to max(current + step, at_least); when it moved, delete the
# repository's entries and tell every replica "NAME GENERATION". Returns the generation.
# step 1 is an invalidation; step 0 only raises a generation Redis lost (a restart).
_ADVANCE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local generation = math.max(current + tonumber(ARGV[1]), tonumber(ARGV[2]))
if generation ~= current then
  redis.call('SET', KEYS[1], string.format('%d', generation))
  for _, key in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    redis.call('DEL', key)
  end
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' ' .. string.format('%d', generation))
end
return generation
"""
_PROBE_INTERVAL = 0.1  # seconds between looks for Redis while it is down
_REDIS_CONNECTIONS = 32
_CLOSE_WAIT = 1.0  # seconds that closing waits for the store's own tasks and connections
_MAX_GENERATION_DIGITS = 19  # an int64 counter; anything longer in Redis is not ours


def _generation_value(raw: object) -> int | None:
    """A generation as Redis holds it (bytes of digits; nothing is 0); None: not ours."""
    if raw is None:
        return 0
    if isinstance(raw, bytes | str) and 0 < len(raw) <= _MAX_GENERATION_DIGITS and raw.isdigit():
        return int(raw)
    return None


class RedisIndexStore:
    """Indexes in Redis, shared by every replica; the local store while Redis is down.

    ``url`` is redis-py's: ``redis://[[USER]:PASSWORD@]HOST:PORT/DB``, ``rediss://`` for
    TLS (the system's trust store), ``unix://PATH``. Redis is inside the proxy's trust
    boundary: whoever can write to it decides what every replica serves."""

    def __init__(
        self, url: str, ttl: float, *, client: Any = None, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        import redis.asyncio as aioredis

        self.ttl = ttl
        self.url = url
        # A bounded pool that makes callers wait for a connection: hundreds of concurrent
        # requests must not open hundreds of connections (nor fail with "too many").
        try:
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=_REDIS_CONNECTIONS,
                timeout=1.0,
                socket_timeout=1.0,
                socket_connect_timeout=1.0,
            )
            pool.connection_class(**pool.connection_kwargs)  # a bad option fails here, not later
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"--cache {self._safe_url()}: {exc}") from exc
        self._redis = client or aioredis.Redis(connection_pool=pool)
        self._local = LocalIndexStore(ttl, max_bytes=max_bytes)
        self._listeners: list[Listener] = []
        self._down = False
        self._unannounced: set[str] = set()  # invalidated while Redis was away
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._put = self._redis.register_script(_PUT_IF_CURRENT)
        self._advance = self._redis.register_script(_ADVANCE)

    # ------------------------------------------------------------------ plumbing

    async def _call(self, what: str, op: Callable[[], Awaitable[Any]], fallback: Any) -> Any:
        """``op()`` on Redis; on failure (or while it is known down) ``fallback``."""
        import redis.exceptions

        if self._down:
            return fallback
        try:
            return await op()
        except (redis.exceptions.RedisError, OSError) as exc:
            self._went_down(what, exc)
            return fallback

    def _went_down(self, what: str, exc: BaseException) -> None:
        if self._down:
            return
        _log.warning(
            "Redis at %s failed (%s: %s); serving from the local cache until it is back",
            self._safe_url(),
            what,
            exc,
        )
        self._down = True
        self._spawn(self._heal())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._closed:
            work.close()
            return
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _heal(self) -> None:
        """While Redis is down: probe it; once it answers, republish what was invalidated
        meanwhile, and only then read and write Redis again."""
        while True:
            await asyncio.sleep(_PROBE_INTERVAL)
            try:
                await self._redis.ping()
                while self._unannounced:
                    name = next(iter(self._unannounced))
                    await self._announce(name, step=1, at_least=self._local.known(name))
                    self._unannounced.discard(name)
            except asyncio.CancelledError:
                raise
            except Exception:  # still down (or failed again): look again soon
                continue
            self._down = False  # no await since the last look at _unannounced
            _log.warning("Redis at %s is back; the cache is shared again", self._safe_url())
            return

    async def _announce(self, name: str, *, step: int, at_least: int) -> int:
        """Advance the repository's generation in Redis (see ``_ADVANCE``) and here."""
        keys = [self._generation_key(name), f"{_PREFIX}:keys:{name}"]
        generation = int(await self._advance(keys=keys, args=[step, at_least, _CHANNEL, name]))
        self._local.observe(name, generation)
        return generation

    async def _agree(self, name: str, shared: int | None) -> bool:
        """Reconcile Redis's generation of ``name`` (``None``: unreadable) with this replica's;
        True when Redis's entries of ``name`` may be trusted."""
        known = self._local.known(name)
        if shared is not None and shared >= known:
            self._local.observe(name, shared)
            return True
        # Redis is behind what this replica saw (it restarted empty, or lost a write):
        # raise it, which also deletes the entries stored under the older generation.
        at_least = known + 1 if shared is None else known
        await self._call(
            "generation", lambda: self._announce(name, step=0, at_least=at_least), None
        )
        return False

    def _safe_url(self) -> str:
        scheme, sep, rest = self.url.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}"  # no password in the log

    @staticmethod
    def _entry_key(key: Key) -> str:
        return f"{_PREFIX}:index:{key[0]}:{key[1]}"

    @staticmethod
    def _generation_key(name: str) -> str:
        return f"{_PREFIX}:generation:{name}"

    def _decode(self, raw: object) -> CachedIndex | None:
        if not isinstance(raw, bytes | str):
            return None
        try:
            stored = load_json(raw, "cached index")
            body = stored["body"].encode()
            index = VariantIndex.from_json(load_json(body, "cached index"), "cached index")
            scanned_at = float(stored.get("scanned_at", 0.0))
        except (ValueError, KeyError, TypeError, AttributeError, InvalidInputError):
            return None  # not ours, or corrupt: scan again rather than serve it
        return CachedIndex(
            index,
            body,
            time.monotonic() + self.ttl,
            bool(stored.get("anonymous")),
            scanned_at,
        )

    # ------------------------------------------------------------------ the interface

    async def get(self, key: Key) -> CachedIndex | None:
        name = key[0]
        found = await self._call(
            "get",
            lambda: self._redis.mget(self._entry_key(key), self._generation_key(name)),
            None,
        )
        if found is None:
            return await self._local.get(key)
        raw, generation = found
        trusted = await self._agree(name, _generation_value(generation))
        shared = None
        if trusted and isinstance(raw, bytes | str) and len(raw) > _INLINE_DECODE:
            from docker_variant.oci.offload import off_loop

            shared = await off_loop(self._decode, raw)
        elif trusted:
            shared = self._decode(raw)
        # What this replica scanned while Redis was away, unless Redis has a newer scan.
        own = await self._local.get(key)
        if own is not None and (shared is None or own.scanned_at >= shared.scanned_at):
            return own
        return shared

    async def generation(self, name: str) -> int:
        value = await self._call(
            "generation", lambda: self._redis.get(self._generation_key(name)), False
        )
        if value is not False:
            await self._agree(name, _generation_value(value))
        return self._local.known(name)

    async def put(self, key: Key, entry: CachedIndex, generation: int) -> None:
        if self.ttl <= 0:
            return
        payload = json.dumps(
            {
                "body": entry.body.decode(),
                "anonymous": entry.anonymous,
                "scanned_at": entry.scanned_at,
            }
        )
        keys = [self._generation_key(key[0]), self._entry_key(key), f"{_PREFIX}:keys:{key[0]}"]
        args = [str(generation), payload, str(max(1, int(self.ttl * 1000)))]
        done = await self._call("put", lambda: self._put(keys=keys, args=args), False)
        if done is False:
            await self._local.put(key, entry, generation)

    async def invalidate(self, name: str) -> None:
        at_least = self._local.known(name) + 1
        announced = await self._call(
            "invalidate", lambda: self._announce(name, step=1, at_least=at_least), None
        )
        if announced is None:
            # No Redis: this replica knows now, every replica once Redis is back (_heal).
            self._local.forget(name)
            self._unannounced.add(name)
            for listener in self._listeners:
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
        self._spawn(self._listen())

    def _heard(self, data: object) -> None:
        """One invalidation message: ``NAME GENERATION`` (or a bare ``NAME``)."""
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        name, _, generation = text.partition(" ")
        value = _generation_value(generation.encode()) if generation else None
        if value:
            self._local.observe(name, value)
        else:
            self._local.drop(name)
        for listener in self._listeners:
            listener(name)

    async def _listen(self) -> None:
        """Invalidations from every replica (this one's too), for as long as the proxy runs;
        reconnects after Redis failures (a message missed meanwhile is caught up by the
        generation that every read compares)."""
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._heard(message.get("data"))
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis down: the local store serves; try again soon
                await asyncio.sleep(_PROBE_INTERVAL)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), _CLOSE_WAIT)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            # bounded: redis-py can sit on a cancelled connection attempt to a refusing server
            await asyncio.wait(list(self._tasks), timeout=_CLOSE_WAIT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._redis.aclose(), _CLOSE_WAIT)


def open_store(url: str | None, ttl: float, *, max_bytes: int = DEFAULT_MAX_BYTES) -> IndexStore:
    """``None``: this process's cache; ``redis://...`` (or ``rediss://``): a shared one
    (its fallback, while Redis is down, keeps at most ``max_bytes`` here)."""
    if url is None:
        return LocalIndexStore(ttl, max_bytes=max_bytes)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidInputError(f"--cache {url!r}: expected redis://HOST:PORT[/DB]")
    return RedisIndexStore(url, ttl, max_bytes=max_bytes)
