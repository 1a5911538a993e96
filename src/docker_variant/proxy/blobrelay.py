"""Blob downloads relayed over a raw upstream connection: the proxy's bulk data path.

httpx's HTTP/1.1 layer (h11) copies every body byte about three times; for blob bodies that
made the proxy CPU-bound at a quarter of the registry's loopback throughput. Here the
request goes up exactly as the httpx path sends it (``Upstream.request_headers``), the
answer's head is parsed by httptools (uvicorn's C parser) and its headers get the same
rewriting as every other answer (``Upstream.response_headers``); a body with a
``Content-Length`` then goes down in the chunks it arrives in, untouched. A chunked or
unframed body (rare for blobs) is decoded by the same parser. Each download has its own
upstream connection (``Connection: close``), so no parser state outlives it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import httptools
import httpx
from starlette.requests import Request
from starlette.responses import Response

from docker_variant import __version__
from docker_variant.proxy.names import Route
from docker_variant.proxy.passthrough import StreamedResponse, Upstream, proxy_base_url
from docker_variant.proxy.responses import upstream_error

__all__ = ["BlobRelay"]

_HIGH_WATER = 4 << 20  # buffered upstream bytes at which reading pauses (back-pressure)


class _Upstream(asyncio.Protocol):
    """Received chunks handed over as the event loop delivers them: no stream buffer to copy
    into and out of (asyncio.StreamReader costs two copies and a memmove per chunk)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._closed = False
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True
        self._ready.set()

    def eof_received(self) -> bool:
        self._closed = True
        self._ready.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed, self._error = True, exc
        self._ready.set()

    async def read(self) -> bytes:
        """The next chunk; ``b""`` at the end of the stream."""
        while not self._chunks:
            if self._closed:
                if self._error is not None:
                    raise ConnectionError(f"upstream connection lost: {self._error}")
                return b""
            self._ready.clear()
            await self._ready.wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < _HIGH_WATER // 2 and self.transport is not None:
            self.transport.resume_reading()
            self._paused = False
        return chunk

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def aclose(self) -> None:
        self.close()


@dataclass
class _Head:
    """What httptools reports while the answer's head (and maybe some body) is fed to it."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    headers_done: bool = False
    message_done: bool = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.message_done = True


class BlobRelay:
    def __init__(self, upstream: Upstream, connect_timeout: float = 10.0) -> None:
        self.upstream = upstream
        self.connect_timeout = connect_timeout
        url = httpx.URL(upstream.base_url)
        self._host = url.host
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._netloc = url.netloc.decode("ascii")
        self._tls = ssl.create_default_context() if url.scheme == "https" else None

    def _request_head(self, request: Request, route: Route) -> bytes:
        target = route.upstream_path()
        if self.upstream.prefix:
            target = self.upstream.prefix + target
        query = request.scope.get("query_string", b"")
        if query:
            target += "?" + query.decode("latin-1")
        headers = self.upstream.request_headers(request)
        lines = [f"GET {target} HTTP/1.1".encode(), b"Host: " + self._netloc.encode()]
        if not any(k.lower() == b"user-agent" for k, _ in headers):
            lines.append(f"User-Agent: docker-variant-proxy/{__version__}".encode())
        lines += [k + b": " + v for k, v in headers]
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def forward(self, request: Request, route: Route) -> Response:
        what = f"GET {route.upstream_path()}"
        upstream = _Upstream()
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.get_running_loop().create_connection(
                    lambda: upstream, self._host, self._port, ssl=self._tls
                )
            assert upstream.transport is not None
            upstream.transport.write(self._request_head(request, route))
            head = _Head()
            parser = httptools.HttpResponseParser(head)
            async with asyncio.timeout(self.upstream.timeout):
                while not head.headers_done:
                    data = await upstream.read()
                    if not data:
                        raise ConnectionError("the upstream closed the connection before answering")
                    parser.feed_data(data)
        except TimeoutError:
            upstream.close()
            return upstream_error(504, "UNAVAILABLE", f"{what}: the upstream registry timed out")
        except (OSError, httptools.HttpParserError) as exc:
            upstream.close()
            return upstream_error(
                502,
                "UNAVAILABLE",
                f"{what}: the upstream registry failed: {type(exc).__name__}: {exc}",
            )
        status = parser.get_status_code()
        headers = self.upstream.response_headers(head.headers, proxy_base_url(request.scope))
        framed = _content_length(head.headers)
        chunked = any(k.lower() == b"transfer-encoding" for k, _ in head.headers)
        body = (
            _counted(upstream, head.body, framed)
            if framed is not None and not chunked
            else _parsed(upstream, parser, head)
        )
        return StreamedResponse(
            status, headers, body, upstream.aclose, (OSError, httptools.HttpParserError), what
        )


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for key, value in headers:
        if key.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


async def _counted(upstream: _Upstream, first: list[bytes], length: int) -> AsyncIterator[bytes]:
    """Exactly ``length`` body bytes, as they arrive; fewer if the upstream breaks off."""
    left = length
    for chunk in first:
        left -= len(chunk)
        yield chunk
    while left > 0:
        chunk = await upstream.read()
        if not chunk:
            raise ConnectionError(f"the upstream closed the body {left} bytes short")
        if len(chunk) > left:
            chunk = chunk[:left]  # bytes past the declared length are not part of the body
        left -= len(chunk)
        yield chunk


async def _parsed(
    upstream: _Upstream, parser: httptools.HttpResponseParser, head: _Head
) -> AsyncIterator[bytes]:
    """A chunked or unframed body, decoded by the parser (an unframed one ends at EOF)."""
    while True:
        for chunk in head.body:
            yield chunk
        head.body.clear()
        if head.message_done:
            return
        data = await upstream.read()
        if not data:
            return
        parser.feed_data(data)
