"""Pass-through of the distribution API, streaming both ways.

Requests go up with their method, query, headers (less hop-by-hop ones) and body, the
body streamed as it arrives (blob uploads); answers come down unchanged and streamed
(blobs), redirects included (never followed here). GET and HEAD go over kept-alive raw
connections (``upstreampool``, measured 2-3x faster than httpx for a manifest GET here;
large bodies relayed by a thread, ``blobrelay``); requests with a body go through one
pooled httpx client. ``Location`` and ``Link`` values that
point at the upstream are rewritten to the proxy's own base URL, taken from the
request's ``Host`` header, so clients keep talking to the proxy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from functools import lru_cache
from http import HTTPStatus
from types import TracebackType

import anyio
import httpcore
import httptools
import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from docker_variant.errors import one_line
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.http import USER_AGENT, async_client, async_transport, system_tls
from docker_variant.oci.mediatypes import MANIFEST_ACCEPT
from docker_variant.proxy.blobrelay import (
    DEFAULT_RELAY_MODE,
    RelayedResponse,
    cancel_on_disconnect,
)
from docker_variant.proxy.handoff import socket_handoff
from docker_variant.proxy.metrics import Sent, http_date
from docker_variant.proxy.names import Route, RouteKind
from docker_variant.proxy.responses import upstream_error
from docker_variant.proxy.upstreampool import Answer, UpstreamPool, connection_tokens, header_tokens

__all__ = [
    "REQUEST_DROP_RAW",
    "RESPONSE_DROP_RAW",
    "BorrowedTransport",
    "StreamedResponse",
    "Upstream",
    "cancel_on_disconnect",
    "proxy_base_url",
]

log = logging.getLogger("docker_variant.proxy")

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Not forwarded upstream: the proxy's own header, Host (httpx sets the upstream's) and
# Expect (the server here already answered "100 Continue" when the body was read).
_REQUEST_DROP = frozenset({"host", "x-variant-properties", "expect"})
# the header names (lower case, as bytes) dropped from a request on its way up, and from an
# answer on its way down (besides those its Connection header names)
REQUEST_DROP_RAW = frozenset(n.encode() for n in _HOP_BY_HOP | _REQUEST_DROP)
RESPONSE_DROP_RAW = frozenset(n.encode() for n in _HOP_BY_HOP)
_REWRITTEN = frozenset({b"location", b"content-location", b"link"})
_CHECK_BODY_LIMIT = 4 << 20  # a manifest's size limit


_FIELD = b": "


def forwarded_headers(
    raw: Sequence[tuple[bytes, bytes]], refused: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]] | None:
    """The request headers that go upstream, in one pass over ``raw`` (names in lower case,
    as ASGI servers give them): less the hop-by-hop ones, those its ``Connection`` header
    names (RFC 9110 7.6.1) and ``REQUEST_DROP_RAW``; ``None`` where one of ``refused`` is
    there."""
    kept = []
    connection = []
    for name, value in raw:
        if name in refused:
            return None
        if name in REQUEST_DROP_RAW:
            if name == b"connection":
                connection.append(value)
            continue
        kept.append((name, value))
    if connection:  # most name only keep-alive, dropped already
        named = header_tokens(connection) - REQUEST_DROP_RAW
        if named:
            kept = [(k, v) for k, v in kept if k not in named]
    return kept


@lru_cache(maxsize=64)
def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


def response_head(status: int, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The status line and header lines of an answer, as bytes (no blank line)."""
    if not headers:
        return _status_line(status)
    # map over bytes.join: no Python frame per header
    return _status_line(status) + b"\r\n".join(map(_FIELD.join, headers)) + b"\r\n"


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


class StreamedResponse(Response):
    """Streams an upstream answer's body down, closing the upstream however the exchange ends.

    ``chunks`` is not read for an answer without a body (204, 304); HEAD and GET take the raw
    path (``_forward_raw``), so this serves the other methods. A failure mid-body
    (one of ``errors``) is too late for an error status: the response is left incomplete, so
    the server drops the connection and the caller sees a short body, not a silent one.
    """

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        errors: tuple[type[BaseException], ...],
        what: str,
    ) -> None:
        self.status_code = status
        self.raw_headers = headers
        self.background = None
        self._chunks = chunks if status not in (204, 304) else None
        self._close = close
        self._errors = errors
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
            if self._chunks is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            async with anyio.create_task_group() as group:
                # A caller that hangs up mid-blob stops the upstream read at once.
                group.start_soon(cancel_on_disconnect, receive, group.cancel_scope)
                try:
                    async for chunk in self._chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except self._errors as exc:
                    log.warning("upstream failed mid-body: %s", one_line(f"{self._what}: {exc!r}"))
                else:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()
        finally:
            await self._close()


async def _request_body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:  # an empty chunk would end a chunked upload early
            yield chunk


# httpcore reads an HTTP/1.1 body 64 KiB at a time; each read costs the same Python overhead
# whatever its size, so blob throughput through the proxy is bounded by the read count.
# Reading up to 1 MiB at a time cuts that count 16-fold (see bench/bench_proxy.py). The
# setting is process-wide, which is fine: variant-proxy runs as a process of its own.
httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = 1 << 20


class Upstream:
    """The upstream registry: its base URL and the shared, pooled HTTP client."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_connections: int = 256,
        blob_relay: str = DEFAULT_RELAY_MODE,
    ) -> None:
        self.blob_relay = blob_relay
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        url = httpx.URL(self.base_url)
        self.prefix = url.path.rstrip("/")
        self._host_header = b"Host: " + url.netloc
        self._user_agent = f"User-Agent: {USER_AGENT}".encode()
        # Both pools trust what every client of the package trusts (oci.http).
        self.raw = UpstreamPool(
            url.host,
            url.port or (443 if url.scheme == "https" else 80),
            system_tls() if url.scheme == "https" else None,
            connect_timeout,
            kept_out=RESPONSE_DROP_RAW | _REWRITTEN,  # what response_headers would change
        )
        self.transport = async_transport(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        # No read time-out: a blob body may take as long as it takes. Requests without a
        # body get an overall deadline for their response headers instead (see forward).
        self.client = async_client(
            transport=self.transport,
            timeout=httpx.Timeout(None, connect=connect_timeout),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        self.raw.close()
        await self.client.aclose()

    def url(self, path: str, query: bytes = b"") -> httpx.URL:
        text = f"{self.base_url}{path}"
        if query:
            text += "?" + query.decode("latin-1")
        return httpx.URL(text)

    @staticmethod
    def request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
        """``forwarded_headers`` of the request of ``scope``."""
        headers = forwarded_headers(scope.get("headers", []))
        assert headers is not None  # none is refused
        return headers

    def response_headers(
        self,
        raw: Sequence[tuple[bytes, bytes]],
        proxy_base: str | Scope,
        extra: Mapping[str, str] | None = None,
        *,
        lowered: bool = False,
        tokens: frozenset[bytes] | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """An upstream answer's headers as the caller gets them (``raw`` as received;
        ``lowered``: their names are in lower case already; ``tokens``: those of its
        ``Connection`` headers, where already known), with a ``Date`` where it had none.
        ``proxy_base``: the proxy's base URL, or the request's scope to take it from (only
        done when a URL is to be rewritten)."""
        if tokens is None:
            tokens = connection_tokens(raw, lowered)
        drop = RESPONSE_DROP_RAW | tokens if tokens else RESPONSE_DROP_RAW
        out: list[tuple[bytes, bytes]] = []
        dated = False
        for key, value in raw:
            name = key if lowered else key.lower()
            if name in drop:
                continue
            if name in _REWRITTEN:
                if not isinstance(proxy_base, str):
                    proxy_base = proxy_base_url(proxy_base)
                value = self.rewrite(value.decode("latin-1"), proxy_base).encode("latin-1")
            elif name == b"date":
                dated = True
            out.append((name, value))
        if extra:
            for extra_name, text in extra.items():
                out.append((extra_name.lower().encode("latin-1"), text.encode("latin-1")))
        if not dated:
            out.append((b"date", http_date()))
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

    async def forward(
        self,
        request: Request,
        route: Route,
        *,
        method: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send ``request`` to the upstream at ``route`` and stream the answer back."""
        method = method or request.method
        what = f"{method} {route.upstream_path()}"
        if method in ("GET", "HEAD"):
            return await self._forward_raw(request, route, method, extra_headers, what)
        headers = self.request_headers(request.scope)
        has_body = (
            request.headers.get("content-length", "0") not in ("", "0")
            or "chunked" in request.headers.get("transfer-encoding", "").lower()
        )
        upstream_request = self.client.build_request(
            method,
            self.url(route.upstream_path(), request.scope.get("query_string", b"")),
            headers=headers,
            content=_request_body(request) if has_body else None,
        )
        try:
            if has_body:
                # An upload lasts as long as the caller sends; only connecting is timed.
                response = await self.client.send(upstream_request, stream=True)
            else:
                async with asyncio.timeout(self.timeout):
                    response = await self.client.send(upstream_request, stream=True)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody is left to read it
        except (TimeoutError, httpx.TimeoutException):
            return upstream_error(
                504, ErrorCode.UNAVAILABLE, f"{what}: the upstream registry timed out"
            )
        except httpx.HTTPError as exc:
            return upstream_error(
                502,
                ErrorCode.UNAVAILABLE,
                f"{what}: the upstream registry failed: {type(exc).__name__}: {exc}",
            )
        headers_out = self.response_headers(response.headers.raw, request.scope, extra_headers)
        return StreamedResponse(
            response.status_code,
            headers_out,
            response.aiter_raw(),
            response.aclose,
            (httpx.HTTPError,),
            f"{method} {response.request.url}",
        )

    def request_head(
        self,
        method: str,
        route: Route,
        query: bytes,
        raw: Sequence[tuple[bytes, bytes]],
        refused: frozenset[bytes] = frozenset(),
    ) -> bytes | None:
        """The head of a body-less request to ``route``, with the request headers ``raw``
        (ASGI's, names in lower case) less those ``forwarded_headers`` drops, our
        ``User-Agent`` where there is none; ``None`` where one of ``refused`` is there.
        (``forwarded_headers``' rule, in the loop that writes the lines: this is every
        GET's path.)"""
        target = self.prefix + route.upstream_path()
        if query:
            target += "?" + query.decode("latin-1")
        lines = [f"{method} {target} HTTP/1.1".encode(), self._host_header]
        agent = named = False
        for name, value in raw:
            if name in refused:
                return None
            if name in REQUEST_DROP_RAW:
                named = named or (name == b"connection" and value.lower() != b"keep-alive")
                continue
            if name == b"user-agent":
                agent = True
            lines.append(name + _FIELD + value)
        if named:  # rare: a Connection header naming others
            headers = forwarded_headers(raw, refused)
            if headers is None:
                return None
            lines[2:] = map(_FIELD.join, headers)
            agent = any(name == b"user-agent" for name, _ in headers)
        if not agent:
            lines.append(self._user_agent)
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    async def _ask_raw(self, method: str, route: Route, head: bytes) -> Answer | Response:
        """The upstream's answer to a body-less request ``head``, or the proxy's error
        answer when none came."""
        try:
            return await self.raw.request(head, has_body=method != "HEAD", timeout=self.timeout)
        except (TimeoutError, OSError, httptools.HttpParserError) as exc:
            return self.no_answer(method, route, exc)

    @staticmethod
    def no_answer(method: str, route: Route, exc: BaseException) -> Response:
        """The proxy's answer when the upstream gave none to a GET or HEAD: 504 for a
        time-out, 502 for a broken connection or garbage."""
        if isinstance(exc, TimeoutError):
            return upstream_error(
                504,
                ErrorCode.UNAVAILABLE,
                f"{method} {route.upstream_path()}: the upstream registry timed out",
            )
        return upstream_error(
            502,
            ErrorCode.UNAVAILABLE,
            f"{method} {route.upstream_path()}: the upstream registry failed: "
            f"{type(exc).__name__}: {exc}",
        )

    async def _forward_raw(
        self,
        request: Request,
        route: Route,
        method: str,
        extra_headers: Mapping[str, str] | None,
        what: str,
    ) -> Response:
        scope = request.scope
        head = self.request_head(method, route, scope.get("query_string", b""), scope["headers"])
        assert head is not None  # none is refused
        answer = await self._ask_raw(method, route, head)
        if isinstance(answer, Response):
            return answer
        headers_out = self.response_headers(
            answer.headers,
            request.scope,
            extra_headers,
            lowered=True,
            tokens=answer.connection_tokens,
        )
        return RelayedResponse(answer, headers_out, what, self.blob_relay)

    async def pass_read(
        self, scope: Scope, receive: Receive, send: Send, route: Route, sent: Sent
    ) -> None:
        """A GET or HEAD passed through to ``route`` and its answer sent down, as
        ``forward`` does, at the least cost per request: a small answer that came whole
        goes down as one write of bytes (``handoff.SocketHandoff.send_whole``). ``sent``
        is told the status and the body bytes sent through the event loop, as they go."""
        method: str = scope["method"]
        head = self.request_head(method, route, scope.get("query_string", b""), scope["headers"])
        assert head is not None  # none is refused
        answer = await self._ask_raw(method, route, head)
        if isinstance(answer, Response):
            await answer(scope, receive, sent.counting(send))
            return
        headers = self.response_headers(
            answer.headers, scope, lowered=True, tokens=answer.connection_tokens
        )
        handoff = socket_handoff(scope)
        if handoff is not None:
            body = answer.complete()
            if body is not None:
                if handoff.send_whole(response_head(answer.status, headers), body):
                    sent.status, sent.bytes = answer.status, len(body)
                return
        what = f"{method} {route.upstream_path()}"
        await RelayedResponse(answer, headers, what, self.blob_relay)(
            scope, receive, sent.counting(send)
        )

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
