"""Request smuggling and desync: heads that a front and a back end may read differently
(a GET with a body, Content-Length with Transfer-Encoding, duplicate Content-Length, obs-fold,
bare LF, NUL, pipelining) never put a second request on a kept-alive upstream connection,
and never let one client's bytes reach another's answer. Against the real registry, through
``variant-proxy`` alone and through the shipped nginx front; the registry's access log says
what it was asked."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from collections.abc import Iterator

import pytest

import devstack
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest

pytestmark = pytest.mark.e2e

REPO = "smuggle/app"
SMUGGLED = "/v2/smuggled/manifests/evil"  # what no caller may get the registry to see
INNER = f"GET {SMUGGLED} HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, devstack.Service]]:
    root = tmp_path_factory.mktemp("smuggle")
    registry = devstack.start_registry(root / "registry", access_log=True)
    push_blob(registry.url, REPO, b"{}")
    push_manifest(registry.url, REPO, "1", raw_manifest(b"{}"), OCI_MANIFEST)
    proxy = devstack.start_proxy(registry.url, root / "proxy", extra=["--log-level", "warning"])
    front = devstack.start_nginx_front(registry.address, proxy.address, root / "nginx")
    yield {"registry": registry, "alone": proxy, "nginx": front}
    for service in (front, proxy, registry):
        service.stop()


# Each: a request head (and body) that tries to carry INNER as a second request.
ATTACKS = {
    "get-with-content-length-body": (
        f"GET /v2/{REPO}/manifests/1 HTTP/1.1\r\nHost: p\r\nContent-Length: {len(INNER)}\r\n"
        f"\r\n{INNER}"
    ),
    "head-with-chunked-body": (
        f"HEAD /v2/{REPO}/manifests/1 HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n"
        f"\r\n{len(INNER):x}\r\n{INNER}\r\n0\r\n\r\n"
    ),
    "content-length-and-chunked": (
        f"POST /v2/{REPO}/blobs/uploads/ HTTP/1.1\r\nHost: p\r\nContent-Length: 4\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n{INNER}"
    ),
    "duplicate-content-length": (
        f"GET /v2/{REPO}/manifests/1 HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\n"
        f"Content-Length: {len(INNER)}\r\n\r\n{INNER}"
    ),
    "obs-fold": (
        f"GET /v2/{REPO}/manifests/1 HTTP/1.1\r\nHost: p\r\nX-A: 1\r\n Content-Length: "
        f"{len(INNER)}\r\n\r\n{INNER}"
    ),
    "bare-lf": (
        f"GET /v2/{REPO}/manifests/1 HTTP/1.1\nHost: p\nContent-Length: {len(INNER)}\n\n{INNER}"
    ),
    "nul-in-header": (
        f"GET /v2/{REPO}/manifests/1 HTTP/1.1\r\nHost: p\r\nX-A: a\x00b\r\n"
        f"Content-Length: {len(INNER)}\r\n\r\n{INNER}"
    ),
    "chunked-with-bad-size": (
        f"POST /v2/{REPO}/blobs/uploads/ HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n"
        f"\r\n-1\r\n{INNER}"
    ),
}


# What makes nginx send a manifest GET to variant-proxy, which answers with X-Accel-Redirect
# for nginx to fetch it from the registry (the resolved path; "1" has no variants).
RESOLVED = 'X-Variant-Properties: {"x86_64":{"level":["v1"]}}'


def _attack(name: str, path: str) -> bytes:
    """The attack ``name``, as a plain request or, ``resolved``, with X-Variant-Properties."""
    text = ATTACKS[name]
    if path == "resolved":
        text = re.sub(r"Host: p(\r?\n)", lambda m: f"Host: p{m[1]}{RESOLVED}{m[1]}", text, count=1)
    return text.encode("latin-1")


def _exchange(address: str, data: bytes, quiet: float = 1.0) -> bytes:
    """Send ``data`` on one connection, then read until the server closes it or has been
    quiet for ``quiet`` seconds after answering (answers to all it took as requests). The
    write side stays open: a server may abandon a request whose client half-closed."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
                sock.settimeout(quiet)
        except (TimeoutError, ConnectionResetError):
            pass
    return got


def _statuses(answers: bytes) -> list[int]:
    """The status of each answer on a connection (a status line follows the body before)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)]


def _manifest_digest(address: str) -> str:
    """A well-formed GET of the manifest, on its own connection: the digest of its body."""
    answer = _exchange(
        address,
        f"GET /v2/{REPO}/manifests/1 HTTP/1.1\r\nHost: p\r\nAccept: {OCI_MANIFEST}\r\n"
        "Connection: close\r\n\r\n".encode(),
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("path", ["plain", "resolved"])
@pytest.mark.parametrize("front", ["alone", "nginx"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_no_smuggled_request_reaches_the_registry(
    stack: dict[str, devstack.Service], front: str, attack: str, path: str
) -> None:
    registry, server = stack["registry"], stack[front]
    expected = _manifest_digest(registry.address)
    # the attacker and an honest client at once, sharing the proxy's upstream connections
    honest: list[str] = []
    answered: list[bytes] = []
    attacker = threading.Thread(
        target=lambda: answered.append(_exchange(server.address, _attack(attack, path)))
    )
    attacker.start()
    for _ in range(5):
        honest.append(_manifest_digest(server.address))
    attacker.join(10)
    assert honest == [expected] * 5  # nobody else's bytes in an honest answer
    seen = devstack.registry_requests(registry) + devstack.registry_requests(registry, "HEAD")
    assert SMUGGLED not in seen, seen
    if front == "alone":  # uvicorn or the proxy refuses every one of them, once
        assert _statuses(answered[0]) == [400], answered


@pytest.mark.parametrize("front", ["alone", "nginx"])
def test_a_get_with_a_body_is_refused_by_the_proxy(
    stack: dict[str, devstack.Service], front: str
) -> None:
    answers = _exchange(stack[front].address, ATTACKS["get-with-content-length-body"].encode())
    statuses = _statuses(answers)
    # the proxy alone refuses it; nginx passes a plain manifest GET to the registry, which
    # reads the body as a body: either way one answer, and the body never a request
    assert len(statuses) == 1, answers[:500]
    if front == "alone":
        assert statuses == [400] and b"may not carry a body" in answers


@pytest.mark.parametrize("how", ["plain", "resolved"])
@pytest.mark.parametrize("front", ["alone", "nginx"])
def test_pipelined_requests_get_their_own_answers_in_order(
    stack: dict[str, devstack.Service], front: str, how: str
) -> None:
    extra = f"{RESOLVED}\r\n" if how == "resolved" else ""
    requests = "".join(
        f"GET /v2/{REPO}/{path} HTTP/1.1\r\nHost: p\r\n{extra}Accept: {OCI_MANIFEST}\r\n\r\n"
        for path in ("manifests/1", "tags/list", "manifests/missing")
    )
    answers = _exchange(stack[front].address, requests.encode())
    assert _statuses(answers) == [200, 200, 404], answers[:800]
    assert b'"tags":["1"]' in answers.replace(b" ", b"")
