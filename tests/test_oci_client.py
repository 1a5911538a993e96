"""RegistryClient against a real registry and against a scripted broken one."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from conftest import RunningRegistry
from docker_variant.errors import DockerVariantError, InvalidInputError, UnreachableError
from docker_variant.oci import (
    BadUpstreamResponseError,
    Manifest,
    NotFoundError,
    Platform,
    RegistryAuthError,
    RegistryClient,
    RegistryError,
    UpstreamUnavailableError,
)
from docker_variant.oci.client import SyncRegistryClient
from docker_variant.oci.errors import RateLimitedError
from docker_variant.oci.mediatypes import MANIFEST_ACCEPT, OCI_INDEX, OCI_MANIFEST
from fakeupstream import FakeUpstream, Reply, Seen
from imaging import ImageBuilder, push_index, raw_manifest, sha256_digest

pytestmark = pytest.mark.e2e
T = TypeVar("T")

LABELS = {
    "dev.pep817.variant-label": "cu128",
    "dev.pep817.variant.nvidia.sm_arch": "90_real,100_real",
}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _with(base_url: str, call: Any, **kwargs: Any) -> Any:
    async with RegistryClient(base_url, **kwargs) as client:
        return await call(client)


# --- a real registry ---------------------------------------------------------------


@pytest.fixture(scope="module")
def pushed(registry: RunningRegistry, image_builder: ImageBuilder) -> dict[str, str]:
    """Images in repository ``client/app``: tag -> digest."""
    dest = f"{registry.host}/client/app"
    digests = {
        "labelled": image_builder.build_and_push(f"{dest}:labelled", LABELS, layers=3),
        "plain": image_builder.build_and_push(f"{dest}:plain", {}, layers=0),
        "amd": image_builder.build_and_push(f"{dest}:amd", {"arch": "amd"}, architecture="amd64"),
        "arm": image_builder.build_and_push(f"{dest}:arm", {"arch": "arm"}, architecture="arm64"),
    }
    digests["multi"] = push_index(
        registry.url,
        "client/app",
        "multi",
        [(digests["arm"], "linux", "arm64"), (digests["amd"], "linux", "amd64")],
    )
    digests["windows"] = push_index(
        registry.url, "client/app", "windows", [(digests["amd"], "windows", "amd64")]
    )
    for i in range(7):
        image_builder.build_and_push(f"{dest}:extra{i}", {}, layers=0)
    return digests


def test_manifest_config_and_labels(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    async def go(client: RegistryClient) -> Any:
        manifest = await client.get_manifest("client/app", "labelled")
        config = await client.get_config("client/app", manifest)
        return manifest, config, await client.image_labels("client/app", "labelled")

    manifest, config, (digest, labels) = run(_with(registry.url, go))
    assert manifest.media_type == OCI_MANIFEST
    assert manifest.digest == pushed["labelled"] == digest
    assert manifest.digest == sha256_digest(manifest.raw)
    assert manifest.index_digest is None
    assert len(manifest.data["layers"]) == 3
    assert config["architecture"] == "amd64"
    assert config["config"]["Labels"]["dev.pep817.variant.nvidia.sm_arch"] == "90_real,100_real"
    assert {k: labels[k] for k in LABELS} == LABELS


def test_image_without_labels(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    digest, labels = run(_with(registry.url, lambda c: c.image_labels("client/app", "plain")))
    assert digest == pushed["plain"]
    assert set(labels) == {"test.image-id"}  # only the builder's own marker


def test_manifest_by_digest(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    manifest = run(_with(registry.url, lambda c: c.get_manifest("client/app", pushed["plain"])))
    assert manifest.digest == pushed["plain"]


def test_list_tags_real_registry(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    tags = run(_with(registry.url, lambda c: c.list_tags("client/app")))
    assert sorted(tags) == sorted([*pushed, *(f"extra{i}" for i in range(7))])
    # registry 2.8 ignores ?n= on tags/list (it answers everything in one page): still complete
    paged = run(_with(registry.url, lambda c: c.list_tags("client/app", page_size=2)))
    assert sorted(paged) == sorted(tags)


@pytest.mark.parametrize(
    ("platform", "chosen"),
    [
        (Platform("linux", "amd64"), "amd"),
        (Platform("linux", "arm64"), "arm"),
        (Platform("linux", "s390x"), "arm"),  # no match: the index's first linux entry
    ],
)
def test_index_resolves_to_platform(
    registry: RunningRegistry, pushed: dict[str, str], platform: Platform, chosen: str
) -> None:
    async def go(client: RegistryClient) -> Any:
        manifest = await client.get_manifest("client/app", "multi")
        return manifest, await client.image_labels("client/app", "multi")

    manifest, (digest, labels) = run(_with(registry.url, go, platform=platform))
    assert manifest.digest == pushed[chosen]
    assert manifest.index_digest == pushed["multi"]
    assert manifest.tag_digest == digest == pushed["multi"]
    assert labels["arch"] == chosen


def test_index_without_linux(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    with pytest.raises(NotFoundError, match="no linux manifest") as caught:
        run(_with(registry.url, lambda c: c.get_manifest("client/app", "windows")))
    assert caught.value.code == "MANIFEST_UNKNOWN"


def test_not_found(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    with pytest.raises(NotFoundError) as caught:
        run(_with(registry.url, lambda c: c.list_tags("client/nothing-here")))
    assert (caught.value.status, caught.value.code) == (404, "NAME_UNKNOWN")
    assert "tag list of client/nothing-here" in str(caught.value)
    with pytest.raises(NotFoundError) as caught:
        run(_with(registry.url, lambda c: c.get_manifest("client/app", "9.9.9")))
    assert caught.value.code == "MANIFEST_UNKNOWN"
    assert "client/app:9.9.9" in str(caught.value)


def test_concurrency_limit_is_respected(registry: RunningRegistry, pushed: dict[str, str]) -> None:
    async def go(client: RegistryClient) -> list[Any]:
        calls = [client.get_manifest("client/app", t) for t in pushed if t != "windows"]
        return list(await asyncio.gather(*calls))

    manifests = run(_with(registry.url, go, max_concurrency=2))
    assert {m.digest for m in manifests} >= {pushed["plain"], pushed["labelled"]}
    with pytest.raises(InvalidInputError, match="max_concurrency"):
        RegistryClient(registry.url, max_concurrency=0)


def test_variant_index_absent_on_plain_registry(registry: RunningRegistry) -> None:
    # the plain registry answers the extension path with a text/plain 404
    assert run(_with(registry.url, lambda c: c.get_variant_index("client/app", "1.0.0"))) is None


def test_rejects_bad_names_before_any_request(registry: RunningRegistry) -> None:
    with pytest.raises(InvalidInputError, match="invalid repository name"):
        run(_with(registry.url, lambda c: c.list_tags("../../etc")))
    with pytest.raises(InvalidInputError):
        run(_with(registry.url, lambda c: c.get_manifest("client/app", "a/b")))


# --- an unreachable registry ------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


def test_registry_down() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(UpstreamUnavailableError) as caught:
        run(_with(url, lambda c: c.list_tags("app")))
    message = str(caught.value)
    assert "unreachable: Connection refused" in message and url in message
    assert "\n" not in message
    assert caught.value.status is None
    assert isinstance(caught.value, UnreachableError) and caught.value.exit_code == 3


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (kernel backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def test_registry_timeout(silent_port: int) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    with pytest.raises(UpstreamUnavailableError, match="timed out") as caught:
        run(_with(url, lambda c: c.get_manifest("app", "1.0"), timeout=0.3))
    assert url in str(caught.value)


def test_unknown_host() -> None:
    with pytest.raises(UpstreamUnavailableError) as caught:
        run(_with("https://no-such-host.invalid", lambda c: c.list_tags("app"), timeout=3))
    assert "https://no-such-host.invalid/v2/app/tags/list" in str(caught.value)


def test_bad_base_url_is_input_error() -> None:
    with pytest.raises(InvalidInputError, match="ftp://"):
        run(_with("ftp://127.0.0.1:1", lambda c: c.list_tags("app")))


# --- a broken upstream ------------------------------------------------------------------

CONFIG = json.dumps({"architecture": "amd64", "config": {"Labels": {"a": "b"}}}).encode()


def _serve_image(
    fake: FakeUpstream,
    config: bytes = CONFIG,
    *,
    manifest: bytes | None = None,
    content_type: str = OCI_MANIFEST,
    **reply: Any,
) -> None:
    body = raw_manifest(config) if manifest is None else manifest
    fake.routes["/v2/app/manifests/1.0"] = Reply(
        body=body, headers={"Content-Type": content_type}, **reply
    )
    fake.routes[f"/v2/app/blobs/{sha256_digest(config)}"] = Reply(body=config)


def _labels(fake: FakeUpstream) -> tuple[str, dict[str, str]]:
    result: tuple[str, dict[str, str]] = run(
        _with(fake.url, lambda c: c.image_labels("app", "1.0"))
    )
    return result


def test_fake_upstream_good_image(fake_upstream: FakeUpstream) -> None:
    _serve_image(fake_upstream)
    digest, labels = _labels(fake_upstream)
    assert digest == sha256_digest(raw_manifest(CONFIG))  # no Docker-Content-Digest: hashed
    assert labels == {"a": "b"}
    assert fake_upstream.requests[0].headers["accept"] == MANIFEST_ACCEPT


def test_manifest_as_application_json(fake_upstream: FakeUpstream) -> None:
    _serve_image(fake_upstream, content_type="application/json")
    assert _labels(fake_upstream)[1] == {"a": "b"}


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda f: _serve_image(f, truncate_to=40), "incomplete"),
        (lambda f: _serve_image(f, content_type="text/html"), "content type 'text/html'"),
        (lambda f: _serve_image(f, manifest=b'{"schemaVersion": 2, "conf'), "not JSON"),
        (lambda f: _serve_image(f, manifest=b"[1, 2]"), "not an object"),
        (lambda f: _serve_image(f, manifest=b'{"schemaVersion": 2}'), "config.digest"),
        (lambda f: _serve_image(f, config=b"<html>not json"), "config blob"),
        (lambda f: _serve_image(f, config=b'["a"]'), "not an object"),
        (lambda f: _serve_image(f, config=b'{"config": {"Labels": {"a": 1}}}'), "Labels"),
        (lambda f: _serve_image(f, manifest=b"{" + b" " * (5 << 20) + b"}"), "allowed"),
        (lambda f: _serve_image(f, manifest=b"[" * 100_000), "nested more than 32 levels deep"),
    ],
)
def test_bad_upstream_data(fake_upstream: FakeUpstream, setup: Any, expected: str) -> None:
    setup(fake_upstream)
    with pytest.raises(BadUpstreamResponseError) as caught:
        _labels(fake_upstream)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert fake_upstream.url in message  # says where


def test_config_digest_mismatch(fake_upstream: FakeUpstream) -> None:
    _serve_image(fake_upstream)
    fake_upstream.routes[f"/v2/app/blobs/{sha256_digest(CONFIG)}"] = Reply(body=CONFIG + b" ")
    with pytest.raises(BadUpstreamResponseError, match="does not match its digest"):
        _labels(fake_upstream)


def test_index_with_garbage_entries(fake_upstream: FakeUpstream) -> None:
    body = json.dumps({"schemaVersion": 2, "manifests": [{"size": 1}]}).encode()
    _serve_image(fake_upstream, manifest=body, content_type=OCI_INDEX)
    with pytest.raises(BadUpstreamResponseError, match="'manifests'"):
        _labels(fake_upstream)


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_are_unavailable(fake_upstream: FakeUpstream, status: int) -> None:
    fake_upstream.routes["/v2/app/tags/list"] = Reply(status, b"<html>oops</html>")
    with pytest.raises(UpstreamUnavailableError, match=f"answered {status}") as caught:
        run(_with(fake_upstream.url, lambda c: c.list_tags("app")))
    assert caught.value.status == status


def test_huge_error_body_still_gives_the_status(fake_upstream: FakeUpstream) -> None:
    body = b'{"errors":[{"code":"DENIED","message":"no"}]}' + b" " * (1 << 20)
    fake_upstream.routes["/v2/app/tags/list"] = Reply(403, body)
    with pytest.raises(RegistryAuthError) as caught:
        run(_with(fake_upstream.url, lambda c: c.list_tags("app")))
    # the first 64 KiB are read: enough for the code, and no "too large" error instead
    assert (caught.value.status, caught.value.code) == (403, "DENIED")


def test_other_client_errors_keep_the_oci_code(fake_upstream: FakeUpstream) -> None:
    body = {"errors": [{"code": "NAME_INVALID", "message": "invalid\nrepository name"}]}
    fake_upstream.routes["/v2/app/tags/list"] = Reply(400, json.dumps(body).encode())
    with pytest.raises(RegistryError) as caught:
        run(_with(fake_upstream.url, lambda c: c.list_tags("app")))
    assert type(caught.value) is RegistryError
    assert caught.value.code == "NAME_INVALID"
    assert "invalid repository name" in str(caught.value)  # one line, message kept


# --- tag pagination (the Debian registry does not paginate tags/list) -------------------


def _paged_tags(pages: list[list[str]], absolute_base: str | None = None) -> Any:
    def handler(seen: Seen) -> Reply:
        last = seen.query.get("last", [""])[0]
        index = 0 if not last else next(i + 1 for i, p in enumerate(pages) if p[-1] == last)
        headers = {"Content-Type": "application/json"}
        if index + 1 < len(pages):
            path = f"/v2/app/tags/list?n={len(pages[0])}&last={pages[index][-1]}"
            headers["Link"] = f'<{absolute_base or ""}{path}>; rel="next"'
        return Reply(
            body=json.dumps({"name": "app", "tags": pages[index]}).encode(), headers=headers
        )

    return handler


@pytest.mark.parametrize("absolute", [False, True])
def test_tag_pagination_follows_link(fake_upstream: FakeUpstream, absolute: bool) -> None:
    pages = [["1.0.0", "1.0.0-cpu"], ["1.0.0-cu126", "1.0.0-cu128"], ["2.0.0"]]
    base = fake_upstream.url if absolute else None
    fake_upstream.routes["/v2/app/tags/list"] = _paged_tags(pages, base)
    tags = run(_with(fake_upstream.url, lambda c: c.list_tags("app", page_size=2)))
    assert tags == [t for page in pages for t in page]
    assert len(fake_upstream.requests) == 3
    assert fake_upstream.requests[0].query["n"] == ["2"]


def test_tag_pagination_loop_and_foreign_host(fake_upstream: FakeUpstream) -> None:
    looping = Reply(
        body=b'{"name": "app", "tags": ["a"]}',
        headers={"Link": '</v2/app/tags/list?last=a>; rel="next"'},
    )
    fake_upstream.routes["/v2/app/tags/list"] = looping
    with pytest.raises(BadUpstreamResponseError, match="pagination loop"):
        run(_with(fake_upstream.url, lambda c: c.list_tags("app")))
    looping.headers["Link"] = '<http://198.51.100.1/v2/app/tags/list?last=a>; rel="next"'
    with pytest.raises(BadUpstreamResponseError, match="another host"):
        run(_with(fake_upstream.url, lambda c: c.list_tags("app")))


def test_tags_null_and_bad_tags(fake_upstream: FakeUpstream) -> None:
    fake_upstream.routes["/v2/app/tags/list"] = Reply(body=b'{"name": "app", "tags": null}')
    assert run(_with(fake_upstream.url, lambda c: c.list_tags("app"))) == []
    fake_upstream.routes["/v2/app/tags/list"] = Reply(body=b'{"name": "app", "tags": "x"}')
    with pytest.raises(BadUpstreamResponseError, match="not a list of strings"):
        run(_with(fake_upstream.url, lambda c: c.list_tags("app")))


def test_an_index_has_no_config() -> None:
    index = Manifest(OCI_INDEX, "sha256:" + "1" * 64, b"{}", {"manifests": []})
    assert index.is_index
    with pytest.raises(InvalidInputError, match="is an index"):
        _ = index.config_digest


# --- the sync client: the same reads, the same answers and errors ------------------------


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except DockerVariantError as exc:
        return type(exc).__name__, str(exc)


def _on_both(base_url: str, call: Any, **kwargs: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """``call(client)`` on the asyncio client and on the sync one: (result or error) each."""

    async def on_async(client: RegistryClient) -> Any:
        return await call(client)

    def on_sync() -> Any:
        with SyncRegistryClient(base_url, **kwargs) as client:
            return call(client)

    return _outcome(lambda: run(_with(base_url, on_async, **kwargs))), _outcome(on_sync)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_manifest("client/app", "labelled"),
        lambda c: c.get_manifest("client/app", "multi", platform=Platform("linux", "arm64")),
        lambda c: c.get_manifest("client/app", "windows"),
        lambda c: c.fetch_manifest("client/app", "multi"),
        lambda c: c.image_labels("client/app", "labelled"),
        lambda c: c.list_tags("client/app", page_size=3),
        lambda c: c.get_variant_index("client/app", "1.0.0"),
        lambda c: c.fetch_manifest("client/nosuch", "1.0"),
        lambda c: c.fetch_manifest("client/app", "sha256:" + "0" * 64),
    ],
)
def test_the_sync_client_reads_a_real_registry_as_the_async_one(
    registry: RunningRegistry, pushed: dict[str, str], call: Any
) -> None:
    on_async, on_sync = _on_both(registry.url, call)
    assert on_sync == on_async


@pytest.mark.parametrize(
    "setup",
    [
        lambda f: _serve_image(f),
        lambda f: _serve_image(f, truncate_to=40),
        lambda f: _serve_image(f, content_type="text/html"),
        lambda f: _serve_image(f, manifest=b"{" + b" " * (5 << 20) + b"}"),
        lambda f: _serve_image(f, config=b'{"config": {"Labels": {"a": 1}}}'),
        lambda f: f.routes.update({"/v2/app/manifests/1.0": Reply(503, b"<html>busy</html>")}),
        lambda f: f.routes.update(
            {"/v2/app/manifests/1.0": Reply(403, b'{"errors":[{"code":"DENIED"}]}' * 9999)}
        ),
    ],
)
def test_the_sync_client_checks_bad_answers_as_the_async_one(
    fake_upstream: FakeUpstream, setup: Any
) -> None:
    setup(fake_upstream)
    on_async, on_sync = _on_both(fake_upstream.url, lambda c: c.image_labels("app", "1.0"))
    assert on_sync == on_async
    assert on_sync[0] != "ok" or on_sync[1][1] == {"a": "b"}


def test_the_sync_client_waits_out_a_429_within_its_budget(fake_upstream: FakeUpstream) -> None:
    limited = b'{"errors": [{"code": "TOOMANYREQUESTS", "message": "slow down"}]}'
    answers = [Reply(429, limited, {"Retry-After": "0"}), Reply(body=b'{"tags": ["1.0"]}')]
    fake_upstream.routes["/v2/app/tags/list"] = lambda _: answers.pop(0)
    with SyncRegistryClient(fake_upstream.url) as client:
        assert client.list_tags("app") == ["1.0"]
    assert answers == []
    fake_upstream.routes["/v2/app/tags/list"] = Reply(429, limited, {"Retry-After": "3600"})
    with (
        SyncRegistryClient(fake_upstream.url, rate_limit_wait=5) as client,
        pytest.raises(RateLimitedError, match="asks to wait 3600 s and docker-variant waits"),
    ):
        client.list_tags("app")


@pytest.mark.parametrize("header", ["\u00b2", "1\u00b2", "+5", "-1", "5 s"])
def test_a_retry_after_that_is_no_ascii_number_is_read_as_one_second(
    fake_upstream: FakeUpstream, header: str
) -> None:
    """RFC 9110's delta-seconds is 1*DIGIT, ASCII: "²" passes str.isdigit() and float()
    refuses it, which once raised a bare ValueError out of list_tags. It reads as no
    delay given (1 s), over a budget of half a second: the client's own error."""
    limited = b'{"errors": [{"code": "TOOMANYREQUESTS", "message": "slow down"}]}'
    fake_upstream.routes["/v2/app/tags/list"] = Reply(429, limited, {"Retry-After": header})
    with (
        SyncRegistryClient(fake_upstream.url, rate_limit_wait=0.5) as client,
        pytest.raises(RateLimitedError, match=r"asks to wait 1\.0 s and docker-variant waits"),
    ):
        client.list_tags("app")


def test_the_sync_client_names_a_registry_that_is_down() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        SyncRegistryClient(f"http://127.0.0.1:{port}") as client,
        pytest.raises(UpstreamUnavailableError, match=f"127.0.0.1:{port}.*Connection refused"),
    ):
        client.list_tags("app")
