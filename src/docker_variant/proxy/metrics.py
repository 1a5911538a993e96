"""Prometheus metrics and the one-JSON-line-per-request access log.

Each app gets its own ``CollectorRegistry`` so that several proxies in one process (tests)
do not collide on metric names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from email.utils import formatdate
from json.encoder import encode_basestring_ascii
from typing import TextIO

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from docker_variant.proxy.names import PathError, RouteKind, parse_v2_path
from docker_variant.server.logs import log_fields

__all__ = [
    "CONTENT_TYPE_LATEST",
    "AccessLines",
    "AccessLog",
    "ProxyMetrics",
    "RequestLog",
    "Sent",
    "access_line",
    "http_date",
    "route_kind",
]

ACCESS_LOGGER = "docker_variant.proxy.access"


class _RequestCounts:
    """``variant_proxy_requests``, counted in a plain dict on the event loop's thread and
    turned into a counter family when scraped: a ``Counter`` child's ``inc`` takes a lock
    and checks itself, on every request. ``before_collect`` brings the counts up to date
    (the ``RequestLog`` counts in batches)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}
        self.before_collect: Callable[[], None] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.before_collect is not None:
            self.before_collect()
        family = CounterMetricFamily(
            "variant_proxy_requests",
            "Requests answered, by route class, method and status",
            labels=["route", "method", "status"],
        )
        for labels, count in list(self.counts.items()):
            family.add_metric(labels, count)
        yield family


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = _RequestCounts()
        self.registry.register(self._requests)
        self.variants_latency = Histogram(
            "variant_proxy_variants_seconds",
            "Time to answer a successful _variants request",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "variant_proxy_cache_hits",
            "Index requests served from the cache",
            registry=self.registry,
        )
        self.cache_misses = Counter(
            "variant_proxy_cache_misses",
            "Index requests that scanned the upstream",
            registry=self.registry,
        )
        self.scans = Counter(
            "variant_proxy_scans",
            "Index scans of the upstream (concurrent misses of one index share one)",
            registry=self.registry,
        )
        self.invalidations = Counter(
            "variant_proxy_cache_invalidations",
            "Repositories whose cached indexes a manifest PUT/DELETE dropped",
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "variant_proxy_upstream_errors",
            "Index requests that failed upstream (refused, not found, down, garbage), by kind",
            ["kind"],
            registry=self.registry,
        )

    @property
    def request_counts(self) -> dict[tuple[str, str, str], int]:
        """``variant_proxy_requests``' counts by (route, method, status), to add to."""
        return self._requests.counts

    def before_collect(self, update: Callable[[], None]) -> None:
        """``update`` is called before the request counts are read (a scrape)."""
        self._requests.before_collect = update

    def render(self) -> bytes:
        return generate_latest(self.registry)


def route_kind(scope: Scope) -> RouteKind:
    path: str = scope.get("path", "")
    if path == "/healthz":
        return RouteKind.HEALTH
    if path == "/metrics":
        return RouteKind.METRICS
    raw = scope.get("raw_path")
    try:
        return parse_v2_path(raw.decode("latin-1") if isinstance(raw, bytes) else path).kind
    except PathError:
        return RouteKind.INVALID


_date: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    """Now as an HTTP ``Date`` value (formatted once a second)."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]


class Sent:
    """What went down for one request: the status (0 until the head went) and body bytes."""

    __slots__ = ("bytes", "status")

    def __init__(self) -> None:
        self.status = 0
        self.bytes = 0

    def counting(self, send: Send) -> Send:
        """``send``, noting the status and the body bytes of the messages as they go; the
        proxy's own answers get a ``Date`` here (the server's is off, so that an upstream's
        is not doubled; Starlette's and the pass-through's header names are lower case)."""

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = int(message["status"])
                headers = message.get("headers", [])
                if not any(k == b"date" for k, _ in headers):
                    message = {**message, "headers": [*headers, (b"date", http_date())]}
            elif message["type"] == "http.response.body":
                self.bytes += len(message.get("body", b""))
            await send(message)

        return counting_send


def access_line(
    method: str,
    route: str,
    path: str,
    status: int,
    duration_ms: float,
    sent: int,
    ts: float | None = None,
) -> str:
    """One request's JSON line, with the fields, key order and values (``duration_ms`` to
    0.01 ms, ``ts`` to 1 ms; now where ``ts`` is None) that ``JsonFormatter`` gives an
    access record, built without ``logging`` (a record, handlers and ``json.dumps`` cost a
    fifth of a manifest GET's time in the proxy; the numbers are formatted once, not
    rounded and then printed)."""
    return (
        f'{{"bytes": {sent}, "duration_ms": {duration_ms:.2f}, "level": "info", '
        f'"logger": "{ACCESS_LOGGER}", "method": {encode_basestring_ascii(method)}, '
        f'"path": {encode_basestring_ascii(path)}, "route": "{route}", '
        f'"status": {status or "null"}, "ts": {time.time() if ts is None else ts:.3f}}}\n'
    )


_Entry = tuple[str, str, str, int, float, int, float]  # access_line's fields, ts included


class AccessLines:
    """The access log written to ``stream``: each request's line once, whole, in order,
    a batch of them in one write (the ``RequestLog`` batches them)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, entries: Iterable[_Entry]) -> None:
        text = "".join([access_line(*entry) for entry in entries])
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr loses the log, not requests
            pass


# one request as counted: method, route, path, status, body bytes, started and ended
# (time.perf_counter)
_Counted = tuple[str, str, str, int, int, float, float]


class RequestLog:
    """Counts every request and logs it as one JSON line, to ``lines`` (the server's own
    stream) or, without it, as a record of the ``ACCESS_LOGGER`` logger.

    With ``lines``, a request costs one tuple as it ends: its count and line are made with
    a batch of them, at most ``batch`` requests or ``delay`` seconds after the first waits,
    before a scrape of the counts, and at ``flush`` (the proxy's shutdown). Formatting lines
    one after another costs a fraction of formatting each between two requests, its code
    being cold by then; a request's ``ts`` is when it ended all the same.

    Only method, route class, path, status, duration and size are logged: never headers,
    so no ``Authorization`` value can reach a log.
    """

    def __init__(
        self,
        metrics: ProxyMetrics,
        lines: AccessLines | None = None,
        *,
        batch: int = 256,
        delay: float = 0.2,
    ) -> None:
        self.metrics = metrics
        self.lines = lines
        self.batch = batch
        self.delay = delay
        self.log = logging.getLogger(ACCESS_LOGGER)
        self._counts = metrics.request_counts
        self._waiting: list[_Counted] = []
        self._timer: asyncio.TimerHandle | None = None
        metrics.before_collect(self.flush)

    def record(self, scope: Scope, route: RouteKind, sent: Sent, started: float) -> None:
        """Counts and logs a request that began at ``started`` (``time.perf_counter``)."""
        self.count(
            scope.get("method", ""), route, scope.get("path", ""), sent.status, sent.bytes, started
        )

    def count(
        self, method: str, route: str, path: str, status: int, size: int, started: float
    ) -> None:
        """``record``'s work, from the request's fields: ``status`` 0 is a request cancelled
        before its answer started; ``size`` the body bytes sent."""
        waiting = self._waiting
        waiting.append((method, route, path, status, size, started, time.perf_counter()))
        if self.lines is None or len(waiting) >= self.batch:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.delay, self.flush)
            except RuntimeError:  # no event loop (a test calling in directly)
                self.flush()

    def flush(self) -> None:
        """Counts and logs every request waiting."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            return
        counted, self._waiting = self._waiting, []
        wall, now = time.time(), time.perf_counter()  # a request's ts: wall - (now - ended)
        counts = self._counts
        entries: list[_Entry] = []
        for method, route, path, status, size, started, ended in counted:
            key = (route, method, str(status) if status else "aborted")
            counts[key] = counts.get(key, 0) + 1
            duration_ms = (ended - started) * 1000
            entries.append((method, route, path, status, duration_ms, size, wall - now + ended))
        if self.lines is not None:
            self.lines.write(entries)
        elif self.log.isEnabledFor(logging.INFO):
            for method, route, path, status, duration_ms, size, _ in entries:
                fields = {
                    "method": method,
                    "route": route,
                    "path": path,
                    "status": status or None,
                    "duration_ms": round(duration_ms, 2),
                    "bytes": size,
                }
                log_fields(self.log, logging.INFO, "request", fields)


class AccessLog:
    """ASGI middleware: every request through it goes to the ``RequestLog``."""

    def __init__(self, app: ASGIApp, log: RequestLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent = Sent()
        try:
            await self.app(scope, receive, sent.counting(send))
        except Exception:
            sent.status = sent.status or 500  # what the server error handler outside answers
            raise
        finally:
            self.log.record(scope, route_kind(scope), sent, started)
