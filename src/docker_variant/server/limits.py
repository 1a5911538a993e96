"""What one connection may cost either server, and what enforces the limits uvicorn lacks.

uvicorn with httptools (``uvicorn[standard]``) reads a request head however long it grows and
however slowly it comes, and times a connection only while it is idle between two requests.
A caller needing no login could hold gigabytes, or every file descriptor. Here:

- ``BoundedHttpProtocol``: uvicorn's httptools protocol, handed to uvicorn through its public
  ``http`` setting (a protocol class), with a budget for the head (bytes: 431; header
  fields: 400) and a deadline for it. httptools stays, rather than h11's own head limit,
  because h11 takes obs-fold and bare LF, which the smuggling tests require refused.
- ``BodyDeadline``: ASGI middleware that times a request body only while the app waits for
  it: a silence over ``body_timeout``, or a body averaging under ``min_body_rate`` once it
  has taken that long, is answered 408 and the connection closed.
- ``uvicorn_limits``: the ``uvicorn.Config`` keywords: the protocol, ``timeout_keep_alive``,
  ``limit_concurrency`` (503 past it) and no WebSocket upgrades (neither server has any).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from docker_variant.oci.errcode import ErrorCode, error_body
from docker_variant.server import options

__all__ = ["BodyDeadline", "BoundedHttpProtocol", "ConnectionLimits", "limited", "uvicorn_limits"]


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of ``options.add_connection_limit_arguments`` (docs/security.md)."""

    max_head_bytes: int = 64 << 10
    max_header_fields: int = options.MAX_HEADER_FIELDS
    head_timeout: float = options.HEAD_TIMEOUT
    body_timeout: float = options.BODY_TIMEOUT
    min_body_rate: int = options.MIN_BODY_RATE
    keep_alive: float = 5.0
    max_connections: int = options.MAX_CONNECTIONS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ConnectionLimits:
        return cls(
            max_head_bytes=args.max_head_bytes,
            max_header_fields=args.max_header_fields,
            head_timeout=args.head_timeout,
            body_timeout=args.body_timeout,
            min_body_rate=args.min_body_rate,
            keep_alive=args.keep_alive,
            max_connections=args.max_connections,
        )


class TooManyHeaderFieldsError(Exception):
    """Raised in the parser's callback: httptools stops, and uvicorn answers 400."""


def _refusal(code: ErrorCode, message: str) -> bytes:
    body = error_body(code, message)
    status = f"{code.status} {HTTPStatus(code.status).phrase}".encode()
    head = (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded, timed request head.

    - Head bytes are counted from the head's first read until the head is whole; past
      ``max_head_bytes`` the answer is 431 and the connection closes, so at most that plus
      one socket read (256 KiB) is ever held for a head. More than ``max_header_fields``
      fields: 400.
    - While no answer is owed (a new connection, or after the last answer), the client has
      ``head_timeout`` seconds from the connection's opening or from its first byte to send
      a whole head; else the connection is closed. A body it keeps sending after its answer
      counts as such bytes. Idle time between requests stays uvicorn's keep-alive.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._reading_head = True
        self._head_bytes = 0
        self._head_fields = 0
        self._heads_begun = 0  # tells whether a read ended one message and began another
        self._answers_owed = 0  # heads read whose answer is not complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._answers_owed == 0 and self._head_timer is None:
            self._arm_head_timer()
        begun = self._heads_begun
        super().data_received(data)
        # a read that ended a message counts not: the next head is short by at most one read
        if self._reading_head and begun == self._heads_begun and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes:
                self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_fields = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.limits.max_header_fields:
            raise TooManyHeaderFieldsError(self.limits.max_header_fields)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        self._answers_owed += 1
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        self._head_bytes = 0
        self._heads_begun += 1

    def on_response_complete(self) -> None:
        self._answers_owed = max(self._answers_owed - 1, 0)
        super().on_response_complete()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self.limits.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._answers_owed == 0 and not self.transport.is_closing():
            self.transport.close()  # as nginx does on client_header_timeout: no answer

    def _refuse_head(self) -> None:
        if self._answers_owed == 0:  # else an answer is under way: the connection just ends
            limit = self.limits.max_head_bytes
            message = f"the request head is over {limit} bytes (the server's --max-head-bytes)"
            self.transport.write(_refusal(ErrorCode.HEADERS_TOO_LARGE, message))
        self.transport.close()


def bounded_protocol(limits: ConnectionLimits) -> type[BoundedHttpProtocol]:
    """``BoundedHttpProtocol`` with ``limits``, for uvicorn's ``http`` setting."""
    return type("BoundedHttpProtocol", (BoundedHttpProtocol,), {"limits": limits})


class _BodyClock:
    """One request's ``receive`` and ``send``, timing the body (see ``BodyDeadline``)."""

    def __init__(self, limits: ConnectionLimits, receive: Receive, send: Send) -> None:
        self._limits = limits
        self._receive = receive
        self._send = send
        self.whole = False  # the body has come to its end
        self.expired = False
        self.started = False  # a response has begun
        self.waited = 0.0
        self.received = 0

    def _allowed(self) -> float:
        idle, rate = self._limits.body_timeout, self._limits.min_body_rate
        if rate == 0:
            return idle
        return min(idle, idle + self.received / rate - self.waited)

    async def receive(self) -> Message:
        if self.expired:
            return {"type": "http.disconnect"}
        if self.whole:
            return await self._receive()  # e.g. the wait for a disconnect while streaming
        allowed = self._allowed()
        message: Message | None = None
        started = time.monotonic()
        if allowed > 0:
            with anyio.move_on_after(allowed):
                message = await self._receive()
        self.waited += time.monotonic() - started
        if message is None:
            await self._expire()
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.whole = not message.get("more_body", False)
        else:
            self.whole = True
        return message

    async def send(self, message: Message) -> None:
        if self.expired:
            return  # answered 408, or cut short: the app's answer goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def _expire(self) -> None:
        self.expired = True
        if self.started:
            return  # uvicorn closes a connection whose answer the app leaves unfinished
        code = ErrorCode.REQUEST_TIMEOUT
        body = error_body(
            code,
            f"the request body stalled: {self.received} bytes in {self.waited:.0f} s "
            f"(the server's --body-timeout {self._limits.body_timeout:g} s and "
            f"--min-body-rate {self._limits.min_body_rate} bytes/s)",
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # uvicorn closes after it: the rest is never read
        ]
        await self._send({"type": "http.response.start", "status": code.status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})


class BodyDeadline:
    """ASGI middleware: a request body the app waits for must keep coming. Time counts only
    while the app waits in ``receive`` (an app busy elsewhere, or a slow upstream, is not
    the client's fault). A silence of ``body_timeout`` seconds, or a body whose average rate
    is under ``min_body_rate`` once it has been waited on that long, gets 408 and the
    connection closed; the app then sees a disconnect."""

    def __init__(self, app: ASGIApp, limits: ConnectionLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        clock = _BodyClock(self.limits, receive, send)
        try:
            await self.app(scope, clock.receive, clock.send)
        except Exception:
            if not clock.expired:
                raise
            # the app's reaction to the disconnect it was handed: already answered


def limited(app: ASGIApp, limits: ConnectionLimits) -> ASGIApp:
    """``app`` with its request bodies timed (``BodyDeadline``)."""
    return BodyDeadline(app, limits)


def uvicorn_limits(limits: ConnectionLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that apply ``limits`` (the app: ``limited``)."""
    return {
        "http": bounded_protocol(limits),
        "ws": "none",  # neither server speaks WebSocket: no upgrade path to bound
        "timeout_keep_alive": math.ceil(limits.keep_alive),  # uvicorn takes whole seconds
        "limit_concurrency": limits.max_connections,
    }
