"""The ``_variants`` extension: index cache, the endpoint and transparent resolution.

Who may see an index is always the upstream's decision. A scan runs with the caller's own
``Authorization``; an index the caller did not scan itself (cached, or another caller's scan)
is handed out only after the upstream answers 2xx to a GET of one of the version's manifests
with that caller's ``Authorization`` (a one-tag listing when the index names no tag).

Concurrent misses of one (name, version) share one scan. A scan that started before a
manifest PUT/DELETE invalidated the repository is never stored, so an invalidation can
not be undone by a slow scan finishing after it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TypeGuard

import httpx
from starlette.requests import Request
from starlette.responses import Response

from docker_variant.errors import DockerVariantError, InvalidInputError
from docker_variant.jsondoc import load_json
from docker_variant.oci.client import RegistryClient
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    UpstreamUnavailableError,
)
from docker_variant.oci.extension import (
    DEVICES_HEADER,
    EXTENSION,
    LABEL_HEADER,
    PROPERTIES_HEADER,
)
from docker_variant.oci.grammar import is_digest
from docker_variant.oci.offload import off_loop
from docker_variant.oci.scan import read_version
from docker_variant.proxy.cache import CachedIndex, IndexStore, Key
from docker_variant.proxy.metrics import ProxyMetrics
from docker_variant.proxy.names import Route, RouteKind
from docker_variant.proxy.passthrough import BorrowedTransport, Upstream, proxy_base_url
from docker_variant.proxy.responses import failure_response
from docker_variant.server.errors import JSON, error_kind, oci_error
from docker_variant.variant import SupportedLists, VariantIndex, select
from docker_variant.variant.devices import for_devices
from docker_variant.variant.model import parse_supported_lists
from docker_variant.variant.platform import platform_of_lists

__all__ = ["VariantService", "discover_document"]

_MAX_PROPERTIES_HEADER = 64 << 10
#: X-Variant-Devices lists each *different* device once: a node has a few kinds at most.
MAX_DEVICE_LISTS = 64
_SCAN_CONCURRENCY = 8
_CLAIM_POLL = 0.02  # seconds between looks for another replica's scan result


def discover_document() -> dict[str, object]:
    """The OCI extensions discovery answer (``GET /v2/_oci/ext/discover``)."""
    return {
        "extensions": [
            {
                "name": EXTENSION,
                "url": "https://peps.python.org/pep-0825/",
                "description": (
                    "PEP 817/825 variant index of an image version: "
                    "GET /v2/<name>/_variants/<version> returns variants.json plus "
                    "'images', 'bare' and 'invalid'; HEAD/GET /v2/<name>/manifests/<version> "
                    "with X-Variant-Properties returns the best variant's manifest"
                ),
                "endpoints": [EXTENSION],
            }
        ]
    }


class VariantService:
    def __init__(self, upstream: Upstream, cache: IndexStore, metrics: ProxyMetrics) -> None:
        self.upstream = upstream
        self.cache = cache
        self.metrics = metrics
        self._flights: dict[Key, asyncio.Task[CachedIndex]] = {}
        cache.subscribe(self._drop_flights)  # invalidations from other replicas too

    async def invalidate(self, name: str) -> None:
        """The repository changed: drop its indexes here and in every replica."""
        self._drop_flights(name)
        await self.cache.invalidate(name)
        self.metrics.invalidations.inc()

    def _drop_flights(self, name: str) -> None:
        # Later callers must not join a scan that may predate the change.
        for key in [k for k in self._flights if k[0] == name]:
            del self._flights[key]

    async def index_for(self, request: Request, name: str, version: str) -> CachedIndex | Response:
        """The index of ``name:version`` for this caller, or the response refusing it.

        An index this caller did not scan itself (cached, or another caller's scan) is
        only handed out after the upstream lets this caller read one of its images.
        """
        what = f"variant index of {name}:{version}"
        authorization = request.headers.get("authorization")
        key = (name, version)
        # `Cache-Control: no-cache` (sent by `docker variant push`) asks for a fresh scan; it
        # joins a scan already running, so one version has at most one scan at a time and
        # a storm of such requests costs one scan.
        fresh = "no-cache" in request.headers.get("cache-control", "").lower()
        shared = None if fresh else await self.cache.get(key)
        if shared is not None:
            self.metrics.cache_hits.inc()
        else:
            self.metrics.cache_misses.inc()
            flight = self._flights.get(key)
            if flight is not None:
                try:
                    shared = await asyncio.shield(flight)
                except (RegistryAuthError, NotFoundError):
                    shared = None  # the owner's refusal need not be ours: scan ourselves
                except Exception as exc:
                    # upstream trouble is everyone's: no stampede of retries
                    self.metrics.upstream_errors.labels(error_kind(exc)).inc()
                    return failure_response(exc, what)
        if _shareable(shared, authorization):
            return shared  # scanned with no credentials, as this caller has none
        if shared is not None:
            verdict = await self._authorise(request, name, shared.index, authorization, what)
            if verdict is True:
                return shared
            if isinstance(verdict, Response):
                return verdict
            # else: the probed tag is gone; the cached index is stale, so scan afresh

        own = asyncio.ensure_future(self._scan(name, version, authorization, fresh=fresh))
        own.add_done_callback(_consume)
        if key not in self._flights:
            self._flights[key] = own
            own.add_done_callback(lambda task: self._land(key, task))
        try:
            # shielded: a caller hanging up does not cancel a scan others may be waiting on
            return await asyncio.shield(own)
        except Exception as exc:
            self.metrics.upstream_errors.labels(error_kind(exc)).inc()
            return failure_response(exc, what)

    async def _authorise(
        self,
        request: Request,
        name: str,
        index: VariantIndex,
        authorization: str | None,
        what: str,
    ) -> bool | Response:
        """True: the caller may read ``name``; a Response: the upstream's refusal (or a
        gateway error); False: inconclusive (the probed tag is gone), so scan instead."""
        try:
            status, answer = await self.upstream.check_pull(
                name, _probe_tag(index), authorization, proxy_base_url(request.scope)
            )
        except (httpx.HTTPError, TimeoutError) as exc:
            self.metrics.upstream_errors.labels(error_kind(exc)).inc()
            return failure_response(_as_registry_error(exc, self.upstream.base_url), what)
        if answer is None:
            return True
        if status in (401, 403, 429):
            return answer
        return False

    def _land(self, key: Key, task: asyncio.Task[CachedIndex]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]

    async def _scan(
        self, name: str, version: str, authorization: str | None, *, fresh: bool = False
    ) -> CachedIndex:
        key = (name, version)
        # Across replicas one scans a cold version and the others wait for its result.
        deadline = time.monotonic() + self.upstream.timeout
        while not await self.cache.claim(key, self.upstream.timeout):
            await asyncio.sleep(_CLAIM_POLL)
            ready = await self.cache.get(key)
            if _shareable(ready, authorization):
                return ready  # another replica's anonymous scan, for an anonymous caller
            if ready is not None or time.monotonic() > deadline:
                break  # scan with our own credentials, or the other replica is stuck
        try:
            # another replica may have stored it between our miss and our claim (unless the
            # caller asked for a fresh scan: then that entry is what it wants replaced)
            ready = None if fresh else await self.cache.get(key)
            if _shareable(ready, authorization):
                return ready
            return await self._scan_upstream(name, version, authorization)
        finally:
            await self.cache.release(key)

    async def _scan_upstream(
        self, name: str, version: str, authorization: str | None
    ) -> CachedIndex:
        generation = await self.cache.generation(name)
        self.metrics.scans.inc()
        headers = {"Authorization": authorization} if authorization else None
        async with (
            asyncio.timeout(self.upstream.timeout),
            RegistryClient(
                self.upstream.base_url,
                headers=headers,
                timeout=self.upstream.timeout,
                max_concurrency=_SCAN_CONCURRENCY,
                transport=BorrowedTransport(self.upstream.transport),
                # 429s are waited out only well within the scan's own deadline
                rate_limit_wait=self.upstream.timeout / 3,
                limits=self.upstream.limits.reads(),
            ) as client,
        ):
            index = await read_version(client, name, version)
            body = await off_loop(_document, index)  # a large index: off the event loop
        limit = self.upstream.limits.index_bytes
        if len(body) > limit:
            raise DockerVariantError(
                f"the index document is {len(body)} bytes; at most {limit} are served "
                "(--limit index-bytes)"
            )
        entry = CachedIndex(
            index, body, time.monotonic() + self.cache.ttl, authorization is None, time.time()
        )
        await self.cache.put((name, version), entry, generation)
        return entry

    async def variants_endpoint(self, request: Request, route: Route) -> Response:
        assert route.name is not None and route.reference is not None
        started = time.perf_counter()
        result = await self.index_for(request, route.name, route.reference)
        if isinstance(result, Response):
            return result
        self.metrics.variants_latency.observe(time.perf_counter() - started)
        if result.index.is_empty:
            # as the manifest of a missing tag: an error, not a document with nothing in it
            return oci_error(
                ErrorCode.MANIFEST_UNKNOWN,
                f"{route.name}: no image tagged {route.reference} or {route.reference}-<label>",
            )
        return Response(result.body, media_type=JSON, headers={"Cache-Control": "no-store"})

    async def resolve_manifest(self, request: Request, route: Route, header: str) -> Response:
        """HEAD/GET of ``manifests/<version>`` with ``X-Variant-Properties``: the manifest of
        the best variant for the caller's host, labelled with ``X-Variant-Label``."""
        assert route.name is not None and route.reference is not None
        if is_digest(route.reference):
            return await self.upstream.serve_manifest(request, route, {})  # content addressed
        try:
            if len(header) > _MAX_PROPERTIES_HEADER:
                raise InvalidInputError(f"longer than {_MAX_PROPERTIES_HEADER} bytes")
            what = "X-Variant-Properties header"
            host = parse_supported_lists(load_json(header, what), what)
        except (ValueError, InvalidInputError) as exc:
            return oci_error(
                ErrorCode.MANIFEST_INVALID,
                f"invalid X-Variant-Properties header: {exc}; expected compact JSON "
                '{"namespace": {"feature": ["value", ...]}}',
                {"header": PROPERTIES_HEADER},
            )
        devices_header = request.headers.get(DEVICES_HEADER)
        try:
            devices = _device_lists(devices_header) if devices_header is not None else []
        except (ValueError, InvalidInputError) as exc:
            return oci_error(
                ErrorCode.MANIFEST_INVALID,
                f"invalid {DEVICES_HEADER} header: {exc}; expected a compact JSON array of "
                f'1 to {MAX_DEVICE_LISTS} {{"namespace": {{"feature": ["value", ...]}}}}',
                {"header": DEVICES_HEADER},
            )
        result = await self.index_for(request, route.name, route.reference)
        if isinstance(result, Response):
            return result
        index = result.index
        if not index.variants and index.bare is None:
            return await self.upstream.serve_manifest(request, route, {})  # not a variant version
        # The header's CPU namespace says the caller's platform (docs/reference/image-index.md).
        platform = platform_of_lists(host)
        # a node whose devices differ: a variant must fit each (ranked by their merged lists)
        rank, per_device = for_devices(host, {f"{i}": d for i, d in enumerate(devices)})
        try:
            selection = select(index, rank, platform, per_device)
        except InvalidInputError as exc:
            return oci_error(ErrorCode.MANIFEST_INVALID, f"X-Variant-Properties header: {exc}")
        best = selection.best
        if best is None:
            reasons = "; ".join(f"{c.label or c.tag}: {c.reason}" for c in selection.rejected)
            return oci_error(
                ErrorCode.MANIFEST_UNKNOWN,
                f"no variant of {route.name}:{route.reference} fits the host described by "
                f"X-Variant-Properties ({reasons or 'the version has no images'})",
                {c.label or c.tag: c.reason for c in selection.rejected},
            )
        extra = {"Vary": f"{PROPERTIES_HEADER}, {DEVICES_HEADER}"}
        if best.label is not None:  # the bare image has no label: the header is left out
            extra[LABEL_HEADER] = best.label
        # By digest where the tag would not name this image: a platform's manifest inside
        # a multi-platform tag, or the bare image that a variant image index replaced. A
        # header with no CPU namespace says no platform: an image of several platforms then
        # goes as its tag's index, for the caller to pick its own (the version's tag, when
        # the bare image is that image, whose first entry for each platform is the bare one).
        image = index.bare if best.label is None else index.images.get(best.label)
        unplaced = best.platform is None and image is not None and len(image.platforms) > 1
        by_digest = (
            best.digest
            and not unplaced
            and (best.platform is not None or best.tag == route.reference)
        )
        target = Route(RouteKind.MANIFEST, route.name, best.digest if by_digest else best.tag)
        return await self.upstream.serve_manifest(request, target, extra)


def _document(index: VariantIndex) -> bytes:
    return json.dumps(index.to_json(), sort_keys=True).encode()


def _shareable(entry: CachedIndex | None, authorization: str | None) -> TypeGuard[CachedIndex]:
    """An index scanned without credentials may go to a caller without them as it is: the
    upstream gave it to anyone."""
    return entry is not None and entry.anonymous and authorization is None


def _probe_tag(index: VariantIndex) -> str | None:
    """A tag the index says exists, to ask the upstream whether the caller may pull it."""
    if index.bare is not None:
        return index.bare.tag
    for _label, image in sorted(index.images.items()):
        return image.tag
    for invalid in index.invalid:
        return invalid.tag
    return None


def _consume(task: asyncio.Task[CachedIndex]) -> None:
    # A failed shared scan may have no waiter left; read its error so asyncio stays quiet.
    if not task.cancelled():
        task.exception()


def _as_registry_error(exc: BaseException, base_url: str) -> BaseException:
    """An httpx failure of the authorisation request, as the scan would have reported it."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        error: Exception = UpstreamUnavailableError(
            f"registry at {base_url} timed out", url=base_url
        )
    elif isinstance(exc, httpx.RemoteProtocolError | httpx.DecodingError):
        error = BadUpstreamResponseError(
            f"registry at {base_url} sent a malformed response: {exc}", url=base_url
        )
    else:
        error = UpstreamUnavailableError(
            f"registry at {base_url} is unreachable: {exc or type(exc).__name__}", url=base_url
        )
    error.__cause__ = exc
    return error


def _device_lists(header: str) -> list[SupportedLists]:
    """``X-Variant-Devices``: each different device's lists, a JSON array."""
    if len(header) > _MAX_PROPERTIES_HEADER:
        raise InvalidInputError(f"longer than {_MAX_PROPERTIES_HEADER} bytes")
    what = f"{DEVICES_HEADER} header"
    data = load_json(header, what)
    if not isinstance(data, list) or not 1 <= len(data) <= MAX_DEVICE_LISTS:
        raise InvalidInputError(f"not an array of 1 to {MAX_DEVICE_LISTS} lists")
    return [parse_supported_lists(lists, f"{what}[{i}]") for i, lists in enumerate(data)]
