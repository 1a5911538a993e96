"""Large blob bodies streamed through the proxy: byte exact, ranges, kept-alive connections,
hang-ups, back pressure. The proxy runs as its own process, so that what it holds (threads,
file descriptors, upstream connections, memory) can be read from /proc/PID."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from conftest import RunningRegistry
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest
from proxyrunner import settles

pytestmark = pytest.mark.e2e

BIG = 48 << 20  # well over any buffer on the way
SETTLE_S = 20.0  # how long the proxy may take to let go of a connection (never asserted on)


@pytest.fixture(scope="module")
def proxy(
    registry: RunningRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[devstack.Service]:
    service = devstack.start_proxy(
        registry.url, tmp_path_factory.mktemp("relay-proxy"), extra=["--log-level", "warning"]
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def big_blob(registry: RunningRegistry) -> tuple[str, bytes]:
    data = os.urandom(BIG)
    digest = push_blob(registry.url, "relay/blobs", data)
    push_blob(registry.url, "relay/blobs", b"{}")
    push_manifest(registry.url, "relay/blobs", "1", raw_manifest(b"{}", [data]), OCI_MANIFEST)
    return digest, data


# --- what the proxy process holds, from /proc ----------------------------------------------


def _threads(pid: int) -> int:
    return int(_status(pid)["Threads"])


def _rss_kib(pid: int) -> int:
    return int(_status(pid)["VmRSS"].split()[0])


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(match[1])
    return inodes


def _connections_to(pid: int, port: int) -> int:
    """The proxy's established TCP connections to 127.0.0.1:``port`` (the upstream)."""
    inodes = _socket_inodes(pid)
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and int(remote.split(":")[1], 16) == port and inode in inodes:
            count += 1
    return count


def _upstream_ports(pid: int, port: int) -> set[int]:
    """Local ports of the proxy's established connections to 127.0.0.1:``port``."""
    inodes = _socket_inodes(pid)
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        if state == "01" and int(remote.split(":")[1], 16) == port and inode in inodes:
            ports.add(int(local.split(":")[1], 16))
    return ports


def _settles(check: Callable[[], bool]) -> bool:
    """Whether ``check`` comes true within SETTLE_S (a condition, not a timing)."""
    return settles(check, SETTLE_S)


_SLOW_READER_BUFFER = 64 << 10  # the slow reader's receive buffer


def _wait_until_full(sock: socket.socket, left: int) -> bool:
    """Waits until the kernel reports ``sock``'s receive buffer full: with SO_RCVLOWAT at the
    buffer's size, it becomes readable once that much is queued, or earlier once the window
    it advertised is spent or its memory is short (the sender is then held back by this
    reader; Linux 5.10 and later wake a reader for both). The kernel decides, so how many
    bytes that takes (segment sizes, window scaling) is not this test's guess. False if
    nothing came within SETTLE_S."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, min(left, _SLOW_READER_BUFFER))
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(SETTLE_S * 1000))


# --- a raw HTTP/1.1 client: one connection, several requests ---------------------------------


class RawClient:
    def __init__(self, address: str, rcvbuf: int | None = None) -> None:
        host, port = address.split(":")
        self.sock = socket.socket()
        if rcvbuf is not None:  # before connecting, so the window stays small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, int(port)))
        self.pending = b""

    def request(self, path: str, headers: dict[str, str] | None = None) -> None:
        lines = [f"GET {path} HTTP/1.1", "Host: proxy.test"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.pending:
            data = self.sock.recv(65536)
            assert data, "the proxy closed the connection before answering"
            self.pending += data
        head, _, self.pending = self.pending.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        return int(status_line.split()[1]), headers

    def body(self, length: int, pause: Callable[[int], None] | None = None) -> str:
        """Reads ``length`` bytes; returns their sha256 digest. ``pause(left)`` is called
        after each read, with the number of bytes still to come."""
        hasher = hashlib.sha256()
        left = length
        while left:
            data = self.pending[:left] if self.pending else self.sock.recv(min(left, 65536))
            self.pending = self.pending[len(data) :] if self.pending else b""
            assert data, f"the body ended {left} bytes short"
            hasher.update(data)
            left -= len(data)
            if pause is not None:
                pause(left)
        return "sha256:" + hasher.hexdigest()

    def close(self) -> None:
        self.sock.close()


# --- the tests ----------------------------------------------------------------------------


def test_big_blob_is_byte_exact(proxy: devstack.Service, big_blob: tuple[str, bytes]) -> None:
    digest, data = big_blob
    hasher = hashlib.sha256()
    size = 0
    with httpx.stream("GET", f"{proxy.url}/v2/relay/blobs/blobs/{digest}", timeout=60) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-length"] == str(len(data))
        assert answer.headers["docker-content-digest"] == digest
        for chunk in answer.iter_raw():
            hasher.update(chunk)
            size += len(chunk)
    assert size == len(data)
    assert "sha256:" + hasher.hexdigest() == digest


def test_ranges_small_and_large(proxy: devstack.Service, big_blob: tuple[str, bytes]) -> None:
    digest, data = big_blob
    url = f"{proxy.url}/v2/relay/blobs/blobs/{digest}"
    small = httpx.get(url, headers={"Range": "bytes=1000-1999"})
    assert small.status_code == 206 and small.content == data[1000:2000]
    start = 5 << 20
    large = httpx.get(url, headers={"Range": f"bytes={start}-"}, timeout=60)
    assert large.status_code == 206
    assert large.headers["content-range"] == f"bytes {start}-{len(data) - 1}/{len(data)}"
    assert large.content == data[start:]


def test_keep_alive_after_a_streamed_blob(
    proxy: devstack.Service, big_blob: tuple[str, bytes]
) -> None:
    digest, data = big_blob
    client = RawClient(proxy.address)
    try:
        for _ in range(2):  # blob, blob again, then a manifest: one connection
            client.request(f"/v2/relay/blobs/blobs/{digest}")
            status, headers = client.head()
            assert status == 200 and int(headers["content-length"]) == len(data)
            assert client.body(len(data)) == digest
        client.request("/v2/relay/blobs/manifests/1", {"Accept": OCI_MANIFEST})
        status, headers = client.head()
        assert status == 200
        manifest = client.body(int(headers["content-length"]))
        assert manifest == headers["docker-content-digest"]
    finally:
        client.close()


def test_client_hanging_up_mid_blob_leaks_nothing(
    proxy: devstack.Service, registry: RunningRegistry, big_blob: tuple[str, bytes]
) -> None:
    digest, _ = big_blob
    pid = proxy.process.pid
    upstream_port = int(registry.host.split(":")[1])
    path = f"/v2/relay/blobs/blobs/{digest}"
    httpx.get(f"{proxy.url}/v2/relay/blobs/manifests/1", headers={"Accept": OCI_MANIFEST})
    threads, fds, upstream = _threads(pid), _fds(pid), _connections_to(pid, upstream_port)
    for _ in range(5):
        client = RawClient(proxy.address)
        client.request(path)
        assert client.head()[0] == 200
        client.body(1 << 20)  # a little of it, then hang up
        client.close()
    assert _settles(lambda: _threads(pid) <= threads), (_threads(pid), threads)
    assert _settles(lambda: _fds(pid) <= fds), (_fds(pid), fds)
    assert _settles(lambda: _connections_to(pid, upstream_port) <= upstream)
    # and the proxy carries on
    assert hashlib.sha256(httpx.get(f"{proxy.url}{path}", timeout=60).content).hexdigest() == (
        digest.removeprefix("sha256:")
    )


def test_client_hanging_up_while_the_upstream_is_silent(tmp_path: Path) -> None:
    """The upstream sends a part of the body, then nothing: a caller that hangs up still
    gets the upstream connection closed (the proxy watches the caller while it waits)."""
    upstream_closed = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n"
                b"Content-Type: application/octet-stream\r\n\r\n" + os.urandom(2 << 20)
            )
            conn.settimeout(SETTLE_S)
            try:
                while conn.recv(65536):
                    pass
            except TimeoutError:
                return  # the proxy held on
            except OSError:
                pass  # reset: the proxy let go, with bytes unread
            upstream_closed.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    proxy = devstack.start_proxy(f"http://127.0.0.1:{port}", tmp_path / "proxy")
    try:
        threads = _threads(proxy.process.pid)
        client = RawClient(proxy.address)
        client.request("/v2/a/blobs/sha256:" + "a" * 64)
        assert client.head()[0] == 200
        client.body(1 << 20)
        client.close()
        server.join(SETTLE_S + 5)
        assert upstream_closed.is_set()
        assert _settles(lambda: _threads(proxy.process.pid) <= threads)
    finally:
        proxy.stop()
        listener.close()


def test_slow_reader_gets_back_pressure_not_buffering(
    proxy: devstack.Service, big_blob: tuple[str, bytes]
) -> None:
    digest, _ = big_blob
    pid = proxy.process.pid
    rss_before = _rss_kib(pid)
    peak = rss_before
    reads = 0

    def pause(left: int) -> None:
        nonlocal peak, reads
        reads += 1
        if reads % 16 == 0:
            peak = max(peak, _rss_kib(pid))
        # a slow reader: it reads again only once its receive buffer is full, so the proxy
        # is held back at every read
        if left:
            assert _wait_until_full(client.sock, left), "the proxy stalled"

    client = RawClient(proxy.address, rcvbuf=_SLOW_READER_BUFFER)
    try:
        client.request(f"/v2/relay/blobs/blobs/{digest}")
        status, headers = client.head()
        assert status == 200
        assert client.body(int(headers["content-length"]), pause) == digest
    finally:
        client.close()
    # a 48 MiB blob to a slow reader: the proxy holds a buffer or two, never the blob
    assert (peak - rss_before) * 1024 < 16 << 20, (rss_before, peak)


def test_concurrent_big_blob_pulls(proxy: devstack.Service, registry: RunningRegistry) -> None:
    blobs = {}
    for i in range(4):
        data = os.urandom((6 << 20) + i * 4099)
        blobs[push_blob(registry.url, "relay/many", data)] = len(data)
    digests = list(blobs) * 3
    pid = proxy.process.pid
    threads = _threads(pid)

    async def pull(client: httpx.AsyncClient, digest: str) -> tuple[str, int]:
        hasher = hashlib.sha256()
        async with client.stream("GET", f"/v2/relay/many/blobs/{digest}") as answer:
            async for chunk in answer.aiter_raw():
                hasher.update(chunk)
            return "sha256:" + hasher.hexdigest(), answer.status_code

    async def pull_all() -> list[tuple[str, int]]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=120) as client:
            return await asyncio.gather(*(pull(client, d) for d in digests))

    results = asyncio.run(pull_all())
    assert results == [(d, 200) for d in digests]
    assert _settles(lambda: _threads(pid) <= threads)


def test_pass_through_answers_never_reuse_an_upstream_connection(
    tmp_path: Path, registry: RunningRegistry, big_blob: tuple[str, bytes]
) -> None:
    """Each pass-through answer has its own upstream connection, closed once it ends: bytes
    an upstream sends past an answer can never be read as the next caller's answer."""
    proxy = devstack.start_proxy(registry.url, tmp_path / "proxy")
    pid = proxy.process.pid
    port = int(registry.host.split(":")[1])
    url = f"{proxy.url}/v2/relay/blobs/manifests/1"
    try:
        with httpx.Client(headers={"Accept": OCI_MANIFEST}) as http:
            first = http.get(url)
            for _ in range(5):
                assert _settles(lambda: not _upstream_ports(pid, port))
                assert http.get(url).content == first.content
                head = http.head(url)
                assert head.status_code == 200 and head.content == b""
                assert head.headers["content-length"] == str(len(first.content))
    finally:
        proxy.stop()


def test_tls_listener_streams_blobs(
    tmp_path: Path, registry: RunningRegistry, big_blob: tuple[str, bytes]
) -> None:
    from tlsca import CertificateAuthority

    digest, _ = big_blob
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.server()
    proxy = devstack.start_proxy(
        registry.url,
        tmp_path / "proxy",
        extra=["--tls-cert", str(server.cert), "--tls-key", str(server.key)],
        scheme="https",
    )
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=ca.ca), timeout=60) as http:
            answer = http.get(f"{proxy.url}/v2/relay/blobs/blobs/{digest}")
            assert answer.status_code == 200
            assert hashlib.sha256(answer.content).hexdigest() == digest.removeprefix("sha256:")
    finally:
        proxy.stop()
