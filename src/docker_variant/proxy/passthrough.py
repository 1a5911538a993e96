"""Pass-through of the distribution API, streaming both ways, over one httpx client.

Requests go up with their method, query, headers (less hop-by-hop ones) and body, the body
streamed as it arrives (blob uploads); answers come down unchanged and streamed (blobs),
redirects included (never followed here). ``Location``, ``Content-Location`` and ``Link``
values that point at the upstream are rewritten to the proxy's own base URL, taken from the
request's ``Host`` header, so clients keep talking to the proxy.

Every request up is built anew by httpx from the parsed request (method, target, header
fields, body): no byte a caller sends is copied onto an upstream connection as it came, so a
caller cannot smuggle a second request onto a kept-alive connection another caller shares.
A production deployment puts nginx in front for the bytes (``deploy/nginx/``); this path is
what the proxy serves alone. Behind that front, a resolved manifest is not carried here at
all: the front says so with ``X-Variant-Front: accel-redirect`` (set by nginx, which
replaces any value a caller sent), and the proxy answers with nginx's ``X-Accel-Redirect`` to
the front's internal ``/_variant_manifest/v2/<name>/manifests/<reference>`` location, which
fetches it from the registry with the caller's own headers. ``X-Accel-*`` headers of an
upstream answer are never passed on, so no registry answer can steer the front.

No caller can hold the connections that others need, nor get another's answer:
- A manifest PUT is read whole (up to ``ProxyLimits.manifest_bytes``) before any upstream
  connection is taken: a caller sending it slowly holds none. A blob upload, which may be
  any size, streams up through a pool of its own (``ProxyLimits.upload_connections``), so
  hanging uploads leave reads (manifests, blobs, scans) their connections; an upload that
  finds its pool full waits up to the upstream time-out, then gets 503.
- No upstream connection carries two answers: each is closed once its answer ends. httpcore
  (1.0.9, with h11 0.16) keeps whatever an upstream sent past an answer's Content-Length on
  a kept-alive connection and reads it as the answer to the next request sent on it: bytes
  of one tenant's blob or config, miscounted by a registry, would be another caller's
  manifest (passed through, or read by a scan into a cached index). Its public API cannot
  tell such an answer apart, so the proxy gives up keep-alive upstream (a TCP connect per
  answer; a TLS handshake too for an https upstream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType

import anyio
import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from docker_variant.errors import one_line
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.extension import DEVICES_HEADER, PROPERTIES_HEADER
from docker_variant.oci.http import USER_AGENT, async_client, async_transport
from docker_variant.oci.mediatypes import MANIFEST_ACCEPT
from docker_variant.proxy.limits import ProxyLimits
from docker_variant.proxy.names import Route, RouteKind
from docker_variant.proxy.responses import upstream_error
from docker_variant.server.bodies import BodyTooLargeError, read_body
from docker_variant.server.errors import oci_error

__all__ = [
    "ACCEL_PREFIX",
    "FRONT_HEADER",
    "BorrowedTransport",
    "StreamedResponse",
    "Upstream",
    "forwarded_headers",
    "proxy_base_url",
]

log = logging.getLogger("docker_variant.proxy")

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Not forwarded upstream: the proxy's own headers, Host (httpx sets the upstream's), Expect
# (the server here already answered "100 Continue" when the body was read).
_REQUEST_DROP = _HOP_BY_HOP | {
    b"host",
    PROPERTIES_HEADER.lower().encode(),
    DEVICES_HEADER.lower().encode(),
    b"expect",
    b"x-variant-front",
}
#: Sent by the nginx front (deploy/nginx/): it serves manifests the proxy names by redirect.
FRONT_HEADER = "X-Variant-Front"
#: The front's internal location that fetches ``/v2/<name>/manifests/<reference>``.
ACCEL_PREFIX = "/_variant_manifest"
_REWRITTEN = frozenset({b"location", b"content-location", b"link"})
_CHECK_BODY_LIMIT = 4 << 20  # a manifest's size limit
_USER_AGENT = USER_AGENT.encode()


def _connection_tokens(values: Sequence[bytes]) -> frozenset[bytes]:
    """The header names that ``Connection`` header values list (RFC 9110 7.6.1)."""
    return frozenset(
        token.strip().lower() for value in values for token in value.split(b",") if token.strip()
    )


def forwarded_headers(raw: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The request headers that go upstream (names in lower case, as ASGI servers give
    them): less the hop-by-hop ones, those its ``Connection`` header names, and the proxy's
    own. A chunked body goes up chunked: its ``Content-Length``, if any, is dropped
    (RFC 9112 6.3), as the server here ignored it."""
    named = _connection_tokens([value for name, value in raw if name == b"connection"])
    if any(name == b"transfer-encoding" for name, _ in raw):
        named |= {b"content-length"}
    return [(k, v) for k, v in raw if k not in _REQUEST_DROP and k not in named]


def proxy_base_url(scope: Scope) -> str:
    """``scheme://host[:port]`` as the caller addressed the proxy."""
    host = ""
    for key, value in scope.get("headers", []):
        if key == b"host":
            host = value.decode("latin-1")
            break
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{scope.get('scheme', 'http')}://{host}"


class BorrowedTransport(httpx.AsyncBaseTransport):
    """Lends the proxy's pooled transport to a short-lived client without letting that
    client close it (``AsyncClient.aclose`` closes its transport)."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        pass  # the owner closes it at shutdown

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        pass


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancels ``scope`` once the caller hangs up (the request body is read by then)."""
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


class StreamedResponse(Response):
    """Streams an upstream answer's body down, closing the upstream however the exchange ends.

    The body is not read for a HEAD or an answer without one (204, 304). A failure mid-body
    is too late for an error status: the response is left incomplete, so the server drops
    the connection and the caller sees a short body, not a silent one. A caller that hangs
    up mid-blob stops the upstream read at once.
    """

    def __init__(
        self, upstream: httpx.Response, headers: list[tuple[bytes, bytes]], what: str
    ) -> None:
        self.status_code = upstream.status_code
        self.raw_headers = headers
        self.background = None
        self._upstream = upstream
        self._what = what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            if scope["method"] == "HEAD" or self.status_code in (204, 304):
                # framed as empty: read to its end, so the connection is released
                await self._upstream.aread()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            async with anyio.create_task_group() as group:
                group.start_soon(_watch_disconnect, receive, group.cancel_scope)
                try:
                    async for chunk in self._upstream.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except httpx.HTTPError as exc:
                    log.warning("upstream failed mid-body: %s", one_line(f"{self._what}: {exc!r}"))
                else:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()
        finally:
            await self._upstream.aclose()


async def _request_body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:  # an empty chunk would end a chunked upload early
            yield chunk


def has_body(request: Request) -> bool:
    """Whether the request declares a body (a length other than 0, or chunked framing)."""
    return (
        request.headers.get("content-length", "0") not in ("", "0")
        or "transfer-encoding" in request.headers
    )


class Upstream:
    """The upstream registry: its base URL and three pools of connections to it, each
    connection closed after one answer (see the module's notes): scans, authorisation checks
    and health probes (``transport``, ``client``); pass-through reads and manifest writes
    (``reads``); streamed uploads (``uploads``). Apart, none of them starves the others."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_connections: int = 256,
        limits: ProxyLimits | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.limits = limits or ProxyLimits()
        self.prefix = httpx.URL(self.base_url).path.rstrip("/")
        # keep-alive off in every pool: no connection outlives the answer it carried
        self.transport = async_transport(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0)
        )
        # No read time-out: a blob body may take as long as it takes. Requests get a
        # deadline for their response headers instead (see forward).
        self.client = async_client(
            transport=self.transport,
            timeout=httpx.Timeout(None, connect=connect_timeout),
            follow_redirects=False,
        )
        self.reads = async_client(
            transport=async_transport(
                limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0)
            ),
            timeout=httpx.Timeout(None, connect=connect_timeout),
            follow_redirects=False,
        )
        uploads = self.limits.upload_connections
        self.uploads = async_client(
            transport=async_transport(
                limits=httpx.Limits(max_connections=uploads, max_keepalive_connections=0)
            ),
            # an upload waits for its pool's next free connection up to the time-out
            timeout=httpx.Timeout(None, connect=connect_timeout, pool=timeout),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.reads.aclose()
        await self.uploads.aclose()

    def url(self, path: str, query: bytes = b"") -> httpx.URL:
        text = f"{self.base_url}{path}"
        if query:
            text += "?" + query.decode("latin-1")
        return httpx.URL(text)

    def response_headers(
        self,
        raw: Sequence[tuple[bytes, bytes]],
        proxy_base: str | Scope,
        extra: Mapping[str, str] | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """An upstream answer's headers as the caller gets them, URLs pointing at the
        upstream rewritten. ``proxy_base``: the proxy's base URL, or the request's scope to
        take it from (only done when a URL is to be rewritten)."""
        lowered = [(key.lower(), value) for key, value in raw]
        named = _connection_tokens([value for name, value in lowered if name == b"connection"])
        out: list[tuple[bytes, bytes]] = []
        for name, value in lowered:
            if name in _HOP_BY_HOP or name in named or name.startswith(b"x-accel-"):
                continue
            if name in _REWRITTEN:
                if not isinstance(proxy_base, str):
                    proxy_base = proxy_base_url(proxy_base)
                value = self.rewrite(value.decode("latin-1"), proxy_base).encode("latin-1")
            out.append((name, value))
        for extra_name, text in (extra or {}).items():
            out.append((extra_name.lower().encode("latin-1"), text.encode("latin-1")))
        return out

    def rewrite(self, value: str, proxy_base: str) -> str:
        """Point URLs at the upstream's API (absolute, or under its path prefix) at the proxy."""
        upstream_v2 = f"{self.base_url}/v2/"
        out, start = [], 0
        lowered = value.lower()
        while True:
            hit = lowered.find(upstream_v2.lower(), start)
            if hit < 0:
                break
            out += [value[start:hit], f"{proxy_base}/v2/"]
            start = hit + len(upstream_v2)
        out.append(value[start:])
        rewritten = "".join(out)
        if self.prefix:
            rewritten = rewritten.replace(f"{self.prefix}/v2/", "/v2/")
        return rewritten

    def by_front(self, request: Request) -> bool:
        """Whether ``request`` came through the nginx front, which fetches manifests itself."""
        return request.headers.get(FRONT_HEADER) == "accel-redirect"

    async def serve_manifest(
        self, request: Request, route: Route, extra_headers: Mapping[str, str]
    ) -> Response:
        """GET/HEAD of the manifest at ``route``, answered as the upstream answers it, with
        ``extra_headers``: handed to the front to fetch where it asks for that, else relayed."""
        if not self.by_front(request):
            return await self.forward(request, route, extra_headers=extra_headers)
        headers = {"X-Accel-Redirect": ACCEL_PREFIX + route.upstream_path(), **extra_headers}
        return Response(b"", headers=headers)

    async def forward(
        self,
        request: Request,
        route: Route,
        *,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send ``request`` to the upstream at ``route`` and stream the answer back."""
        method = request.method
        what = f"{method} {route.upstream_path()}"
        body = has_body(request)
        headers = forwarded_headers(request.scope["headers"])
        if not any(name == b"user-agent" for name, _ in headers):
            headers.append((b"user-agent", _USER_AGENT))
        content: bytes | AsyncIterator[bytes] | None = None
        client = self.reads
        try:
            if body and route.kind is RouteKind.MANIFEST:
                # whole before it goes up: a caller sending slowly holds no connection
                content = await read_body(request, self.limits.manifest_bytes)
            elif body:
                content, client = _request_body(request), self.uploads
        except BodyTooLargeError as exc:
            return oci_error(
                ErrorCode.REQUEST_TOO_LARGE,
                f"{what}: the manifest is too large: {exc} (--limit manifest-bytes)",
                headers={"Connection": "close"},  # the rest of the body is not read
            )
        except ClientDisconnect:
            return Response(status_code=499)
        # A plain httpx.Request, not the client's build_request: the client's default
        # headers (Accept, Accept-Encoding, Connection) are not the caller's to send.
        upstream_request = httpx.Request(
            method,
            self.url(route.upstream_path(), request.scope.get("query_string", b"")),
            headers=headers,
            content=content,
            extensions={"timeout": client.timeout.as_dict()},  # connecting is timed
        )
        try:
            if client is self.uploads:
                # An upload lasts as long as the caller sends; only connecting is timed.
                response = await client.send(upstream_request, stream=True)
            else:
                async with asyncio.timeout(self.timeout):
                    response = await client.send(upstream_request, stream=True)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody is left to read it
        except httpx.PoolTimeout:
            return upstream_error(
                ErrorCode.UNAVAILABLE,
                f"{what}: {self.limits.upload_connections} uploads are in flight, the most "
                "this proxy sends upstream at once (--limit upload-connections); retry later",
                {"Retry-After": "5"},
            )
        except (TimeoutError, httpx.TimeoutException):
            return upstream_error(
                ErrorCode.REGISTRY_TIMEOUT, f"{what}: the upstream registry timed out"
            )
        except httpx.HTTPError as exc:
            return upstream_error(
                ErrorCode.REGISTRY_UNAVAILABLE,
                f"{what}: the upstream registry failed: {type(exc).__name__}: {exc}",
            )
        headers = self.response_headers(response.headers.raw, request.scope, extra_headers)
        return StreamedResponse(response, headers, what)

    async def check_pull(
        self, name: str, tag: str | None, authorization: str | None, proxy_base: str
    ) -> tuple[int, Response | None]:
        """May this caller read ``name``? Asks the upstream with the caller's own
        ``Authorization`` for the manifest of ``tag`` (small, and certainly there when it
        came from a scan), or for a one-tag listing when there is no tag.

        Returns the upstream status and, unless it is 2xx, the upstream's answer to hand
        back as it is (a 401 with its ``WWW-Authenticate``, a 403, a 404...). Raises
        ``httpx.HTTPError`` or ``TimeoutError`` when no answer comes.
        """
        headers = {"Accept": MANIFEST_ACCEPT}
        if authorization:
            headers["Authorization"] = authorization
        if tag is None:
            url = self.url(Route(RouteKind.TAGS, name).upstream_path(), b"n=1")
        else:
            url = self.url(Route(RouteKind.MANIFEST, name, tag).upstream_path())
        async with (
            asyncio.timeout(self.timeout),
            self.client.stream("GET", url, headers=headers) as response,
        ):
            body = b""
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > _CHECK_BODY_LIMIT:
                    break  # only the status matters; a huge body is cut here
        if response.is_success:
            return response.status_code, None
        kept = [
            (k, v)
            for k, v in self.response_headers(response.headers.raw, proxy_base)
            if k != b"content-length"  # the body may have been cut
        ]
        answer = Response(body, status_code=response.status_code)
        answer.raw_headers = [*kept, (b"content-length", str(len(body)).encode())]
        return response.status_code, answer

    async def probe(self) -> httpx.Response:
        async with asyncio.timeout(self.timeout):
            return await self.client.get(self.url("/v2/"))
