"""A client connection's socket, lent to a thread for one response body (uvicorn, plain HTTP).

uvicorn hands an ASGI app's body to the event loop one message at a time, and reads 256,000
bytes at a time into a fresh bytes object: a page fault and a Python round trip per chunk
(what that costs a blob is in ``bench/bench_proxy.py``). The protocol class here is
uvicorn's own httptools protocol plus one ASGI scope extension, ``EXTENSION``: after sending ``http.response.start``
as usual (so the access log, ``Connection`` handling and keep-alive stay uvicorn's), an app
may ``borrow()`` a blocking duplicate of the connection's socket, write the body from a
thread, and ``give_back()`` the socket with the count written. A complete body is then
closed with an empty ``http.response.body`` message and the connection is kept alive as
after any other answer; an incomplete one closes the connection (the caller sees a short
body, as when a streamed body breaks off).

Only plain-HTTP connections get the extension: under TLS the bytes must go through the
transport's SSL layer, so apps fall back to ASGI messages there.

This leans on uvicorn's private protocol (``HttpToolsProtocol`` and its request cycle):
pyproject.toml bounds uvicorn to the releases that ``tests/test_proxy_handoff.py`` checks
``PRIVATE_NAMES`` on.

``send_whole()`` sends a small answer, head and body, in one write of bytes built once
(uvicorn would check and copy each header again on its way out).

The protocol also holds a response head back until the body's first write, the response's
end, or the end of the event loop's turn: uvicorn writes head and body separately, so a small answer (a
manifest) cost two syscalls and two TCP segments, and the caller woke up twice.

Keep-alive: one timer per connection, looked at when it fires, rather than one made per
answer and cancelled at the next request (uvicorn's way); the time-out is uvicorn's.

Quick reads: an app with a ``quick_reads`` attribute (a ``QuickReads``) is offered each
plain-HTTP GET and HEAD as its head is parsed, before uvicorn builds a request cycle and an
ASGI task for it. One it takes is answered from callbacks through a ``QuickCycle``
(``send_whole``), or handed back to ASGI at any point before its answer started
(``continue_with``); one it leaves goes the usual way. A request head that came whole in
one read, as plain as ``heads.split_request`` takes, is offered without uvicorn's parser
(its callbacks were a large part of a manifest GET's time), with the scope uvicorn would
build; any other is parsed by uvicorn first.
"""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.parse
from typing import Any, Protocol, cast

import httptools
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from docker_variant.proxy.heads import split_request

__all__ = [
    "EXTENSION",
    "PRIVATE_NAMES",
    "HandoffHttpToolsProtocol",
    "QuickCycle",
    "QuickReads",
    "SocketHandoff",
    "socket_handoff",
]

EXTENSION = "docker_variant.socket_handoff"
# What this module uses of uvicorn's private protocol, by class: attributes and methods.
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "HttpToolsProtocol": (
        "on_headers_complete", "on_response_complete", "cycle", "scope", "scheme",
        "transport", "loop", "flow", "parser", "url", "root_path", "pipeline",
        "limit_concurrency", "expect_100_continue", "logger", "access_logger", "access_log",
        "server_state", "_start_asgi_task", "timeout_keep_alive", "timeout_keep_alive_task",
        "timeout_keep_alive_handler", "_unset_keepalive_if_required", "connection_lost",
        "data_received", "on_message_begin", "on_message_complete", "asgi_version",
        "server", "client", "app_state",
    ),
    "RequestResponseCycle": (
        "scope", "transport", "response_started", "response_complete", "disconnected",
        "keep_alive", "expected_content_length", "message_event", "on_response", "body",
        "more_body",
    ),
    "FlowControl": ("pause_reading", "resume_reading"),
}  # fmt: skip
_JOIN_MAX = 64 << 10  # a held head is joined to a first body write up to this size


class _HeadHeldTransport:
    """The connection's transport, as one request's cycle sees it: its first write (the
    response head) is held until the next write or the loop's next turn, then sent with it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        if held is None:
            self._transport.write(data)
        elif len(data) <= _JOIN_MAX:
            self._transport.write(held + data)
        else:  # a big first chunk is not copied to join the head
            self._transport.writelines([held, data])

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        self.flush()
        return self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class SocketHandoff:
    """One request's claim on its connection's socket; all methods run on the event loop."""

    def __init__(self, protocol: HttpToolsProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle
        self._lent: socket.socket | None = None

    async def borrow(self) -> socket.socket | None:
        """A blocking duplicate of the client socket, once the response head has left;
        ``None`` when the caller is gone (or the head was not sent through ASGI)."""
        cycle, transport = self._cycle, self._protocol.transport
        if not cycle.response_started or cycle.response_complete or self._lent is not None:
            return None
        cycle.transport.get_write_buffer_size()  # sends a held head
        # uvloop writes the head at once; a full socket buffer would keep some of it back
        while not cycle.disconnected and transport.get_write_buffer_size():
            await asyncio.sleep(0.001)
        if cycle.disconnected or transport.is_closing():
            return None
        raw = transport.get_extra_info("socket")
        if raw is None:
            return None
        # The loop must not read the connection while a thread owns it; uvicorn resumes
        # reading when the response completes (a pipelined request waits in the kernel).
        self._protocol.flow.pause_reading()
        lent = socket.socket(fileno=os.dup(raw.fileno()))
        # O_NONBLOCK belongs to the shared open file: it is restored in give_back, before
        # the loop touches the socket again.
        lent.setblocking(True)
        self._lent = lent
        return lent

    def send_whole(self, head: bytes, body: bytes) -> bool:
        """Sends a whole answer in one write, in place of the ``http.response.start`` and
        ``http.response.body`` messages: ``head`` is its status line and header lines, each
        ending in CRLF, with a ``Content-Length`` of ``body`` (left out for HEAD) and
        without the blank line. The headers are not checked again: they must come from a
        parser (the upstream's answer). uvicorn's connection handling stays: a connection
        that is not kept alive gets ``Connection: close`` and is closed. False (nothing
        sent) once a response has started or the caller is gone."""
        cycle = self._cycle
        if cycle.response_started or cycle.disconnected:
            return False
        cycle.response_started = True
        transport = self._protocol.transport
        tail = b"\r\n" if cycle.keep_alive else b"connection: close\r\n\r\n"
        if cycle.scope["method"] == "HEAD" or not body:
            transport.write(head + tail)
        else:
            transport.write(b"".join((head, tail, body)))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()
        return True

    def give_back(self, sent: int, complete: bool) -> None:
        """The thread is done: ``sent`` body bytes went out. Complete: the app then sends an
        empty final ``http.response.body``. Incomplete: the connection is closed here."""
        lent, self._lent = self._lent, None
        if lent is None:
            return
        cycle = self._cycle
        try:
            lent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bytes(16))
            lent.setblocking(False)
        except OSError:
            complete = False  # the connection broke: do not hand it back to keep-alive
        finally:
            lent.close()
        if complete:
            cycle.expected_content_length -= sent  # uvicorn checks the declared length
            return
        cycle.keep_alive = False
        cycle.disconnected = True  # nothing more can be sent; uvicorn logs no error for it
        self._protocol.transport.close()


class _NoEvent:
    """A quick request's ``message_event``: nothing waits on it."""

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class QuickCycle:
    """A GET or HEAD answered from the event loop's callbacks; it stands in for uvicorn's
    request cycle, whose attributes the protocol reads and writes (``response_complete``,
    ``more_body``, ``body``, ``disconnected``, ``keep_alive``, ``message_event``,
    ``transport``) until the answer is sent or the request is handed on to ASGI.

    It carries the request's parts as they came (``method``, ``raw_path`` without the root
    path, ``query``, ``headers`` as ASGI has them); its ASGI ``scope`` is built only when
    something asks for it (an answer handed on to ASGI, a URL to rewrite), which a plain
    read that goes well never does."""

    __slots__ = (
        "_scope", "body", "disconnected", "headers", "keep_alive", "message_event", "method",
        "more_body", "protocol", "query", "raw_path", "response_complete", "transport",
    )  # fmt: skip

    def __init__(
        self,
        protocol: HandoffHttpToolsProtocol,
        method: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        scope: dict[str, Any] | None = None,
    ) -> None:
        self.protocol = protocol
        self.method = method
        self.raw_path = raw_path
        self.query = query
        self.headers = headers
        self.keep_alive = keep_alive
        self._scope = scope
        self.transport = protocol.transport
        self.disconnected = False
        self.response_complete = False
        self.more_body = True
        self.body = bytearray()
        self.message_event = _NO_EVENT

    @property
    def path(self) -> str:
        """The ASGI ``path``: the root path and the raw path, percent-decoded."""
        path = self.raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        return self.protocol.root_path + path

    @property
    def scope(self) -> dict[str, Any]:
        """The request's ASGI scope, as uvicorn would build it."""
        if self._scope is None:
            self._scope = self.protocol.scope_of(self)
        return self._scope

    def send_whole(self, head: bytes, body: bytes) -> bool:
        """``SocketHandoff.send_whole`` for a quick request; False (nothing sent) once the
        caller is gone or the request went on to ASGI."""
        if self.response_complete or self.disconnected:
            self.response_complete = True
            return False
        self.response_complete = True
        protocol = self.protocol
        transport = protocol.transport
        tail = b"\r\n" if self.keep_alive else b"connection: close\r\n\r\n"
        if self.method == "HEAD" or not body:
            transport.write(head + tail)
        else:
            transport.write(b"".join((head, tail, body)))
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()
        return True

    def send_as_is(self, data: bytes, head_end: int) -> bool:
        """``send_whole`` for an upstream answer that goes down as it came (``data``, whose
        head ends at ``head_end``); on a connection kept alive, that is one write of it."""
        if not self.keep_alive:  # the caller asked for close: its answer says so
            return self.send_whole(data[: head_end - 2], data[head_end:])
        if self.response_complete or self.disconnected:
            self.response_complete = True
            return False
        self.response_complete = True
        protocol = self.protocol
        protocol.transport.write(data)
        protocol.on_response_complete()
        return True

    def continue_with(self, app: ASGIApp) -> None:
        """Runs ``app`` for this request as uvicorn runs its app (a request cycle and a task,
        with the ``SocketHandoff`` extension), from where the quick path left it."""
        if self.response_complete:
            return
        self.response_complete = True  # this stand-in is done with
        protocol = self.protocol
        cycle = protocol.new_cycle(self.scope, self.keep_alive)
        cycle.body, cycle.more_body, cycle.disconnected = (
            self.body,
            self.more_body,
            self.disconnected,
        )
        if cast(object, protocol.cycle) is self:
            protocol.cycle = cycle
        protocol._start_asgi_task(cycle, cast(Any, app))  # uvicorn's own way to run a cycle


class QuickReads(Protocol):
    """What an app offers to answer plain-HTTP GET and HEAD requests from callbacks."""

    def start(self, cycle: QuickCycle) -> bool:
        """True: the request is taken (answered through ``cycle``, now or later). False:
        nothing was done, and the request goes to the ASGI app as usual."""


class HandoffHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; plain-HTTP requests carry a ``SocketHandoff``, and are
    offered to the app's ``quick_reads`` first where it has one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        quick = getattr(self.config.app, "quick_reads", None)
        self.quick_reads: QuickReads | None = (
            quick if quick is not None and self.limit_concurrency is None else None
        )

    # The parser is between messages: no part of a request has been fed to it unanswered.
    _between = True
    _declined = False  # the request now fed to the parser was offered to quick_reads already

    def data_received(self, data: bytes) -> None:
        if self.quick_reads is not None and self._between and self._take_split(data):
            return
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._between = False
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._between = True
        super().on_message_complete()

    def _take_split(self, data: bytes) -> bool:
        """Offers a request to ``quick_reads`` without the parser: one that came whole in
        ``data`` and is as plain as ``heads.split_request`` takes, on a connection with
        nothing else in flight. False: ``data`` goes to the parser (and the request, if
        declined, is not offered again)."""
        cycle = self.cycle
        if self.scheme != "http" or self.pipeline or (cycle and not cycle.response_complete):
            return False
        split = split_request(data)
        if split is None:
            return False
        method, target, headers = split
        raw_path, _, query = target.partition(b"?")
        self._idle_since = None  # busy, as uvicorn's data_received marks it
        quick = QuickCycle(self, method, raw_path, query, headers, keep_alive=True)
        quick.more_body = False  # the request is all here: no body to come
        if self._offer(quick):
            return True
        self._declined = True
        return False

    def scope_of(self, quick: QuickCycle) -> dict[str, Any]:
        """The scope uvicorn builds for a request of this connection, with ``quick``'s
        parts."""
        scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "root_path": self.root_path,
            "headers": quick.headers,
            "state": self.app_state.copy(),
            "method": quick.method,
        }
        self._fill_target(scope, quick)
        return scope

    def _fill_target(self, scope: dict[str, Any], quick: QuickCycle) -> None:
        """``scope``'s path, raw path and query, from ``quick``'s, as uvicorn fills them."""
        root = self.root_path
        scope["path"] = quick.path
        scope["raw_path"] = root.encode("ascii") + quick.raw_path if root else quick.raw_path
        scope["query_string"] = quick.query

    def on_headers_complete(self) -> None:
        declined, self._declined = self._declined, False
        if (
            self.quick_reads is not None
            and not declined
            and self.scheme == "http"
            and self._start_quick()
        ):
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:
            return  # an upgrade, not a request cycle
        self._dress(cycle)

    def _dress(self, cycle: RequestResponseCycle) -> None:
        cycle.transport = cast(asyncio.Transport, _HeadHeldTransport(self.transport, self.loop))
        if self.scheme == "http":
            scope = cast(dict[str, Any], cycle.scope)
            scope.setdefault("extensions", {})[EXTENSION] = SocketHandoff(self, cycle)

    def _start_quick(self) -> bool:
        """Offers the request to ``quick_reads`` with its scope filled in as uvicorn fills
        it; only a GET or HEAD on a connection with nothing else in flight."""
        assert self.quick_reads is not None
        parser = self.parser
        method = parser.get_method()
        if method not in (b"GET", b"HEAD") or self.pipeline or self.expect_100_continue:
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False
        if parser.should_upgrade():
            return False
        scope = cast(dict[str, Any], self.scope)
        http_version = parser.get_http_version()
        scope["method"] = "GET" if method == b"GET" else "HEAD"
        if http_version != "1.1":
            scope["http_version"] = http_version
        url = httptools.parse_url(self.url)
        raw_path, query = url.path, url.query or b""
        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        quick = QuickCycle(
            self, scope["method"], raw_path, query, scope["headers"], keep_alive, scope=scope
        )
        self._fill_target(scope, quick)
        return self._offer(quick)

    def _offer(self, quick: QuickCycle) -> bool:
        """Offers the request to ``quick_reads`` through ``quick``; where it is declined,
        the connection's cycle is as it was."""
        previous = self.cycle
        self.cycle = cast(RequestResponseCycle, quick)
        assert self.quick_reads is not None
        if self.quick_reads.start(quick):
            return True
        self.cycle = previous
        return False

    def new_cycle(self, scope: dict[str, Any], keep_alive: bool) -> RequestResponseCycle:
        """A request cycle as uvicorn's ``on_headers_complete`` makes it, with this module's
        transport and extension."""
        cycle = RequestResponseCycle(
            scope=cast(Any, scope),
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=keep_alive,
            on_response=self.on_response_complete,
        )
        self._dress(cycle)
        return cycle

    # Keep-alive: uvicorn sets a timer after each answer and cancels it at the next request's
    # first bytes, a timer handle made and dropped per request. Here a connection has one
    # timer, set when an answer completes and none is set; when it fires, an idle
    # connection is closed if it has been idle for the time-out, else it waits the rest.
    _idle_since: float | None = None  # loop time of the last answer; None while busy

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # busy: a timer that fires now does nothing

    def on_response_complete(self) -> None:
        """uvicorn's ``on_response_complete`` (start a pipelined request, or wait for the
        next one kept alive), with the keep-alive timer above."""
        # a HEAD answer (or any without a body) has no body write to carry its head
        transport = self.cycle.transport if self.cycle is not None else None
        if isinstance(transport, _HeadHeldTransport):
            transport.flush()
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_due
            )

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:
            return  # busy; set again when its answer completes
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None


def socket_handoff(scope: dict[str, Any] | Any) -> SocketHandoff | None:
    extensions = scope.get("extensions") or {}
    handoff = extensions.get(EXTENSION)
    return handoff if isinstance(handoff, SocketHandoff) else None
