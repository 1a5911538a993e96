"""Body-less requests (GET, HEAD) to the upstream over kept-alive raw HTTP/1.1 connections.

A request head is written as bytes, the answer's head is parsed by httptools (uvicorn's C
parser), and the connection goes back to an idle pool only once its body has been read to
the end; one that closes before a byte of the answer came (a stale keep-alive) is retried once
on a fresh connection. Requests with a body (uploads) go through httpx instead. (Why not httpx
here as well: its per-request cost, measured in ``bench/bench_proxy.py``.)

A ``Content-Length`` body is handed over in the chunks it arrives in, uncopied; a chunked or
unframed one is decoded by the parser. ``Answer.detach`` gives a large body's socket to a
thread (``blobrelay``), after which the connection is closed rather than reused.

``UpstreamPool.send_nowait`` is the same exchange driven by the connection's callbacks, with
no task or future: the answer's head, and a small body whole, are parsed as they arrive and
handed to an ``AnswerListener`` (``quickread``'s path for manifests); the plainest answer,
whole in its first segment, is handed over as the bytes that came (``heads.PlainAnswers``),
without a parser.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Protocol, cast

import httptools

from docker_variant.proxy.heads import LENGTH_DIGITS, PlainAnswers

__all__ = ["Answer", "AnswerListener", "UpstreamPool", "connection_tokens", "header_tokens"]

_HIGH_WATER = 1 << 20  # buffered upstream bytes at which reading pauses (back-pressure)
SMALL_BODY = 256 << 10  # a body of at most this many bytes is awaited whole by send_nowait


class AnswerListener(Protocol):
    """Told how a ``send_nowait`` exchange ended; called from the event loop's callbacks."""

    def on_answer(self, answer: Answer) -> None:
        """The answer's head came, with the whole body where it is small (``complete()``)."""

    def on_plain(self, data: bytes, status: int, head_end: int) -> None:
        """The plainest answer came whole in one segment, as ``data`` (its head ends at
        ``head_end``; ``heads.PlainAnswers``, with the pool's ``kept_out`` names), to go
        down as it is: no parser or ``Answer`` is made for it. The exchange ends, and its
        connection goes back to the pool, once this returns."""

    def on_failure(self, error: BaseException | None) -> None:
        """No answer: ``TimeoutError``, ``OSError`` or ``httptools.HttpParserError``; or
        ``None`` where the connection closed before a byte came (a stale keep-alive, worth
        asking again on a fresh connection)."""


class _Connection(asyncio.Protocol):
    """One upstream connection. Received chunks are queued as the event loop delivers them:
    no stream buffer to copy into and out of (asyncio.StreamReader costs two copies)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.closed = False
        self.error: BaseException | None = None
        self.expired = False
        self._waiter: asyncio.Future[None] | None = None
        self.exchange: _Exchange | None = None  # a send_nowait exchange, fed from here

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.exchange is not None:
            self.exchange.feed(data)
            return
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        if self.exchange is not None:
            self.exchange.lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed, self.error = True, exc
        self._wake()
        if self.exchange is not None:
            self.exchange.lost(exc)

    def expire(self) -> None:
        """The deadline for the answer's head passed: the waiting ``read`` raises."""
        self.expired = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes:
        """The next chunk; ``b""`` at the end of the stream."""
        while not self.chunks:
            if self.expired:
                raise TimeoutError("no answer from the upstream in time")
            if self.closed:
                if self.error is not None:
                    raise ConnectionError(f"upstream connection lost: {self.error}")
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < _HIGH_WATER // 2 and self.transport is not None:
            self.transport.resume_reading()
            self.paused = False
        return chunk

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _NoAnswerError(ConnectionError):
    """The connection closed before a byte of the answer came (a stale keep-alive)."""


class _Head:
    """What httptools reports while an answer (head, maybe some body) is fed to it; the
    framing headers are noted as they come, so nobody scans the list for them again."""

    __slots__ = (
        "body",
        "chunked",
        "connection",
        "content_length",
        "headers",
        "headers_done",
        "message_done",
    )

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.connection: list[bytes] = []  # values of Connection headers
        self.content_length: int | None = None
        self.chunked = False
        self.headers_done = False
        self.message_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()  # once, as ASGI has them
        self.headers.append((name, value))
        if name == b"content-length":
            digits = value.strip()
            if digits.isdigit() and len(digits) <= LENGTH_DIGITS:
                self.content_length = int(digits)
        elif name == b"transfer-encoding":
            self.chunked = True
        elif name == b"connection":
            self.connection.append(value)

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.message_done = True


_NO_HEAD = _Head()  # an exchange's head before any byte came: nothing reported


def connection_tokens(
    headers: Iterable[tuple[bytes, bytes]], lowered: bool = False
) -> frozenset[bytes]:
    """The tokens of ``Connection``: ``close``, ``keep-alive``, and header names that are
    hop-by-hop too (RFC 9110 7.6.1)."""
    return header_tokens(v for k, v in headers if (k if lowered else k.lower()) == b"connection")


def header_tokens(values: Iterable[bytes]) -> frozenset[bytes]:
    """The comma-separated tokens of header ``values``, in lower case."""
    return frozenset(t.strip().lower() for v in values for t in v.split(b",") if t.strip())


def _keeps_alive(version: str, tokens: frozenset[bytes]) -> bool:
    # httptools' should_keep_alive() is False until the message is complete
    return b"keep-alive" in tokens if version == "1.0" else b"close" not in tokens


class Answer:
    """An upstream answer whose head has been read; the body is read with ``chunks`` (or
    ``detach``). Its connection goes back to the pool only when the body was read to its
    end; ``close`` drops it otherwise (an unread body cannot be skipped cheaply)."""

    def __init__(
        self,
        pool: UpstreamPool,
        connection: _Connection,
        parser: httptools.HttpResponseParser,
        head: _Head,
        has_body: bool,
    ) -> None:
        self.status: int = parser.get_status_code()
        self.headers = head.headers
        self._pool = pool
        self._connection: _Connection | None = connection
        self._parser = parser
        self._head = head
        # the tokens of Connection: close, keep-alive, and header names that are hop-by-hop
        self.connection_tokens = header_tokens(head.connection) if head.connection else frozenset()
        self._reusable = _keeps_alive(parser.get_http_version(), self.connection_tokens)
        self.length: int | None = 0  # body bytes; None: chunked or up to EOF
        self._chunked = False
        if has_body and self.status not in (204, 304) and not 100 <= self.status < 200:
            chunked = head.chunked
            self._chunked = chunked
            self.length = None if chunked else head.content_length
            if self.length is None and not chunked:
                self._reusable = False  # an unframed body ends with the connection
        if self.length == 0:
            self._finish()

    def complete(self) -> bytes | None:
        """The whole body if it has already arrived (small answers), else ``None``."""
        if self.length is None:
            return None
        chunks = self._head.body
        if len(chunks) == 1:  # most small answers: no copy
            body = chunks[0]
            if len(body) < self.length:
                return None
        elif sum(len(c) for c in chunks) < self.length:
            return None
        else:
            body = b"".join(chunks)
        if len(body) > self.length:
            body = body[: self.length]
        chunks.clear()
        self._finish()
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, as it arrives; raises ``ConnectionError`` if it breaks off."""
        connection = self._connection
        if connection is None:
            return
        if self.length is not None:
            left = self.length
            for chunk in self._head.body:
                chunk = chunk[:left] if len(chunk) > left else chunk
                left -= len(chunk)
                yield chunk
            self._head.body.clear()
            while left > 0:
                chunk = await connection.read()
                if not chunk:
                    raise ConnectionError(f"the upstream closed the body {left} bytes short")
                if len(chunk) > left:
                    chunk = chunk[:left]  # bytes past the declared length are not the body
                left -= len(chunk)
                yield chunk
            self._finish()
            return
        head = self._head
        while True:
            for chunk in head.body:
                yield chunk
            head.body.clear()
            if head.message_done:
                self._finish()
                return
            data = await connection.read()
            if not data:
                if self._chunked:
                    raise ConnectionError("the upstream closed a chunked body before its end")
                self.close()  # an unframed body ends at EOF
                return
            self._parser.feed_data(data)

    def detach(self) -> tuple[socket.socket, list[bytes]] | None:
        """A blocking duplicate of the connection's socket and the body bytes already
        received, for a thread to read the rest from; ``None`` where that cannot be done
        (TLS upstream). The connection is closed when ``close`` is called."""
        connection = self._connection
        if connection is None or connection.transport is None or self._pool.tls is not None:
            return None
        raw = connection.transport.get_extra_info("socket")
        if raw is None or (connection.closed and not connection.chunks):
            return None
        connection.transport.pause_reading()  # from now on only the thread reads
        connection.paused = True
        self._reusable = False
        first = [*self._head.body, *connection.chunks]
        self._head.body.clear()
        connection.chunks.clear()
        sock = socket.socket(fileno=os.dup(raw.fileno()))
        sock.setblocking(True)
        return sock, first

    def _finish(self) -> None:
        """The body has been read to its end: the connection may serve the next request."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, self._reusable and not connection.chunks)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class _Exchange:
    """One ``send_nowait`` request on a connection: the answer is parsed in the connection's
    ``data_received`` and handed over once its head (and a small body whole) is in."""

    __slots__ = ("connection", "has_body", "head", "listener", "parser", "pool")

    def __init__(
        self,
        pool: UpstreamPool,
        connection: _Connection,
        has_body: bool,
        listener: AnswerListener,
    ) -> None:
        self.pool = pool
        self.connection = connection
        self.has_body = has_body
        self.listener = listener
        # made once bytes came that PlainAnswers did not take (None: not a byte yet)
        self.parser: httptools.HttpResponseParser | None = None
        self.head = _NO_HEAD  # the parser's, once there is one

    def feed(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:  # the answer's first bytes
            plain = self.pool.plain_answers.take(data, self.has_body)
            if plain is not None:  # the plainest answer: no parser, no Answer
                try:
                    self.listener.on_plain(data, *plain)  # down first: the caller waits
                finally:
                    self._end()
                    self.pool.release(self.connection, True)
                return
            self.head = _Head()
            parser = self.parser = httptools.HttpResponseParser(self.head)
        head = self.head
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            return
        if not head.headers_done:
            return
        if head.message_done or not self._awaits_body():
            self._answer()
        else:  # the deadline is the head's: a body is never timed, as on the ASGI path
            self.pool.forget(self)

    def _awaits_body(self) -> bool:
        """A small framed body is awaited whole; a large, chunked or unframed one goes on
        the ``Answer``'s own way."""
        head = self.head
        assert self.parser is not None
        if not self.has_body or head.chunked or head.content_length is None:
            return False
        status = self.parser.get_status_code()
        if status in (204, 304) or 100 <= status < 200:
            return False
        return head.content_length <= SMALL_BODY

    def _answer(self) -> None:
        self._end()
        assert self.parser is not None
        self.listener.on_answer(
            Answer(self.pool, self.connection, self.parser, self.head, self.has_body)
        )

    def lost(self, exc: BaseException | None) -> None:
        if self.head.headers_done:  # the body broke off: the Answer reports it
            self._answer()
        elif self.parser is None:
            self._end()  # not a byte came: a stale keep-alive
            self.connection.close()
            self.listener.on_failure(None)
        else:
            reason = f": {exc}" if exc is not None else ""
            self._fail(ConnectionError(f"the upstream closed the connection mid-answer{reason}"))

    def expire(self) -> None:
        """The deadline for the answer's head passed (the pool's watchdog)."""
        self._fail(TimeoutError("no answer from the upstream in time"))

    def _fail(self, error: BaseException) -> None:
        self._end()
        self.connection.close()
        self.listener.on_failure(error)

    def _end(self) -> None:
        self.connection.exchange = None
        self.pool.forget(self)


class UpstreamPool:
    """Kept-alive connections to one upstream ``host:port``; at most ``max_idle`` wait idle."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        connect_timeout: float,
        max_idle: int = 64,
        kept_out: frozenset[bytes] = frozenset(),
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        # answers without these header names (those a proxy drops or rewrites) may go down
        # as they came (on_plain)
        self.plain_answers = PlainAnswers(kept_out)
        self._idle: deque[_Connection] = deque()
        # the loop its connections belong to (asyncio.get_running_loop costs a getpid())
        self.loop: asyncio.AbstractEventLoop | None = None
        # send_nowait exchanges waiting for a head, with their deadlines; one watchdog timer
        # for them all (a timer per request, set and cancelled, cost more than the rest)
        self._waiting: dict[_Exchange, float] = {}
        self._watchdog: asyncio.TimerHandle | None = None

    async def _connect(self, deadline: float) -> _Connection:
        connection = _Connection()
        loop = self.loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(min(deadline, loop.time() + self.connect_timeout)):
            await loop.create_connection(lambda: connection, self.host, self.port, ssl=self.tls)
        return connection

    async def request(self, head: bytes, *, has_body: bool, timeout: float) -> Answer:
        """Send a request ``head`` (no body) and read the answer's head within ``timeout``
        seconds (connecting included). A kept-alive connection that turns out closed is
        retried once on a new one (GET and HEAD are safe to repeat). Raises ``OSError``,
        ``httptools.HttpParserError`` or ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            connection = self._take()
            reused = connection is not None
            if connection is None:
                connection = await self._connect(deadline)
            # one timer handle, not a timeout context: this is every GET's path
            timer = loop.call_at(deadline, connection.expire)
            try:
                return await self._exchange(connection, head, has_body)
            except _NoAnswerError:
                connection.close()
                if not reused:
                    raise
            except BaseException:
                connection.close()
                raise
            finally:
                timer.cancel()

    async def _exchange(self, connection: _Connection, head: bytes, has_body: bool) -> Answer:
        assert connection.transport is not None
        connection.transport.write(head)
        parsed = _Head()
        parser = httptools.HttpResponseParser(parsed)
        received = False
        while not parsed.headers_done:
            try:
                data = await connection.read()
            except ConnectionError as exc:
                raise exc if received else _NoAnswerError(str(exc)) from exc
            if not data:
                if received:
                    raise ConnectionError("the upstream closed the connection mid-answer")
                raise _NoAnswerError("the upstream closed the connection before answering")
            received = True
            parser.feed_data(data)
        return Answer(self, connection, parser, parsed, has_body)

    def send_nowait(
        self, head: bytes, *, has_body: bool, timeout: float, listener: AnswerListener
    ) -> bool:
        """``request`` driven by callbacks, on an idle kept-alive connection: False (nothing
        sent) where there is none. ``listener`` gets the answer, or the failure, from the
        event loop's callbacks, never from within this call."""
        loop, connection = self.loop, self._take()
        if loop is None or connection is None or connection.transport is None:
            return False
        # the head goes first: the answer can only come once this callback has returned,
        # and the upstream gets to work while the exchange is set up
        connection.transport.write(head)
        exchange = _Exchange(self, connection, has_body, listener)
        deadline = loop.time() + timeout
        self._waiting[exchange] = deadline
        if self._watchdog is None or deadline < self._watchdog.when():
            self._arm(loop, deadline)
        connection.exchange = exchange
        return True

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = loop.call_at(deadline, self._expire_due)

    def _expire_due(self) -> None:
        """The watchdog: every exchange past its deadline fails; it is armed again for the
        earliest deadline left."""
        self._watchdog = None
        loop = self.loop
        if loop is None:
            return
        now = loop.time()
        for exchange, deadline in list(self._waiting.items()):
            if deadline <= now:
                exchange.expire()  # forgets it
        if self._waiting:
            self._arm(loop, min(self._waiting.values()))

    def forget(self, exchange: _Exchange) -> None:
        """``exchange`` is over: the watchdog no longer looks at it."""
        self._waiting.pop(exchange, None)

    def _take(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        return None

    def release(self, connection: _Connection, reusable: bool) -> None:
        if reusable and not connection.closed and len(self._idle) < self.max_idle:
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
