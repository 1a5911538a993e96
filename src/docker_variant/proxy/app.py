"""The ``variant-proxy`` ASGI app: distribution API pass-through plus ``_variants``."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route as StarletteRoute
from starlette.types import Receive, Scope, Send

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.jsondoc import load_json
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.grammar import name_problem
from docker_variant.openapi import document as openapi_document
from docker_variant.proxy.blobrelay import DEFAULT_RELAY_MODE, RELAY_MODES
from docker_variant.proxy.cache import open_store
from docker_variant.proxy.handoff import QuickCycle, QuickReads
from docker_variant.proxy.metrics import (
    CONTENT_TYPE_LATEST,
    AccessLines,
    AccessLog,
    ProxyMetrics,
    RequestLog,
    Sent,
)
from docker_variant.proxy.names import PathError, Route, RouteKind, parse_v2_path
from docker_variant.proxy.passthrough import Upstream
from docker_variant.proxy.quickread import start_quick_read
from docker_variant.proxy.variants import (
    PROPERTIES_HEADER,
    VariantService,
    discover_document,
)
from docker_variant.server.auth import bearer_token
from docker_variant.server.bodies import BodyTooLargeError, read_body
from docker_variant.server.errors import oci_error

_log = logging.getLogger("docker_variant.proxy")

__all__ = ["DEFAULT_CACHE_TTL", "DEFAULT_UPSTREAM_TIMEOUT", "check_upstream_url", "create_app"]

_NOTIFY_LIMIT = 1 << 20  # a notification envelope; distribution batches a few events

DEFAULT_CACHE_TTL = 30.0
DEFAULT_UPSTREAM_TIMEOUT = 30.0
# Starlette would default a function endpoint to GET only.
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def check_upstream_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without credentials, query or fragment."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidInputError(f"invalid upstream URL {url!r}: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidInputError(
            f"invalid upstream URL {url!r}: expected http://host[:port] or https://host[:port]"
        )
    if parsed.userinfo or parsed.query or parsed.fragment:
        raise InvalidInputError(
            f"invalid upstream URL {url!r}: no credentials, query or fragment allowed "
            "(callers' own credentials are forwarded)"
        )
    if parsed.path.rstrip("/").endswith("/v2"):
        raise InvalidInputError(
            f"invalid upstream URL {url!r}: give the registry's base URL, without /v2"
        )
    return str(parsed).rstrip("/")


def create_app(
    upstream_url: str,
    cache_ttl: float = DEFAULT_CACHE_TTL,
    *,
    upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT,
    connect_timeout: float = 10.0,
    max_connections: int = 256,
    cache_url: str | None = None,
    notify_secret: str | None = None,
    blob_relay: str = DEFAULT_RELAY_MODE,
    access_lines: AccessLines | None = None,
) -> Starlette:
    """The proxy for ``upstream_url``; ``cache_ttl`` bounds how stale an index may be
    (0 disables the cache); ``upstream_timeout`` bounds an index scan and the wait for
    the headers of a pass-through answer (blob bodies are never timed).

    ``cache_url`` (``redis://...``) shares the index cache with other replicas; ``None``
    keeps it in this process. ``notify_secret`` enables ``POST /_notify`` for the
    registry's notification webhook, called with ``Authorization: Bearer <secret>``.
    ``blob_relay`` is how large blob bodies go down (``blobrelay.RELAY_MODES``).
    ``access_lines``: where the access log's lines go (the server's stderr, in batches);
    without it they are records of the ``metrics.ACCESS_LOGGER`` logger."""
    base_url = check_upstream_url(upstream_url)
    if cache_ttl < 0:
        raise InvalidInputError(f"cache TTL must be >= 0 seconds, got {cache_ttl}")
    if upstream_timeout <= 0:
        raise InvalidInputError(f"upstream timeout must be > 0 seconds, got {upstream_timeout}")
    if blob_relay not in RELAY_MODES:
        raise InvalidInputError(
            f"invalid blob relay {blob_relay!r}: expected one of {', '.join(RELAY_MODES)}"
        )
    metrics = ProxyMetrics()
    cache = open_store(cache_url, cache_ttl)
    state: dict[str, Any] = {}

    def service() -> VariantService:
        service: VariantService = state["service"]
        return service

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        upstream = Upstream(
            base_url,
            timeout=upstream_timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            blob_relay=blob_relay,
        )
        state["service"] = VariantService(upstream, cache, metrics)
        await cache.start()
        try:
            yield
        finally:
            await cache.close()
            await upstream.aclose()
            requests.flush()

    async def dispatch(request: Request) -> Response:
        raw = request.scope.get("raw_path")
        raw_path = raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path
        try:
            route = parse_v2_path(raw_path)
        except PathError as exc:
            return oci_error(exc.status, exc.code, exc.message, exc.detail)
        return await _handle(service(), request, route)

    async def healthz(request: Request) -> Response:
        """``ok``; with ``?upstream=1`` also whether the upstream answers. Anyone may ask, so
        the answer never names the upstream (its address and errors go to the log)."""
        if request.query_params.get("upstream") not in ("1", "true", "yes"):
            return PlainTextResponse("ok")
        upstream = service().upstream
        started = time.perf_counter()
        report: dict[str, object]
        try:
            probe = await upstream.probe()
        except (httpx.HTTPError, TimeoutError) as exc:
            _log.warning("health probe of %s failed: %s", upstream.base_url, one_line(str(exc)))
            report = {"reachable": False, "error": type(exc).__name__}
        else:
            # 401 is a healthy registry asking for credentials
            report = {"reachable": probe.status_code in (200, 401), "status": probe.status_code}
        report["latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
        ok = bool(report["reachable"])
        return JSONResponse(
            {"status": "ok" if ok else "upstream unreachable", "upstream": report},
            status_code=200 if ok else 503,
        )

    async def metrics_endpoint(_request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def openapi(_request: Request) -> Response:
        return Response(openapi_document("proxy"), media_type="application/json")

    async def notify(request: Request) -> Response:
        """distribution's notification webhook: each push or delete event invalidates its
        repository's indexes, in every replica."""
        if notify_secret is None:
            return oci_error(
                404, ErrorCode.UNSUPPORTED, "notifications are not enabled (--notify-secret)"
            )
        given = bearer_token(request)
        if given is None or not hmac.compare_digest(given.encode(), notify_secret.encode()):
            return oci_error(
                401,
                ErrorCode.UNAUTHORIZED,
                "the notification secret is missing or wrong",
                headers={"WWW-Authenticate": 'Bearer realm="variant-proxy-notify"'},
            )
        try:
            envelope = load_json(await read_body(request, _NOTIFY_LIMIT), "notification")
        except BodyTooLargeError as exc:
            return oci_error(413, ErrorCode.SIZE_INVALID, str(exc))
        except InvalidInputError as exc:
            return oci_error(400, ErrorCode.UNSUPPORTED, str(exc))
        try:
            names = _notified_repositories(envelope)
        except InvalidInputError as exc:
            return oci_error(400, ErrorCode.UNSUPPORTED, str(exc))
        for name in sorted(names):
            await service().invalidate(name)
        return JSONResponse({"invalidated": sorted(names)})

    requests = RequestLog(metrics, access_lines)
    app = ProxyApp(
        ReadPassThrough(service, requests),
        routes=[
            StarletteRoute("/healthz", healthz, methods=["GET"]),
            StarletteRoute("/metrics", metrics_endpoint, methods=["GET"]),
            StarletteRoute("/_notify", notify, methods=["POST"]),
            StarletteRoute("/openapi.json", openapi, methods=["GET"]),
            StarletteRoute("/{path:path}", dispatch, methods=_METHODS),
        ],
        lifespan=lifespan,
    )
    app.add_middleware(AccessLog, log=requests)
    app.state.metrics = metrics
    app.state.cache = cache
    return app


_READS = frozenset(
    {
        RouteKind.BASE,
        RouteKind.CATALOG,
        RouteKind.MANIFEST,
        RouteKind.BLOB,
        RouteKind.TAGS,
        RouteKind.REFERRERS,
    }
)
_PROPERTIES_KEY = PROPERTIES_HEADER.lower().encode()


@lru_cache(maxsize=4096)
def _read_path(raw_path: bytes) -> Route | None:
    """The route of a GET or HEAD of ``raw_path`` that is a plain read, whatever its
    headers (cached: a pull asks for each many times)."""
    try:
        route = parse_v2_path(raw_path.decode("latin-1"))
    except PathError:
        return None  # answered by the routes, as every refusal
    return route if route.kind in _READS else None


class ReadPassThrough:
    """A GET or HEAD that is a plain pass-through (blobs, manifests without
    ``X-Variant-Properties``, tags...), answered before Starlette's middleware, routing and
    request machinery, the bulk of the proxy's own time for a manifest GET (issue 8), and
    counted and logged as every request; offered to ``quickread`` first, before any ASGI.
    Everything else, invalid paths included, is left to the routes."""

    def __init__(self, service: Callable[[], VariantService], requests: RequestLog) -> None:
        self.service = service
        self.requests = requests

    def start(self, cycle: QuickCycle) -> bool:
        """``handoff.QuickReads``: a plain read is answered from callbacks where it can be
        (``quickread``), else it goes on to ``__call__`` (False)."""
        route = _read_path(cycle.raw_path)  # offered only GET and HEAD
        if route is None:
            return False
        return start_quick_read(self.service().upstream, cycle, route, self.requests, self.again)

    async def again(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A quick read that has to be asked the ASGI way after all."""
        await self(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Whether the request was a plain read, now answered."""
        route = self._route(scope)
        if route is None:
            return False
        started = time.perf_counter()
        sent = Sent()
        try:
            await self.service().upstream.pass_read(scope, receive, send, route, sent)
        except Exception:
            sent.status = sent.status or 500  # what the server answers for it
            raise
        finally:
            self.requests.record(scope, route.kind, sent, started)
        return True

    @staticmethod
    def _route(scope: Scope) -> Route | None:
        raw = scope.get("raw_path")
        if scope["method"] not in ("GET", "HEAD") or not isinstance(raw, bytes):
            return None
        route = _read_path(raw)
        if route is None:
            return None
        if route.kind is RouteKind.MANIFEST and any(
            k == _PROPERTIES_KEY for k, _ in scope["headers"]
        ):
            return None  # transparent resolution
        return route


class ProxyApp(Starlette):
    """Starlette, with plain reads (``ReadPassThrough``) answered before its stack."""

    def __init__(self, reads: ReadPassThrough, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reads = reads
        self.quick_reads: QuickReads = reads  # offered GET and HEAD first (proxy/handoff.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and await self.reads(scope, receive, send):
            return
        await super().__call__(scope, receive, send)


_NOTIFY_SHAPE = 'a notification is {"events": [{"action": "push", "target": {"repository": ...}}]}'


def _notified_repositories(envelope: object) -> set[str]:
    """The repositories that distribution's notification envelope says were pushed to or
    deleted from; other actions are ignored, and any other shape is refused."""
    events = envelope.get("events") if isinstance(envelope, dict) else None
    if not isinstance(events, list):
        raise InvalidInputError(f"no events list: {_NOTIFY_SHAPE}")
    names = set()
    for number, event in enumerate(events):
        if not isinstance(event, dict) or not isinstance(event.get("action"), str):
            raise InvalidInputError(
                f"event {number} is not an object with an action: {_NOTIFY_SHAPE}"
            )
        if event["action"] not in ("push", "delete"):
            continue
        target = event.get("target")
        name = target.get("repository") if isinstance(target, dict) else None
        if not isinstance(name, str) or name_problem(name) is not None:
            raise InvalidInputError(
                f"{event['action']} event {number} has no valid target repository: {_NOTIFY_SHAPE}"
            )
        names.add(name)
    return names


async def _handle(service: VariantService, request: Request, route: Route) -> Response:
    kind, method = route.kind, request.method
    if kind is RouteKind.OTHER:
        return PlainTextResponse("404 page not found", status_code=404)
    if kind is RouteKind.UNKNOWN:
        return oci_error(
            404, ErrorCode.UNSUPPORTED, "not a distribution API route", request.url.path
        )
    if kind is RouteKind.DISCOVER:
        if method not in ("GET", "HEAD"):
            return oci_error(405, ErrorCode.UNSUPPORTED, f"{method} is not allowed here")
        return JSONResponse(discover_document())
    if kind is RouteKind.VARIANTS:
        if method not in ("GET", "HEAD"):
            return oci_error(405, ErrorCode.UNSUPPORTED, f"{method} is not allowed on _variants")
        return await service.variants_endpoint(request, route)
    if kind is RouteKind.MANIFEST and method in ("GET", "HEAD"):
        header = request.headers.get(PROPERTIES_HEADER)
        if header is not None:
            return await service.resolve_manifest(request, route, header)
    response = await service.upstream.forward(request, route)
    if (
        kind is RouteKind.MANIFEST
        and method in ("PUT", "DELETE")
        and 200 <= response.status_code < 300
        and route.name is not None
    ):
        await service.invalidate(route.name)
    return response
