"""What one connection may cost either server (``server/limits.py``), against the real
processes: a request head is bounded in bytes and fields (a flood of header bytes is refused
while the server's memory stays flat and ``/healthz`` keeps answering), a head or a body
that does not come in time closes its connection, and idle connections are closed."""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from proxyrunner import eventually

SERVERS = ["proxy", "scheduler"]
SECRET = "a-notify-secret-of-some-length"
_MB = 1 << 20


def _start(kind: str, root: Path, *extra: str) -> devstack.Service:
    if kind == "proxy":
        root.mkdir(parents=True, exist_ok=True)
        secret = root / "notify-secret"
        secret.write_text(SECRET)
        argv = ["--log-level", "warning", "--notify-secret-file", str(secret), *extra]
        return devstack.start_proxy("http://127.0.0.1:9", root, extra=argv)
    return devstack.start_scheduler(root, extra=list(extra))


@pytest.fixture(params=SERVERS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _address(service: devstack.Service) -> tuple[str, int]:
    host, port = service.address.rsplit(":", 1)
    return host, int(port)


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the server sent, and whether it closed the connection within ``seconds``."""
    got = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False


def _body(kind: str) -> tuple[bytes, bytes]:
    """A request head announcing a 100-byte body the server reads, and its first byte."""
    if kind == "proxy":
        head = f"POST /_notify HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer {SECRET}\r\n"
    else:
        head = "PUT /v1/agents/node-1 HTTP/1.1\r\nHost: p\r\n"
    return f"{head}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode(), b"{"


# The head floods of the report: many small header fields, and one endless header value.
FLOODS = {
    "small-fields": (b"X-A: b\r\n" * 8192, 1600),  # 100 MiB
    "one-long-value": (b"a" * _MB, 300),  # 300 MiB, after "X-A: "
}


def _flood(address: tuple[str, int], kind: str, stop: threading.Event) -> bytes:
    """One connection sending a head that never ends; what the server answered."""
    chunk, count = FLOODS[kind]
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: p\r\n" + (b"X-A: " if kind != "small-fields" else b"")
        )
        try:
            for _ in range(count):
                if stop.is_set():
                    break
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed it: what matters is below
        answer, _ = _read_until_closed(sock, 10)
        return answer


@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_a_head_flood_is_refused_in_bounded_memory_and_healthz_answers(
    tmp_path: Path, kind: str, flood: str
) -> None:
    service = _start(kind, tmp_path / "s")
    try:
        pid = service.process.pid
        before = _status_kib(pid, "VmRSS")
        answers: list[bytes] = []
        stop = threading.Event()

        def attacker() -> None:
            for _ in range(3):  # one connection after another, while the honest client asks
                answers.append(_flood(_address(service), flood, stop))

        threads = [threading.Thread(target=attacker) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            with httpx.Client(timeout=10) as honest:
                for _ in range(5):
                    assert honest.get(f"{service.url}/healthz").status_code == 200
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        # each flood was refused (431: bytes; 400: header fields), or cut off: a close
        # with unread bytes is a reset, which may take the answer with it
        refused = (b"HTTP/1.1 431 ", b"HTTP/1.1 400 ")
        assert len(answers) == 6 and all(a == b"" or a.startswith(refused) for a in answers)
        grown = _status_kib(pid, "VmHWM") - before
        assert grown < 200 * 1024, f"the server grew by {grown} KiB"
    finally:
        service.stop()


def _one_request(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        answer, closed = _read_until_closed(sock, 10)
        assert closed, answer
        return answer


def test_the_head_limits_answer_431_and_400_and_a_head_within_them_is_served(
    tmp_path: Path, kind: str
) -> None:
    service = _start(kind, tmp_path / "s", "--max-head-bytes", "4096", "--max-header-fields", "50")
    try:
        address = _address(service)
        close = b"Connection: close\r\n"
        big = b"GET /healthz HTTP/1.1\r\nHost: p\r\nX-A: " + b"a" * 8192 + b"\r\n"
        answer = _one_request(address, big)
        assert answer.startswith(b"HTTP/1.1 431 "), answer
        assert b"over 4096 bytes" in answer and b"--max-head-bytes" in answer
        many = b"GET /healthz HTTP/1.1\r\nHost: p\r\n" + b"X-A: b\r\n" * 60 + close + b"\r\n"
        assert _one_request(address, many).startswith(b"HTTP/1.1 400 ")
        fits = b"GET /healthz HTTP/1.1\r\nHost: p\r\n" + b"X-A: b\r\n" * 40 + close + b"\r\n"
        assert _one_request(address, fits).startswith(b"HTTP/1.1 200 ")
    finally:
        service.stop()


def test_the_proxy_takes_a_64_kib_properties_header_by_default(tmp_path: Path) -> None:
    """The proxy's default head limit leaves room for its largest X-Variant-Properties."""
    service = _start("proxy", tmp_path / "s")
    try:
        value = '{"nvidia": {"sm_arch": ["' + "9" * (64_000) + '"]}}'
        answer = httpx.get(
            f"{service.url}/v2/app/manifests/1.0",
            headers={"X-Variant-Properties": value},
            timeout=30,
        )
        assert answer.status_code != 431
    finally:
        service.stop()


def _drip(sock: socket.socket, first: bytes, byte: bytes, stop: threading.Event) -> None:
    """Send ``first``, then ``byte`` every 0.2 s until the server closes or 60 s pass."""
    try:
        sock.sendall(first)
        for _ in range(300):
            if stop.wait(0.2):
                return
            sock.sendall(byte)
    except OSError:
        pass  # closed by the server


def test_idle_partial_and_dripping_connections_are_closed(tmp_path: Path, kind: str) -> None:
    service = _start(
        kind, tmp_path / "s", "--head-timeout", "1", "--body-timeout", "1", "--keep-alive", "1"
    )
    address = _address(service)
    head, first_byte = _body(kind)
    honest = b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n"
    stop = threading.Event()
    sockets: dict[str, socket.socket] = {}
    drips: list[threading.Thread] = []

    def connect(name: str, data: bytes = b"", drip: bytes = b"") -> None:
        sock = socket.create_connection(address, timeout=10)
        sockets[name] = sock
        if drip:
            drips.append(threading.Thread(target=_drip, args=(sock, data, drip, stop)))
            drips[-1].start()
        elif data:
            sock.sendall(data)

    try:
        for n in range(20):  # as many as a nofile limit would miss
            connect(f"silent-{n}")
        connect("partial-head", b"GET /healthz HTTP/1.1\r\nHost: p\r\n")
        connect("dripping-head", b"GET /healthz HTTP/1.1\r\n", drip=b"X")
        connect("partial-body", head + first_byte)
        connect("dripping-body", head, drip=b" ")
        connect("kept-alive", honest)
        answers: dict[str, bytes] = {}
        for name, sock in sockets.items():
            answer, closed = _read_until_closed(sock, 30)
            assert closed, f"{name} still open; it got {answer[:200]!r}"
            answers[name] = answer
        for name in ("partial-body", "dripping-body"):
            assert answers[name].startswith(b"HTTP/1.1 408 "), answers[name]
            assert b"--body-timeout" in answers[name]
        assert answers["kept-alive"].startswith(b"HTTP/1.1 200 ")
        for name in ("partial-head", "dripping-head", "silent-0"):
            assert answers[name] == b"", answers[name]
        assert httpx.get(f"{service.url}/healthz", timeout=10).status_code == 200
        assert "Traceback" not in service.log_tail(100_000)  # a cut-off body is no failure
    finally:
        stop.set()
        for thread in drips:
            thread.join(10)
        for sock in sockets.values():
            sock.close()
        service.stop()


def test_a_body_arriving_steadily_is_not_cut(tmp_path: Path) -> None:
    """Time the app spends elsewhere is not the client's: a body that keeps coming, however
    long in all, is read whole (here the scheduler's refusal of its content, not a 408)."""
    service = _start("scheduler", tmp_path / "s", "--body-timeout", "1", "--min-body-rate", "0")

    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            time.sleep(0.3)  # the pace of the body being tested, not a wait for an event
            yield b"          "

    try:
        answer = httpx.put(f"{service.url}/v1/agents/node-1", content=chunks(), timeout=30)
        assert answer.status_code == 400, answer.text
    finally:
        service.stop()


def test_idle_sockets_past_the_servers_file_limit_are_shed(tmp_path: Path, kind: str) -> None:
    """The report's case: more idle connections than the server may open files. Silent
    ones are closed after --head-timeout, so an honest /healthz gets through again."""
    service = _start(kind, tmp_path / "s", "--head-timeout", "1")
    idle: list[socket.socket] = []
    try:
        resource.prlimit(service.process.pid, resource.RLIMIT_NOFILE, (100, 100))
        for _ in range(150):
            idle.append(socket.create_connection(_address(service), timeout=10))

        def healthy() -> bool:
            try:
                return httpx.get(f"{service.url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        eventually(healthy, 30, "/healthz answered with 150 idle sockets open")
        for sock in idle:
            _, closed = _read_until_closed(sock, 30)
            assert closed
    finally:
        for sock in idle:
            sock.close()
        service.stop()
