"""variant-proxy as a transparent distribution API proxy: real registry, real skopeo."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import RunningRegistry
from docker_variant.proxy.passthrough import forwarded_headers
from fakeupstream import FakeUpstream, Reply, Seen
from imaging import ImageBuilder, push_blob, sha256_digest
from proxyrunner import ProxyServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def proxy(registry: RunningRegistry) -> Iterator[ProxyServer]:
    with ProxyServer(registry.url, cache_ttl=3600) as running:
        yield running


@pytest.fixture(scope="module")
def big_blob(registry: RunningRegistry) -> tuple[str, bytes]:
    data = os.urandom(3 << 20)
    return push_blob(registry.url, "pt/blobs", data), data


def _skopeo(*args: str) -> str:
    done = subprocess.run(
        ["skopeo", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_skopeo_copy_in_and_out_keeps_digests(
    registry: RunningRegistry, proxy: ProxyServer, image_builder: ImageBuilder, tmp_path: Path
) -> None:
    tag = image_builder.build({"purpose": "passthrough"}, layers=3)
    direct = image_builder.push(tag, f"{registry.host}/pt/direct:1")
    proxied = image_builder.push(tag, f"{proxy.host}/pt/proxied:1")
    assert proxied == direct
    # what went in through the proxy is really in the registry, under the same digest
    head = httpx.head(
        f"{registry.url}/v2/pt/proxied/manifests/1",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    assert head.headers["docker-content-digest"] == direct

    out = tmp_path / "out"
    _skopeo(
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        f"docker://{proxy.host}/pt/direct:1",
        f"dir:{out}",
    )
    manifest = (out / "manifest.json").read_bytes()
    assert sha256_digest(manifest) == direct
    blobs = [p for p in out.iterdir() if len(p.name) == 64]
    assert len(blobs) == 4  # config and three layers
    for blob in blobs:
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    inspected = _skopeo(
        "inspect", "--raw", "--tls-verify=false", f"docker://{proxy.host}/pt/direct:1"
    )
    assert inspected.encode() == manifest


def test_blob_get_head_and_range(proxy: ProxyServer, big_blob: tuple[str, bytes]) -> None:
    digest, data = big_blob
    url = f"{proxy.url}/v2/pt/blobs/blobs/{digest}"
    whole = httpx.get(url)
    assert whole.status_code == 200
    assert whole.content == data
    assert whole.headers["docker-content-digest"] == digest
    assert whole.headers["content-length"] == str(len(data))

    head = httpx.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(data))
    assert head.headers["docker-content-digest"] == digest
    assert "etag" in head.headers

    part = httpx.get(url, headers={"Range": "bytes=1000-1999"})
    assert part.status_code == 206
    assert part.content == data[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{len(data)}"

    missing = httpx.get(f"{proxy.url}/v2/pt/blobs/blobs/sha256:{'0' * 64}")
    assert missing.status_code == 404
    assert missing.json()["errors"][0]["code"] == "BLOB_UNKNOWN"


def _with_digest(location: str, digest: str) -> httpx.URL:
    # keep the upload's own query (distribution's _state); httpx params= would replace it
    return httpx.URL(location).copy_merge_params({"digest": digest})


def test_monolithic_and_chunked_uploads(proxy: ProxyServer, registry: RunningRegistry) -> None:
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        # monolithic: POST, then PUT ?digest= with the whole body
        data = os.urandom(200_000)
        digest = sha256_digest(data)
        started = http.post("/v2/pt/upload/blobs/uploads/")
        assert started.status_code == 202
        location = started.headers["location"]
        assert location.startswith(f"{proxy.url}/v2/pt/upload/blobs/uploads/"), location
        assert "docker-upload-uuid" in started.headers
        done = http.put(_with_digest(location, digest), content=data)
        assert done.status_code == 201, done.text
        assert done.headers["location"].startswith(proxy.url)
        assert done.headers["docker-content-digest"] == digest

        # chunked: PATCH with a streamed body (Transfer-Encoding: chunked), then PUT
        data2 = os.urandom(300_000)
        digest2 = sha256_digest(data2)
        location = http.post("/v2/pt/upload/blobs/uploads/").headers["location"]

        def pieces() -> Iterator[bytes]:
            for i in range(0, len(data2), 65536):
                yield data2[i : i + 65536]

        patched = http.patch(
            location, content=pieces(), headers={"Content-Type": "application/octet-stream"}
        )
        assert patched.status_code == 202, patched.text
        assert patched.headers["range"] == f"0-{len(data2) - 1}"
        location = patched.headers["location"]
        assert location.startswith(proxy.url)
        done = http.put(_with_digest(location, digest2))
        assert done.status_code == 201, done.text

    for d, payload in ((digest, data), (digest2, data2)):
        assert httpx.get(f"{registry.url}/v2/pt/upload/blobs/{d}").content == payload


def test_cross_repository_mount(proxy: ProxyServer, big_blob: tuple[str, bytes]) -> None:
    digest, data = big_blob
    mounted = httpx.post(
        f"{proxy.url}/v2/pt/mounted/blobs/uploads/",
        params={"mount": digest, "from": "pt/blobs"},
    )
    assert mounted.status_code == 201, mounted.text
    assert mounted.headers["location"] == f"{proxy.url}/v2/pt/mounted/blobs/{digest}"
    assert httpx.get(mounted.headers["location"]).content == data


def test_manifest_head_get_and_tags(proxy: ProxyServer, registry: RunningRegistry) -> None:
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    direct = httpx.get(f"{registry.url}/v2/pt/direct/manifests/1", headers=accept)
    via = httpx.get(f"{proxy.url}/v2/pt/direct/manifests/1", headers=accept)
    assert via.status_code == 200
    assert via.content == direct.content
    for key in ("content-type", "docker-content-digest", "etag", "content-length"):
        assert via.headers[key] == direct.headers[key]
    head = httpx.head(f"{proxy.url}/v2/pt/direct/manifests/1", headers=accept)
    assert (
        head.content == b"" and head.headers["content-length"] == direct.headers["content-length"]
    )
    tags = httpx.get(f"{proxy.url}/v2/pt/direct/tags/list")
    assert tags.json() == {"name": "pt/direct", "tags": ["1"]}
    catalog = httpx.get(f"{proxy.url}/v2/_catalog")
    assert "pt/direct" in catalog.json()["repositories"]
    unknown = httpx.get(f"{proxy.url}/v2/pt/nothing/tags/list")
    assert unknown.status_code == 404
    assert unknown.json()["errors"][0]["code"] == "NAME_UNKNOWN"


# --- a scripted upstream ------------------------------------------------------------------


@pytest.fixture
def fake_proxy(fake_upstream: FakeUpstream) -> Iterator[tuple[FakeUpstream, ProxyServer]]:
    with ProxyServer(fake_upstream.url) as running:  # the default upstream time-out (30 s)
        yield fake_upstream, running


def test_headers_forwarded_both_ways(fake_proxy: tuple[FakeUpstream, ProxyServer]) -> None:
    fake, proxy = fake_proxy
    digest = "sha256:" + "c" * 64  # by digest, so X-Variant-Properties changes nothing
    challenge = 'Bearer realm="https://auth.example/token",service="reg",scope="repository:a:pull"'
    fake.routes[f"/v2/a/manifests/{digest}"] = Reply(
        401,
        b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}',
        {"WWW-Authenticate": challenge, "Docker-Distribution-API-Version": "registry/2.0"},
    )
    answer = httpx.get(
        f"{proxy.url}/v2/a/manifests/{digest}",
        headers={
            "Authorization": "Bearer abc.def",
            "Accept": "application/vnd.oci.image.manifest.v1+json",
            "X-Variant-Properties": "{}",  # the proxy's own header is not sent on
            "TE": "trailers",
            "Proxy-Authorization": "Basic Zm9vOmJhcg==",
        },
    )
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == challenge
    assert answer.headers["docker-distribution-api-version"] == "registry/2.0"
    assert answer.json()["errors"][0]["code"] == "UNAUTHORIZED"
    seen = [r for r in fake.requests if r.path == f"/v2/a/manifests/{digest}"]
    assert seen, fake.requests
    sent = seen[-1].headers
    assert sent["authorization"] == "Bearer abc.def"
    assert sent["accept"] == "application/vnd.oci.image.manifest.v1+json"
    assert sent["host"] == f"127.0.0.1:{fake.port}"
    for dropped in ("te", "proxy-authorization", "x-variant-properties"):
        assert dropped not in sent


def test_redirects_pass_through_and_locations_are_rewritten(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    digest = "sha256:" + "b" * 64
    fake.routes[f"/v2/a/blobs/{digest}"] = Reply(
        307, b"", {"Location": "https://cdn.example/blob?sig=1"}
    )
    fake.routes[f"/v2/b/blobs/{digest}"] = Reply(
        307, b"", {"Location": f"{fake.url}/v2/a/blobs/{digest}"}
    )
    fake.routes["/v2/a/tags/list"] = Reply(
        200,
        b'{"name":"a","tags":["1"]}',
        {"Link": f'<{fake.url}/v2/a/tags/list?last=1&n=1>; rel="next"'},
    )
    elsewhere = httpx.get(f"{proxy.url}/v2/a/blobs/{digest}")
    assert elsewhere.status_code == 307  # not followed by the proxy
    assert elsewhere.headers["location"] == "https://cdn.example/blob?sig=1"  # left alone
    upstream = httpx.get(f"{proxy.url}/v2/b/blobs/{digest}")
    assert upstream.headers["location"] == f"{proxy.url}/v2/a/blobs/{digest}"
    # the Host the caller used is the base, e.g. a name rather than the address
    named = httpx.get(
        f"{proxy.url}/v2/b/blobs/{digest}", headers={"Host": f"registry.test:{proxy.port}"}
    )
    assert named.headers["location"] == f"http://registry.test:{proxy.port}/v2/a/blobs/{digest}"
    tags = httpx.get(f"{proxy.url}/v2/a/tags/list", params={"n": "1"})
    assert tags.headers["link"] == f'<{proxy.url}/v2/a/tags/list?last=1&n=1>; rel="next"'
    assert any(r.query == {"n": ["1"]} for r in fake.requests)


def test_upstream_down_is_502() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with ProxyServer(f"http://127.0.0.1:{port}") as proxy:
        blob = "/v2/a/blobs/sha256:" + "d" * 64  # the raw blob relay, not httpx
        for path in ("/v2/", "/v2/a/manifests/1", "/v2/a/_variants/1.0", blob):
            answer = httpx.get(f"{proxy.url}{path}")
            assert answer.status_code == 502, path
            error = answer.json()["errors"][0]
            assert error["code"] == "REGISTRY_UNAVAILABLE"
            assert "\n" not in error["message"] and error["message"]


@pytest.mark.parametrize("path", ["/v2/a/manifests/1", "/v2/a/blobs/sha256:" + "e" * 64])
def test_slow_upstream_is_504(fake_upstream: FakeUpstream, path: str) -> None:
    # a proxy of its own, with a short time-out: the others wait as long as load needs
    fake, proxy = fake_upstream, ProxyServer(fake_upstream.url, upstream_timeout=1.0).start()
    release, answered = threading.Event(), threading.Event()

    def slow(_seen: Seen) -> Reply:
        release.wait(30)  # an upstream that says nothing until the test is done
        answered.set()
        return Reply(200, b"{}")

    fake.routes[path] = slow
    try:
        answer = httpx.get(f"{proxy.url}{path}", timeout=10)
        assert not answered.is_set()  # the proxy's own deadline (1 s here) answered
    finally:
        release.set()
        proxy.stop()
    assert answer.status_code == 504
    assert answer.json()["errors"][0]["code"] == "REGISTRY_TIMEOUT"
    assert "timed out" in answer.json()["errors"][0]["message"]


def test_upstream_dying_mid_body_is_not_a_silent_short_blob(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    data = os.urandom(1 << 20)
    digest = sha256_digest(data)
    fake.routes[f"/v2/a/blobs/{digest}"] = Reply(200, data, truncate_to=100_000)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"{proxy.url}/v2/a/blobs/{digest}")
    fake.routes["/v2/"] = Reply(200, b"{}")
    assert httpx.get(f"{proxy.url}/v2/").status_code == 200  # the proxy carries on


def test_caller_hanging_up_mid_blob(proxy: ProxyServer, big_blob: tuple[str, bytes]) -> None:
    digest, data = big_blob
    url = f"{proxy.url}/v2/pt/blobs/blobs/{digest}"
    for _ in range(5):
        with httpx.stream("GET", url) as answer:
            next(answer.iter_raw(1024))  # read a little, then hang up
    assert httpx.get(url).content == data
    head = httpx.head(f"{proxy.url}/v2/pt/blobs/blobs/{digest}")
    assert head.status_code == 200


def test_blob_pass_through_forwards_headers_and_refusals(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    digest = "sha256:" + "f" * 64
    challenge = 'Basic realm="test-registry"'
    fake.routes[f"/v2/a/blobs/{digest}"] = Reply(
        401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge}
    )
    answer = httpx.get(
        f"{proxy.url}/v2/a/blobs/{digest}",
        params={"ns": "docker.io"},
        headers={"Authorization": "Basic dTpw", "TE": "trailers", "X-Variant-Properties": "{}"},
    )
    assert answer.status_code == 401 and answer.headers["www-authenticate"] == challenge
    assert answer.json()["errors"][0]["code"] == "UNAUTHORIZED"
    sent = [r for r in fake.requests if r.path == f"/v2/a/blobs/{digest}"][-1]
    assert sent.headers["authorization"] == "Basic dTpw"
    assert sent.headers["host"] == f"127.0.0.1:{fake.port}"
    assert sent.query == {"ns": ["docker.io"]}
    for dropped in ("te", "x-variant-properties"):
        assert dropped not in sent.headers


def test_blob_pass_through_keeps_chunked_answers_whole(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    data = os.urandom(300_000)
    digest = sha256_digest(data)
    fake.routes[f"/v2/a/blobs/{digest}"] = Reply(200, data, chunked=True)
    answer = httpx.get(f"{proxy.url}/v2/a/blobs/{digest}")
    assert answer.status_code == 200 and answer.content == data


def _read_answer(sock: socket.socket, pending: bytearray, head_only: bool) -> tuple[bytes, bytes]:
    """One answer's head (status line and headers) and body, framed by Content-Length."""
    while b"\r\n\r\n" not in pending:
        got = sock.recv(65536)
        assert got, f"the connection closed mid-head: {bytes(pending)!r}"
        pending += got
    head, _, rest = bytes(pending).partition(b"\r\n\r\n")
    pending[:] = rest
    fields = dict(
        line.split(b": ", 1) for line in head.split(b"\r\n")[1:]
    )  # names as sent, lower case
    length = 0 if head_only else int(fields[b"content-length"])
    while len(pending) < length:
        got = sock.recv(65536)
        assert got, "the connection closed mid-body"
        pending += got
    body = bytes(pending[:length])
    del pending[:length]
    return head, body


def test_small_answers_go_down_whole_on_a_kept_alive_connection(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    """A small answer goes down with its status line, the upstream's headers less hop-by-hop
    ones (also those that Connection names), a Content-Length that frames it; HEAD gets the
    head alone; the caller's connection stays open until it asks for close, and then gets
    ``connection: close`` and an EOF."""
    fake, proxy = fake_proxy
    body = b'{"schemaVersion": 2}'
    digest = "sha256:" + "a" * 64
    path = f"/v2/a/manifests/{digest}"
    fake.routes[path] = Reply(
        200,
        body,
        {
            "Docker-Content-Digest": digest,
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "1",
            "Keep-Alive": "timeout=5",
        },
    )
    pending = bytearray()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        for method in ("GET", "HEAD", "GET"):
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {proxy.host}\r\n\r\n".encode())
            head, got = _read_answer(sock, pending, head_only=method == "HEAD")
            lines = head.split(b"\r\n")
            assert lines[0] == b"HTTP/1.1 200 OK"
            fields = dict(line.split(b": ", 1) for line in lines[1:])
            assert fields[b"docker-content-digest"] == digest.encode()
            assert fields[b"content-length"] == str(len(body)).encode()
            assert b"date" in fields
            for hop in (b"connection", b"x-hop", b"keep-alive"):
                assert hop not in fields, head
            assert got == (b"" if method == "HEAD" else body)
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {proxy.host}\r\nConnection: close\r\n\r\n".encode()
        )
        head, got = _read_answer(sock, pending, head_only=False)
        assert b"\r\nconnection: close" in head.lower() and got == body
        assert sock.recv(1) == b"" and not pending  # closed after the answer
    seen = [r for r in fake.requests if r.path == path]
    assert [r.method for r in seen] == ["GET", "HEAD", "GET", "GET"]
    assert all("connection" not in r.headers for r in seen)  # the caller's is not sent on


def test_heads_in_pieces_or_naming_headers_are_read_alike(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    """A head in one segment or two, or with a header that Connection names, gets the same
    answer; a malformed one (a bare LF) a 400 and a closed connection, never a request up."""
    fake, proxy = fake_proxy
    body = b'{"schemaVersion": 2}'
    path = "/v2/a/manifests/1"
    fake.routes[path] = Reply(200, body)
    request = f"GET {path} HTTP/1.1\r\nHost: {proxy.host}\r\nX-Seen: 1\r\n\r\n".encode()
    pending = bytearray()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        assert _read_answer(sock, pending, head_only=False)[1] == body
        sock.sendall(request[:20])  # in two segments (where they stay two)
        sock.sendall(request[20:])
        assert _read_answer(sock, pending, head_only=False)[1] == body
        named = request.replace(b"X-Seen: 1", b"Connection: keep-alive, X-Seen\r\nX-Seen: 1")
        sock.sendall(named)  # a Connection header naming another
        assert _read_answer(sock, pending, head_only=False)[1] == body
        sock.sendall(request.replace(b"X-Seen: 1\r\n", b"X-Seen: 1\n"))
        head, _ = _read_answer(sock, pending, head_only=False)
        assert head.startswith(b"HTTP/1.1 400 ")
        assert sock.recv(1) == b""
    seen = [r for r in fake.requests if r.path == path]
    assert len(seen) == 3
    assert [r.headers.get("x-seen") for r in seen] == ["1", "1", None]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([(b"accept", b"a"), (b"host", b"p:1"), (b"te", b"trailers")], [(b"accept", b"a")]),
        # the Connection header's tokens name hop-by-hop headers too, "close" included
        (
            [(b"connection", b"keep-alive, X-Hop"), (b"x-hop", b"1"), (b"keep-alive", b"5"),
             (b"authorization", b"Bearer t")],
            [(b"authorization", b"Bearer t")],
        ),
        ([(b"connection", b"close"), (b"close", b"x"), (b"accept", b"a")], [(b"accept", b"a")]),
        ([(b"x-variant-properties", b"{}"), (b"expect", b"100-continue")], []),
    ],
)  # fmt: skip
def test_forwarded_headers_leave_out_hop_by_hop_ones(
    raw: list[tuple[bytes, bytes]], expected: list[tuple[bytes, bytes]]
) -> None:
    assert forwarded_headers(raw) == expected
