"""Plain reads on a kept-alive upstream connection, answered from the proxy's callbacks
(``proxy/quickread.py``): every way an upstream answer can go, against a scripted upstream
that says exactly what each test needs on the connection the proxy keeps."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import httpx
import pytest

from docker_variant.proxy.upstreampool import SMALL_BODY
from proxyrunner import ProxyServer, eventually

MANIFEST = "/v2/a/manifests/1"


@dataclass
class Asked:
    connection: int  # which upstream connection, counted from 0 in accept order
    method: str
    path: str
    head: bytes


# What the upstream does about one request on a connection: writes these pieces in order
# (an Event is waited for in between), then closes the connection where ``close``.
@dataclass
class Say:
    pieces: list[bytes | threading.Event] = field(default_factory=list)
    close: bool = False


Script = Callable[[Asked], Say]


def answer(body: bytes, status: str = "200 OK", **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class ScriptedUpstream:
    """An HTTP/1.1 upstream on a loopback port, keeping connections alive; each request's
    answer is what ``script`` says."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.asked: list[Asked] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            number, self._accepted = self._accepted, self._accepted + 1
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in pending:
                    got = conn.recv(65536)
                    if not got:
                        return
                    pending += got
                head, _, pending = pending.partition(b"\r\n\r\n")
                method, path, _ = head.split(b" ", 2)
                asked = Asked(number, method.decode(), path.decode(), head)
                self.asked.append(asked)
                say = self.script(asked)
                for piece in say.pieces:
                    if isinstance(piece, threading.Event):
                        piece.wait(30)
                    else:
                        conn.sendall(piece)
                if say.close:
                    return

    def close(self) -> None:
        self._server.close()


# The proxy's upstream time-out: one that no answer here meets, even on a loaded machine
# (a test whose answer came after it would see a 504 instead), and a short one for the tests
# that wait it out.
PATIENT_S = 60.0
WAITED_OUT_S = 2.0


class StartUpstream(Protocol):
    def __call__(
        self, script: Script, upstream_timeout: float = PATIENT_S
    ) -> tuple[ScriptedUpstream, ProxyServer]: ...


@pytest.fixture
def upstream_with() -> Iterator[StartUpstream]:
    started: list[tuple[ScriptedUpstream, ProxyServer]] = []

    def start(
        script: Script, upstream_timeout: float = PATIENT_S
    ) -> tuple[ScriptedUpstream, ProxyServer]:
        upstream = ScriptedUpstream(script)
        proxy = ProxyServer(upstream.url, upstream_timeout=upstream_timeout).start()
        started.append((upstream, proxy))
        return upstream, proxy

    yield start
    for upstream, proxy in started:
        proxy.stop()
        upstream.close()


def _requests(proxy: ProxyServer, route: str, method: str, status: str) -> float:
    labels = {"route": route, "method": method, "status": status}
    return proxy.sample("variant_proxy_requests_total", labels)


def test_reads_go_over_the_kept_connection_with_headers_as_forwarded(
    upstream_with: StartUpstream,
) -> None:
    body = b'{"schemaVersion": 2}'

    def script(asked: Asked) -> Say:
        return Say([answer(body, Docker_Content_Digest="sha256:" + "a" * 64, X_Hop="1",
                           Connection="X-Hop")])  # fmt: skip

    upstream, proxy = upstream_with(script)
    with httpx.Client() as client:
        for method in ("GET", "HEAD", "GET", "HEAD"):
            got = client.request(
                method,
                proxy.url + MANIFEST,
                headers={"Accept": "x/y", "TE": "trailers", "Connection": "keep-alive, X-Mine",
                         "X-Mine": "1"},
            )  # fmt: skip
            assert got.status_code == 200
            assert got.content == (body if method == "GET" else b"")
            assert got.headers["content-length"] == str(len(body))
            assert got.headers["docker-content-digest"] == "sha256:" + "a" * 64
            assert "x-hop" not in got.headers and "date" in got.headers
    assert [a.connection for a in upstream.asked] == [0, 0, 0, 0]  # one kept connection
    assert [a.method for a in upstream.asked] == ["GET", "HEAD", "GET", "HEAD"]
    sent = upstream.asked[-1].head.lower()
    assert b"\r\naccept: x/y" in sent and b"te: trailers" not in sent
    assert b"x-mine" not in sent and b"connection" not in sent  # hop-by-hop, named or not
    assert b"\r\nhost: 127.0.0.1:" in sent and b"user-agent: " in sent
    assert _requests(proxy, "manifest", "GET", "200") == 2
    assert _requests(proxy, "manifest", "HEAD", "200") == 2


def test_a_plain_answer_goes_down_as_the_upstream_wrote_it(
    upstream_with: StartUpstream,
) -> None:
    """An answer with a Date and nothing to drop or rewrite goes down byte for byte (its
    names' case and reason phrase included); a caller that asks for close gets it with
    ``connection: close`` and then an EOF; each is counted."""
    body = b'{"schemaVersion": 2}'
    plain = answer(body, "200 Fine", DATE="Fri, 04 Dec 2026 14:00:00 GMT", eTag='"x"')

    def script(asked: Asked) -> Say:
        return Say([plain if asked.method == "GET" else plain[: -len(body)]])

    _, proxy = upstream_with(script)
    httpx.get(proxy.url + MANIFEST)  # an upstream connection to keep
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as caller:
        for method, expected in (("GET", plain), ("HEAD", plain[: -len(body)]), ("GET", plain)):
            caller.sendall(f"{method} {MANIFEST} HTTP/1.1\r\nHost: {proxy.host}\r\n\r\n".encode())
            got = b""
            while len(got) < len(expected):
                piece = caller.recv(65536)
                assert piece, got
                got += piece
            assert got == expected
        caller.sendall(
            f"GET {MANIFEST} HTTP/1.1\r\nHost: {proxy.host}\r\nConnection: close\r\n\r\n".encode()
        )
        got = b""
        while piece := caller.recv(65536):  # to the EOF
            got += piece
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"\r\nconnection: close" in head.lower()
    assert rest == body
    assert _requests(proxy, "manifest", "GET", "200") == 4
    assert _requests(proxy, "manifest", "HEAD", "200") == 1


def _on_the_kept_connection(say: Say) -> Callable[[Asked], Say]:
    """The first request on each connection gets a small manifest, the second request on
    the first connection gets ``say``."""
    counts: dict[int, int] = {}

    def script(asked: Asked) -> Say:
        counts[asked.connection] = counts.get(asked.connection, 0) + 1
        if asked.connection == 0 and counts[0] == 2:
            return say
        return Say([answer(b'{"connection": %d}' % asked.connection)])

    return script


def _twice(proxy: ProxyServer) -> tuple[httpx.Response, httpx.Response]:
    with httpx.Client(timeout=10) as client:
        first = client.get(proxy.url + MANIFEST)
        return first, client.get(proxy.url + MANIFEST)


def test_a_connection_closed_before_answering_is_asked_again_on_a_new_one(
    upstream_with: StartUpstream,
) -> None:
    upstream, proxy = upstream_with(_on_the_kept_connection(Say(close=True)))
    first, second = _twice(proxy)
    assert first.json() == {"connection": 0}
    assert second.status_code == 200 and second.json() == {"connection": 1}
    assert [a.connection for a in upstream.asked] == [0, 0, 1]
    assert _requests(proxy, "manifest", "GET", "200") == 2


@pytest.mark.parametrize(
    ("say", "status", "words"),
    [
        (Say([threading.Event()]), 504, "timed out"),  # never set: no answer in time
        (Say([b"HTTP/1.1 2x0 Nonsense\r\n\r\n"], close=True), 502, "failed"),
        (Say([b"HTTP/1.1 200 OK\r\nContent-Le"], close=True), 502, "mid-answer"),
        # more digits than int() converts, or llhttp takes
        (Say([b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n"]), 502, "failed"),
    ],
    ids=["silent", "garbage", "closed-mid-head", "huge-length"],
)
def test_an_upstream_that_gives_no_answer_gets_the_proxy_s_error(
    upstream_with: StartUpstream,
    say: Say,
    status: int,
    words: str,
) -> None:
    _, proxy = upstream_with(_on_the_kept_connection(say), WAITED_OUT_S)
    first, second = _twice(proxy)
    assert first.status_code == 200
    assert second.status_code == status
    error = second.json()["errors"][0]
    assert error["code"] == "UNAVAILABLE" and words in error["message"]
    assert "127.0.0.1" not in error["message"]  # the upstream's address is not told
    assert _requests(proxy, "manifest", "GET", str(status)) == 1
    third = httpx.get(proxy.url + MANIFEST)  # the broken connection is not reused
    assert third.status_code == 200 and third.json()["connection"] >= 1
    for piece in say.pieces:
        if isinstance(piece, threading.Event):
            piece.set()


@pytest.mark.parametrize(
    "pieces",
    [
        [b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello", b" world"],  # body in two
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            b"6\r\n world\r\n0\r\n\r\n",
        ],
    ],
    ids=["split", "chunked"],
)
def test_a_body_that_comes_in_pieces_goes_down_whole(
    upstream_with: StartUpstream,
    pieces: list[bytes],
) -> None:
    between = threading.Event()
    say = Say([pieces[0], between, pieces[1]])
    upstream, proxy = upstream_with(_on_the_kept_connection(say))

    def then_the_rest() -> None:  # once the first piece is on its way
        eventually(lambda: len(upstream.asked) == 2, 10, "the second request went upstream")
        between.set()

    with httpx.Client(timeout=10) as client:
        client.get(proxy.url + MANIFEST)
        threading.Thread(target=then_the_rest, daemon=True).start()
        second = client.get(proxy.url + MANIFEST)
        assert second.status_code == 200 and second.content == b"hello world"
        again = client.get(proxy.url + MANIFEST)  # the connection was read to its end
    assert again.json() == {"connection": 0}
    assert [a.connection for a in upstream.asked] == [0, 0, 0]


def test_a_large_body_is_relayed_and_a_short_one_is_not_silent(
    upstream_with: StartUpstream,
) -> None:
    large = os.urandom(SMALL_BODY * 4)
    counts = {"asked": 0}

    def script(asked: Asked) -> Say:
        counts["asked"] += 1
        if counts["asked"] == 2:
            return Say([answer(large)])
        if counts["asked"] == 4:
            return Say([answer(b"x" * 1000)[:-990]], close=True)  # 10 of 1000 bytes
        return Say([answer(b"{}")])

    upstream, proxy = upstream_with(script)
    blob = "/v2/a/blobs/sha256:" + "b" * 64
    with httpx.Client(timeout=10) as client:
        client.get(proxy.url + MANIFEST)
        got = client.get(proxy.url + blob)
        assert got.status_code == 200 and got.content == large
        client.get(proxy.url + MANIFEST)  # the relay took the first connection's socket
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(proxy.url + MANIFEST)
    assert [a.connection for a in upstream.asked] == [0, 0, 1, 1]
    assert _requests(proxy, "blob", "GET", "200") == 1


def test_a_caller_gone_before_the_answer_is_logged_aborted_and_the_connection_kept(
    upstream_with: StartUpstream,
) -> None:
    gone = threading.Event()
    upstream, proxy = upstream_with(_on_the_kept_connection(Say([gone, answer(b"{}")])))
    with httpx.Client(timeout=10) as client:
        client.get(proxy.url + MANIFEST)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as caller:
        caller.sendall(f"GET {MANIFEST} HTTP/1.1\r\nHost: {proxy.host}\r\n\r\n".encode())
        eventually(lambda: len(upstream.asked) == 2, 10, "the request went upstream")
    # the answer is let go once the proxy has seen the caller hang up: an answer that comes
    # first is written (and counted 200), as to any caller whose hang-up is still on its way
    connections = proxy.server.server_state.connections
    eventually(lambda: not connections, 10, "the proxy saw both callers go")
    gone.set()
    eventually(
        lambda: _requests(proxy, "manifest", "GET", "aborted") == 1, 10, "an aborted request"
    )
    assert httpx.get(proxy.url + MANIFEST).json() == {"connection": 0}


def test_pipelined_requests_are_answered_in_order(
    upstream_with: StartUpstream,
) -> None:
    """Requests sent back to back on one connection: the first is answered from callbacks,
    the ones behind it wait for it (uvicorn's pipeline), and all come back in order."""
    counts = {"asked": 0}

    def script(asked: Asked) -> Say:
        counts["asked"] += 1
        return Say([answer(b'{"n": %d}' % counts["asked"])])

    _, proxy = upstream_with(script)
    httpx.get(proxy.url + MANIFEST)  # an upstream connection to keep
    request = f"GET {MANIFEST} HTTP/1.1\r\nHost: {proxy.host}\r\n\r\n".encode()
    bodies = []
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as caller:
        caller.sendall(request * 3)
        pending = b""
        while len(bodies) < 3:
            while b"\r\n\r\n" not in pending or len(pending.partition(b"\r\n\r\n")[2]) < 8:
                got = caller.recv(65536)
                assert got, pending
                pending += got
            head, _, pending = pending.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            bodies.append(pending[:8])
            pending = pending[8:]
    assert bodies == [b'{"n": 2}', b'{"n": 3}', b'{"n": 4}']


def test_a_small_body_slower_than_the_head_deadline_is_not_cut_off(
    upstream_with: StartUpstream,
) -> None:
    """The upstream time-out bounds the wait for an answer's head; the rest of a small body
    that comes after that deadline is still awaited and sent whole (as on the ASGI path)."""
    between, never = threading.Event(), threading.Event()
    silent = "/v2/a/manifests/silent"

    def script(asked: Asked) -> Say:
        if asked.path == silent:
            return Say([never])
        if len(upstream.asked) == 2:
            return Say([b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello", between, b" world"])
        return Say([answer(b"{}")])

    upstream, proxy = upstream_with(script, WAITED_OUT_S)
    got: list[httpx.Response] = []
    try:
        with httpx.Client(timeout=15) as client:
            client.get(proxy.url + MANIFEST)
            slow = threading.Thread(target=lambda: got.append(client.get(proxy.url + MANIFEST)))
            slow.start()
            eventually(lambda: len(upstream.asked) == 2, 10, "the second request went upstream")
            # asked later, on another connection, and timed out: the deadline above is past
            assert httpx.get(proxy.url + silent, timeout=15).status_code == 504
            between.set()
            slow.join(15)
    finally:
        between.set()
        never.set()
    assert got and got[0].status_code == 200 and got[0].content == b"hello world"
