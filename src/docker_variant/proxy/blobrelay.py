"""Answers from the raw upstream pool (``upstreampool``) sent down; large bodies by a thread.

A body of ``THREAD_RELAY_MIN`` bytes or more with a ``Content-Length`` (blob layers) is
relayed by a thread of its own from the upstream socket to the client's socket (lent by
uvicorn, see ``handoff``), blocking, so a slow client holds back the upstream through the
kernel's socket buffers; per blob the proxy holds one 1 MiB buffer (or pipe), never more.
The thread copies through one reused 1 MiB buffer (``recv_into``/``send``). It can
``splice`` the bytes through a pipe instead, so that they never enter the process: that
costs the proxy half the CPU, but the blob arrives later (``bench/README.md``), so it is
an option (``--blob-relay splice``), not the default; where the kernel cannot splice, that
thread copies as well.

Bytes are relayed exactly as the upstream sent them (``Content-Length`` of them, no more),
and the designs are interchangeable (``RELAY_MODES``; their speeds are in
``bench/bench_proxy.py``).

Everything else (small bodies, chunked ones, TLS on either side) is streamed through ASGI
messages as they arrive, with the upstream connection closed at once if the caller hangs up.
A caller that hangs up mid-relay makes the next ``send`` fail; while the upstream is silent
the thread looks at the client socket every second, so a hang-up is seen there too. A client
that takes nothing for ``STALL_LIMIT_S`` seconds is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable

import anyio
import httptools
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from docker_variant.errors import one_line
from docker_variant.proxy.handoff import SocketHandoff, socket_handoff
from docker_variant.proxy.metrics import RELAY_MODE, RELAYED_BYTES
from docker_variant.proxy.upstreampool import Answer

__all__ = [
    "DEFAULT_RELAY_MODE",
    "RELAY_MODES",
    "STALL_LIMIT_S",
    "THREAD_RELAY_MIN",
    "RelayedResponse",
    "cancel_on_disconnect",
]

log = logging.getLogger("docker_variant.proxy")

THREAD_RELAY_MIN = 256 << 10  # smaller bodies are not worth a thread
# How large bodies go down (``variant-proxy --blob-relay``): a thread copying through its
# buffer, a thread splicing, or ASGI messages (no thread), so that the designs can be
# compared side by side on any machine (bench/bench_proxy.py runs all three).
RELAY_MODES = ("copy", "splice", "asgi")
DEFAULT_RELAY_MODE = "copy"  # the fastest of them where it was measured
STALL_LIMIT_S = 300  # a client that takes no byte for this long is dropped
_BUFFER_SIZE = 1 << 20  # the copy buffer, and the pipe between spliced sockets
_SPLICE = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
_IDLE_BUFFERS = 8
_TICK = struct.pack("ll", 1, 0)  # SO_RCVTIMEO/SO_SNDTIMEO: 1 s, to look around while blocked
_GONE = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)

_buffers: list[bytearray] = []
_buffers_lock = threading.Lock()


def _take_buffer() -> bytearray:
    with _buffers_lock:
        if _buffers:
            return _buffers.pop()
    return bytearray(_BUFFER_SIZE)


def _return_buffer(buffer: bytearray) -> None:
    with _buffers_lock:
        if len(_buffers) < _IDLE_BUFFERS:
            _buffers.append(buffer)


class _RelayStopped(Exception):
    pass


class _Relay:
    """One body, ``length`` bytes, from ``upstream`` to ``client`` in a thread."""

    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        first: list[bytes],
        length: int,
        splice: bool,
    ) -> None:
        self.splice = splice and _SPLICE
        self.client = client
        self.upstream = upstream
        self.first = first
        self.length = length
        self.sent = 0
        self.mode = "copy"  # or "splice", once the kernel took the first splice
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
        buffer: bytearray | None = None
        try:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TICK)
            self.upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TICK)
            left = self.length
            for chunk in self.first:
                chunk = chunk[:left] if len(chunk) > left else chunk
                self._send(memoryview(chunk))
                left -= len(chunk)
            self.first = []
            if self.splice and left > 0:
                left = self._splice(left)
            if left > 0:
                buffer = _take_buffer()
                self._copy(memoryview(buffer), left)
        except (OSError, _RelayStopped) as exc:
            self.error = exc
        finally:
            if buffer is not None:
                _return_buffer(buffer)
            self.upstream.close()
            loop.call_soon_threadsafe(_set_done, done)

    def _splice(self, left: int) -> int:
        """Moves the body through a pipe, in the kernel; returns what is left to move
        (all of it where this kernel cannot splice these sockets)."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError):  # a smaller pipe only costs more calls
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _BUFFER_SIZE)
            upstream, first = self.upstream.fileno(), True
            while left > 0:
                try:
                    got = os.splice(upstream, write_end, min(left, _BUFFER_SIZE))
                except BlockingIOError:  # a second without data: is anyone still there?
                    self._check_client()
                    continue
                except OSError as exc:
                    if first and exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        return left
                    raise
                first, self.mode = False, "splice"
                if not got:
                    raise ConnectionError(f"the upstream closed the body {left} bytes short")
                left -= got
                self._send_from_pipe(read_end, got)
        finally:
            os.close(read_end)
            os.close(write_end)
        return left

    def _send_from_pipe(self, read_end: int, size: int) -> None:
        client = self.client.fileno()
        self._write_all(size, lambda left: os.splice(read_end, client, left))

    def _copy(self, view: memoryview, left: int) -> None:
        """Moves the body through one reused buffer (where splice is not to be had)."""
        while left > 0:
            try:
                got = self.upstream.recv_into(view, min(left, _BUFFER_SIZE))
            except BlockingIOError:  # a second without data: is anyone still there?
                self._check_client()
                continue
            if not got:
                raise ConnectionError(f"the upstream closed the body {left} bytes short")
            self._send(view[:got])
            left -= got

    def _stalled(self, stalled: int) -> int:
        stalled += 1
        if stalled >= STALL_LIMIT_S:
            raise _RelayStopped(f"the client took no data for {STALL_LIMIT_S} s")
        self._check_client()
        return stalled

    def _send(self, data: memoryview) -> None:
        end = len(data)
        self._write_all(end, lambda left: self.client.send(data[end - left :]))

    def _write_all(self, size: int, write: Callable[[int], int]) -> None:
        """Hands ``size`` bytes to the client, ``write(left)`` moving some of the ``left``
        ones; a client that takes nothing is waited for (up to the stall limit), one that
        hung up stops the relay."""
        stalled = 0
        while size > 0:
            try:
                moved = write(size)
            except BlockingIOError:  # the client took nothing for a second
                stalled = self._stalled(stalled)
                continue
            except OSError as exc:  # a reset or broken pipe: the caller hung up
                raise _RelayStopped(f"the client hung up: {exc}") from exc
            stalled = 0
            self.sent += moved
            size -= moved

    def _check_client(self) -> None:
        if self.stop.is_set():
            raise _RelayStopped("the proxy is stopping")
        poller = select.poll()
        poller.register(self.client, _GONE)
        if poller.poll(0):
            raise _RelayStopped("the client hung up")


def _set_done(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class RelayedResponse(Response):
    """An ``Answer`` sent down with ``headers`` (already rewritten for the caller); the
    upstream connection goes back to the pool, or is closed, however the exchange ends.

    A failure mid-body is too late for an error status: the response is left incomplete,
    so the connection is dropped and the caller sees a short body, not a silent one.
    """

    def __init__(
        self,
        answer: Answer,
        headers: list[tuple[bytes, bytes]],
        what: str,
        mode: str = DEFAULT_RELAY_MODE,
    ) -> None:
        self.mode = mode
        self.status_code = answer.status
        self.raw_headers = headers
        self.background = None
        self._answer = answer
        self._what = what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self._answer
        try:
            start = {
                "type": "http.response.start",
                "status": answer.status,
                "headers": self.raw_headers,
            }
            body = answer.complete()
            if body is not None:  # small: the whole body came with the head
                await send(start)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            handoff = socket_handoff(scope) if self.mode != "asgi" else None
            length = answer.length
            if handoff is not None and length is not None and length >= THREAD_RELAY_MIN:
                detached = answer.detach()
                if detached is not None:
                    await send(start)
                    await self._relay(scope, send, handoff, detached, length)
                    return
            await send(start)
            await self._stream(receive, send, answer.chunks())
        finally:
            answer.close()

    async def _relay(
        self,
        scope: Scope,
        send: Send,
        handoff: SocketHandoff,
        detached: tuple[socket.socket, list[bytes]],
        length: int,
    ) -> None:
        upstream, first = detached
        client = await handoff.borrow()
        if client is None:  # the caller is gone already
            upstream.close()
            return
        relay = _Relay(client, upstream, first, length, splice=self.mode == "splice")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        worker = threading.Thread(
            target=relay.run, args=(loop, done), name="variant-proxy-blob-relay", daemon=True
        )
        try:
            worker.start()
        except RuntimeError as exc:  # out of threads: this caller gets a short body
            log.warning("no thread for a relay: %s", one_line(f"{self._what}: {exc}"))
            upstream.close()
            handoff.give_back(0, complete=False)
            return
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            relay.stop.set()  # the server is going down: the thread ends within a second
            await done
            handoff.give_back(relay.sent, complete=False)
            raise
        scope[RELAYED_BYTES], scope[RELAY_MODE] = relay.sent, relay.mode
        complete = relay.error is None and relay.sent == length
        if relay.error is not None and not isinstance(relay.error, _RelayStopped):
            log.warning("relay ended mid-body: %s", one_line(f"{self._what}: {relay.error!r}"))
        handoff.give_back(relay.sent, complete)
        if complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, receive: Receive, send: Send, chunks: AsyncIterator[bytes]) -> None:
        async with anyio.create_task_group() as group:
            # A caller that hangs up mid-body stops the upstream read at once.
            group.start_soon(cancel_on_disconnect, receive, group.cancel_scope)
            try:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except (OSError, httptools.HttpParserError) as exc:
                log.warning("upstream failed mid-body: %s", one_line(f"{self._what}: {exc!r}"))
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()


async def cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
