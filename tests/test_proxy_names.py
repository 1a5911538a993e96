"""variant-proxy without a registry: path validation, the command line, discovery, health,
metrics and logs."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from docker_variant.errors import InvalidInputError
from docker_variant.proxy.app import check_upstream_url
from docker_variant.proxy.names import PathError, Route, RouteKind, parse_v2_path
from docker_variant.server.logs import JsonFormatter
from docker_variant.server.net import parse_listen
from fakeupstream import FakeUpstream, Reply
from proxyrunner import ProxyServer, eventually

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v2/", Route(RouteKind.BASE)),
        ("/v2", Route(RouteKind.BASE)),
        ("/v2/_catalog", Route(RouteKind.CATALOG)),
        ("/v2/_oci/ext/discover", Route(RouteKind.DISCOVER)),
        ("/v2/app/manifests/1.0", Route(RouteKind.MANIFEST, "app", "1.0")),
        (f"/v2/a/b/c/manifests/{DIGEST}", Route(RouteKind.MANIFEST, "a/b/c", DIGEST)),
        # names may contain route words: matched from the right
        ("/v2/x/manifests/y/manifests/v1", Route(RouteKind.MANIFEST, "x/manifests/y", "v1")),
        ("/v2/a/b/_variants/1.0.0", Route(RouteKind.VARIANTS, "a/b", "1.0.0")),
        (
            "/v2/a/_variants/2.12.0-ubuntu24.04",
            Route(RouteKind.VARIANTS, "a", "2.12.0-ubuntu24.04"),
        ),
        (f"/v2/a/blobs/{DIGEST}", Route(RouteKind.BLOB, "a", DIGEST)),
        ("/v2/a/blobs/uploads/", Route(RouteKind.UPLOAD, "a", "")),
        ("/v2/a/blobs/uploads/6d1b-4e2f_x=", Route(RouteKind.UPLOAD, "a", "6d1b-4e2f_x=")),
        ("/v2/a/tags/list", Route(RouteKind.TAGS, "a")),
        (f"/v2/a/referrers/{DIGEST}", Route(RouteKind.REFERRERS, "a", DIGEST)),
        ("/v2/a/_oci/ext/discover", Route(RouteKind.DISCOVER, "a")),
        ("/v2/a/what", Route(RouteKind.UNKNOWN)),
        ("/healthz", Route(RouteKind.OTHER)),
        ("/etc/passwd", Route(RouteKind.OTHER)),
    ],
)
def test_routes(path: str, expected: Route) -> None:
    assert parse_v2_path(path) == expected


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/v2/a/../b/tags/list", "NAME_INVALID"),
        ("/v2/../tags/list", "NAME_INVALID"),
        ("/v2/a/%2e%2e/b/tags/list", "NAME_INVALID"),
        ("/v2/a/%2E%2E/b/tags/list", "NAME_INVALID"),
        ("/v2/a/%2e/b/tags/list", "NAME_INVALID"),
        ("/v2/a%2fb/tags/list", "NAME_INVALID"),
        ("/v2/a/%252e%252e/tags/list", "NAME_INVALID"),
        ("/v2/App/tags/list", "NAME_INVALID"),
        ("/v2/a//b/tags/list", "NAME_INVALID"),
        ("/v2//tags/list", "NAME_INVALID"),
        ("/v2/a/b-/tags/list", "NAME_INVALID"),
        ("/v2/-a/tags/list", "NAME_INVALID"),
        ("/v2/a_/_variants/1.0", "NAME_INVALID"),
        ("/v2/" + "a" * 256 + "/tags/list", "NAME_INVALID"),
        ("/v2/a/_variants/..", "NAME_INVALID"),
        ("/v2/a/_variants/-1.0", "TAG_INVALID"),
        ("/v2/a/_variants/", "TAG_INVALID"),
        ("/v2/a/_variants/" + "1" * 129, "TAG_INVALID"),
        ("/v2/a/manifests/x%20y", "MANIFEST_UNKNOWN"),  # 404, as the registry answers
        ("/v2/a/manifests/.INVALID_MANIFEST_NAME", "MANIFEST_UNKNOWN"),
        ("/v2/a/manifests/sha256:", "DIGEST_INVALID"),
        ("/v2/a/blobs/latest", "DIGEST_INVALID"),
        ("/v2/a/blobs/uploads/x%2fy", "BLOB_UPLOAD_INVALID"),
    ],
)
def test_invalid_paths(path: str, code: str) -> None:
    with pytest.raises(PathError) as caught:
        parse_v2_path(path)
    assert caught.value.code == code


def test_upstream_path_is_rebuilt_from_parts() -> None:
    route = parse_v2_path("/v2/a/b/blobs/uploads/abc")
    assert route.upstream_path() == "/v2/a/b/blobs/uploads/abc"
    with pytest.raises(ValueError):
        Route(RouteKind.VARIANTS, "a", "1").upstream_path()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:5080", ("127.0.0.1", 5080)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:5080", ("::1", 5080)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["5080", ":5080", "::1:5080", "[zz]:1", "h:port", "h:70000"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_listen(text)


@pytest.mark.parametrize(
    "url",
    ["registry:5000", "ftp://x", "http://", "http://u:p@x", "http://x?q=1", "http://x/v2/"],
)
def test_check_upstream_url_rejects(url: str) -> None:
    with pytest.raises(InvalidInputError):
        check_upstream_url(url)


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "variant-proxy"
    return [str(script)] if script.exists() else [sys.executable, "-m", "docker_variant.proxy"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--upstream", "not a url"], "invalid upstream URL"),
        (["--upstream", "http://127.0.0.1:1", "--listen", "nowhere"], "invalid listen address"),
        (["--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:99999"], "port"),
        (["--upstream", "http://127.0.0.1:1", "--listen", "192.0.2.1:5080"], "cannot listen"),
        (["--upstream", "http://127.0.0.1:1", "--cache-ttl", "-5"], "cache TTL"),
        (["--upstream", "http://127.0.0.1:1", "--log-level", "loud"], "--log-level"),
        ([], "--upstream"),
    ],
)
def test_cli_bad_arguments(args: list[str], needle: str) -> None:
    done = subprocess.run(
        [*_console_script(), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_cli_listen_address_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                *_console_script(),
                "--upstream",
                "http://127.0.0.1:1",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert "cannot listen" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def fake_proxy(fake_upstream: FakeUpstream) -> Iterator[tuple[FakeUpstream, ProxyServer]]:
    with ProxyServer(fake_upstream.url) as proxy:
        yield fake_upstream, proxy


def test_cli_serves_and_logs_json(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """The console script end to end: it listens, passes through, and logs JSON lines
    without the caller's Authorization."""
    fake_upstream.routes["/v2/"] = Reply(200, b"{}", {"Content-Type": "application/json"})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "proxy.log").open("wb")
    process = subprocess.Popen(
        [*_console_script(), "--upstream", fake_upstream.url, "--listen", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=log,
    )

    def listening() -> bool:  # its own listener, found without a request: no access line
        # exited: the request below says how
        return devstack.listens(process.pid, port) or process.poll() is not None

    try:
        # one request, given all the time load needs: one timed out and asked again would
        # leave a first access line for a caller that gave up on it
        eventually(listening, 30.0, "variant-proxy listening")
        answer = httpx.get(
            f"http://127.0.0.1:{port}/v2/",
            headers={"Authorization": "Basic c2VjcmV0LXZhbHVl"},
            timeout=30,
        )
        assert answer.status_code == 200
        assert fake_upstream.requests[-1].headers["authorization"] == "Basic c2VjcmV0LXZhbHVl"
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()
    lines = (tmp_path / "proxy.log").read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is JSON
    access = [e for e in entries if e.get("route") == "base"]
    assert access and access[0]["status"] == 200 and access[0]["method"] == "GET"
    assert isinstance(access[0]["duration_ms"], float)
    assert "c2VjcmV0LXZhbHVl" not in "\n".join(lines)


def test_discover(fake_proxy: tuple[FakeUpstream, ProxyServer]) -> None:
    fake, proxy = fake_proxy
    answer = httpx.get(f"{proxy.url}/v2/_oci/ext/discover")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    (ext,) = answer.json()["extensions"]
    assert ext["name"] == "_variants" and ext["endpoints"] == ["_variants"]
    assert ext["description"] and ext["url"].startswith("https://")
    assert fake.requests == []  # answered by the proxy itself


def test_healthz(fake_proxy: tuple[FakeUpstream, ProxyServer]) -> None:
    fake, proxy = fake_proxy
    assert httpx.get(f"{proxy.url}/healthz").text == "ok"
    assert fake.requests == []
    fake.routes["/v2/"] = Reply(401, b"{}", {"WWW-Authenticate": 'Basic realm="r"'})
    answer = httpx.get(f"{proxy.url}/healthz", params={"upstream": "1"})
    assert answer.status_code == 200
    assert answer.json()["upstream"]["reachable"] is True


def test_healthz_upstream_down() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with ProxyServer(f"http://127.0.0.1:{port}") as proxy:
        assert httpx.get(f"{proxy.url}/healthz").status_code == 200
        answer = httpx.get(f"{proxy.url}/healthz?upstream=1")
        assert answer.status_code == 503
        assert answer.json()["upstream"]["reachable"] is False


def test_invalid_paths_never_reach_the_upstream(
    fake_proxy: tuple[FakeUpstream, ProxyServer],
) -> None:
    fake, proxy = fake_proxy
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    bad = [
        "/v2/../etc/passwd",
        "/v2/a/../../x/tags/list",
        "/v2/%2e%2e/x/tags/list",
        "/v2/a/%2E%2E/tags/list",
        "/v2/A/tags/list",
        "/v2/a//b/manifests/1",
        "/v2/a/_variants/..%2f..%2fx",
        "/v2/a/blobs/..%2f..%2fsecret",
    ]
    for path in bad:
        connection.request("GET", path)
        answer = connection.getresponse()
        body = json.loads(answer.read())
        assert answer.status == 400, path
        assert answer.getheader("content-type") == "application/json"
        error = body["errors"][0]
        assert set(error) == {"code", "message", "detail"}
        assert error["code"] in ("NAME_INVALID", "TAG_INVALID", "DIGEST_INVALID"), path
    for path in ["/etc/passwd", "/v2/a/unknown", "/v1/_ping"]:
        connection.request("GET", path)
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 404, path
    connection.close()
    assert fake.requests == []


def test_metrics_and_access_log(
    fake_proxy: tuple[FakeUpstream, ProxyServer], caplog: pytest.LogCaptureFixture
) -> None:
    fake, proxy = fake_proxy
    fake.routes["/v2/"] = Reply(200, b"{}")
    with caplog.at_level(logging.INFO, logger="docker_variant.proxy.access"):
        httpx.get(f"{proxy.url}/v2/", headers={"Authorization": "Bearer top-secret"})
        httpx.get(f"{proxy.url}/v2/Bad/tags/list")
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'variant_proxy_requests_total{method="GET",route="base",status="200"} 1.0' in text
    assert 'route="invalid",status="400"' in text
    for name in ("variant_proxy_cache_hits_total", "variant_proxy_variants_seconds_bucket"):
        assert name in text
    lines = [JsonFormatter().format(r) for r in caplog.records if r.name.endswith("access")]
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert {"method", "route", "status", "duration_ms"} <= set(first)
    assert (first["method"], first["route"], first["status"]) == ("GET", "base", 200)
    assert all("top-secret" not in line for line in lines)
