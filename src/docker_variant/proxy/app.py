"""The ``variant-proxy`` ASGI app: distribution API pass-through plus ``_variants``."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route as StarletteRoute

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.jsondoc import load_json
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.extension import PROPERTIES_HEADER
from docker_variant.oci.grammar import name_problem
from docker_variant.openapi import document as openapi_document
from docker_variant.proxy.cache import IndexStore, open_store
from docker_variant.proxy.limits import DEFAULT_CACHE_TTL, DEFAULT_UPSTREAM_TIMEOUT, ProxyLimits
from docker_variant.proxy.metrics import (
    CONTENT_TYPE_LATEST,
    AccessLines,
    AccessLog,
    ProxyMetrics,
    RequestLog,
)
from docker_variant.proxy.names import PathError, Route, RouteKind, parse_v2_path
from docker_variant.proxy.passthrough import Upstream, has_body
from docker_variant.proxy.variants import VariantService, discover_document
from docker_variant.server.auth import bearer_token
from docker_variant.server.bodies import read_body
from docker_variant.server.errors import error_handlers, oci_error

_log = logging.getLogger("docker_variant.proxy")

__all__ = ["DEFAULT_CACHE_TTL", "DEFAULT_UPSTREAM_TIMEOUT", "check_upstream_url", "create_app"]

_NOTIFY_LIMIT = 1 << 20  # a notification envelope; distribution batches a few events

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


class ProxyEndpoints:
    """The proxy's endpoints over one ``VariantService`` (made when the app starts)."""

    def __init__(
        self,
        base_url: str,
        cache: IndexStore,
        metrics: ProxyMetrics,
        *,
        upstream_timeout: float,
        connect_timeout: float,
        max_connections: int,
        notify_secret: str | None,
        limits: ProxyLimits,
    ) -> None:
        self.base_url = base_url
        self.cache = cache
        self.metrics = metrics
        self.upstream_timeout = upstream_timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.notify_secret = notify_secret
        self.limits = limits
        self._service: VariantService | None = None

    @property
    def service(self) -> VariantService:
        assert self._service is not None, "the app's lifespan has not started"
        return self._service

    @asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        upstream = Upstream(
            self.base_url,
            timeout=self.upstream_timeout,
            connect_timeout=self.connect_timeout,
            max_connections=self.max_connections,
            limits=self.limits,
        )
        self._service = VariantService(upstream, self.cache, self.metrics)
        await self.cache.start()
        try:
            yield
        finally:
            await self.cache.close()
            await upstream.aclose()

    async def dispatch(self, request: Request) -> Response:
        """Every ``/v2/...`` request (and any other path, refused as the registry would)."""
        raw = request.scope.get("raw_path")
        raw_path = raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path
        return await handle(self.service, request, parse_v2_path(raw_path))

    async def healthz(self, request: Request) -> Response:
        """``ok``; with ``?upstream=1`` also whether the upstream answers. Anyone may ask, so
        the answer never names the upstream (its address and errors go to the log)."""
        if request.query_params.get("upstream") not in ("1", "true", "yes"):
            return PlainTextResponse("ok")
        upstream = self.service.upstream
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

    async def metrics_endpoint(self, _request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, _request: Request) -> Response:
        return Response(openapi_document("proxy"), media_type="application/json")

    async def notify(self, request: Request) -> Response:
        """distribution's notification webhook: each push or delete event invalidates its
        repository's indexes, in every replica."""
        if self.notify_secret is None:
            return oci_error(
                ErrorCode.ROUTE_UNKNOWN, "notifications are not enabled (--notify-secret)"
            )
        given = bearer_token(request)
        if given is None or not hmac.compare_digest(given.encode(), self.notify_secret.encode()):
            return oci_error(
                ErrorCode.UNAUTHORIZED,
                "the notification secret is missing or wrong",
                headers={"WWW-Authenticate": 'Bearer realm="variant-proxy-notify"'},
            )
        # too large (413) or malformed (400): answered by the exception handlers
        envelope = load_json(await read_body(request, _NOTIFY_LIMIT), "notification")
        names = notified_repositories(envelope)
        for name in sorted(names):
            await self.service.invalidate(name)
        return JSONResponse({"invalidated": sorted(names)})


def create_app(
    upstream_url: str,
    cache_ttl: float = DEFAULT_CACHE_TTL,
    *,
    upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT,
    connect_timeout: float = 10.0,
    max_connections: int = 256,
    cache_url: str | None = None,
    notify_secret: str | None = None,
    access_lines: AccessLines | None = None,
    limits: ProxyLimits | None = None,
) -> Starlette:
    """The proxy for ``upstream_url``; ``cache_ttl`` bounds how stale an index may be
    (0 disables the cache); ``upstream_timeout`` bounds an index scan and the wait for
    the headers of a pass-through answer (blob bodies are never timed).

    ``cache_url`` (``redis://...``) shares the index cache with other replicas; ``None``
    keeps it in this process. ``notify_secret`` enables ``POST /_notify`` for the
    registry's notification webhook, called with ``Authorization: Bearer <secret>``.
    ``access_lines``: where the access log's lines go (the server's stderr, in batches);
    without it they are records of the ``metrics.ACCESS_LOGGER`` logger. ``limits``: what
    one upload, manifest, image config or index may cost (``ProxyLimits``' defaults)."""
    base_url = check_upstream_url(upstream_url)
    if cache_ttl < 0:
        raise InvalidInputError(f"cache TTL must be >= 0 seconds, got {cache_ttl}")
    if upstream_timeout <= 0:
        raise InvalidInputError(f"upstream timeout must be > 0 seconds, got {upstream_timeout}")
    limits = limits or ProxyLimits()
    metrics = ProxyMetrics()
    cache = open_store(cache_url, cache_ttl, max_bytes=limits.cache_bytes)
    endpoints = ProxyEndpoints(
        base_url,
        cache,
        metrics,
        upstream_timeout=upstream_timeout,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        notify_secret=notify_secret,
        limits=limits,
    )
    requests = RequestLog(metrics, access_lines)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with endpoints.lifespan(app):
                yield
        finally:
            requests.flush()  # the batched access log, before the server exits

    app = Starlette(
        exception_handlers=error_handlers({PathError: _path_error}),
        routes=[
            StarletteRoute("/healthz", endpoints.healthz, methods=["GET"]),
            StarletteRoute("/metrics", endpoints.metrics_endpoint, methods=["GET"]),
            StarletteRoute("/_notify", endpoints.notify, methods=["POST"]),
            StarletteRoute("/openapi.json", endpoints.openapi, methods=["GET"]),
            StarletteRoute("/{path:path}", endpoints.dispatch, methods=_METHODS),
        ],
        lifespan=lifespan,
    )
    app.add_middleware(AccessLog, log=requests)
    app.state.metrics = metrics
    app.state.cache = cache
    app.state.endpoints = endpoints
    return app


_NOTIFY_SHAPE = 'a notification is {"events": [{"action": "push", "target": {"repository": ...}}]}'


async def _path_error(_request: Request, exc: PathError) -> Response:
    return oci_error(exc.code, exc.message, exc.detail)


def notified_repositories(envelope: object) -> set[str]:
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


async def handle(service: VariantService, request: Request, route: Route) -> Response:
    """One distribution API request: the proxy's own routes, else the upstream's answer."""
    kind, method = route.kind, request.method
    if kind is RouteKind.OTHER:
        return PlainTextResponse("404 page not found", status_code=404)
    if kind is RouteKind.UNKNOWN:
        return oci_error(ErrorCode.ROUTE_UNKNOWN, "not a distribution API route", request.url.path)
    if kind is RouteKind.DISCOVER:
        if method not in ("GET", "HEAD"):
            return oci_error(ErrorCode.UNSUPPORTED, f"{method} is not allowed here")
        return JSONResponse(discover_document())
    if kind is RouteKind.VARIANTS:
        if method not in ("GET", "HEAD"):
            return oci_error(ErrorCode.UNSUPPORTED, f"{method} is not allowed on _variants")
        return await service.variants_endpoint(request, route)
    if method in ("GET", "HEAD") and has_body(request):
        # A body here would be read by no one: refused rather than passed on or left on
        # the connection (where it would be taken for the caller's next request).
        return oci_error(
            ErrorCode.INVALID_INPUT,
            f"a {method} request may not carry a body (RFC 9110 9.3)",
            headers={"Connection": "close"},
        )
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
