"""Credentials from Docker's config.json, Basic auth on htpasswd, and the Bearer token flow."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import RunningRegistry
from docker_variant.errors import InvalidInputError
from docker_variant.oci import (
    BadUpstreamResponseError,
    Credentials,
    RegistryAuth,
    RegistryAuthError,
    RegistryClient,
    load_credentials,
)
from docker_variant.oci.auth import parse_challenge
from docker_variant.oci.client import SyncRegistryClient
from docker_variant.oci.mediatypes import OCI_MANIFEST
from fakeupstream import FakeUpstream, Reply, Seen
from imaging import ImageBuilder, raw_manifest, sha256_digest

WriteConfig = Callable[[Mapping[str, Any]], Path]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- config.json ------------------------------------------------------------------------


def test_no_config_means_no_credentials(docker_config: WriteConfig) -> None:
    assert load_credentials("127.0.0.1:5000") is None


@pytest.mark.parametrize(
    ("key", "registry"),
    [
        ("127.0.0.1:5000", "127.0.0.1:5000"),
        ("http://127.0.0.1:5000", "127.0.0.1:5000"),
        ("https://reg.example.com/v1/", "reg.example.com"),
        ("https://index.docker.io/v1/", "docker.io"),
    ],
)
def test_auths_entry_lookup(docker_config: WriteConfig, key: str, registry: str) -> None:
    docker_config({"auths": {key: {"auth": _b64("user:pa:ss")}, "other.io": {"auth": "x"}}})
    assert load_credentials(registry) == Credentials("user", "pa:ss")
    assert load_credentials("unrelated.example.com") is None


def test_auths_username_password_and_identity_token(docker_config: WriteConfig) -> None:
    docker_config(
        {
            "auths": {
                "a.io": {"username": "u", "password": "p"},
                "b.io": {"identitytoken": "refresh-me"},
            }
        }
    )
    assert load_credentials("a.io") == Credentials("u", "p")
    assert load_credentials("b.io") == Credentials(identity_token="refresh-me")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "unreadable Docker config"),
        ("[1]", "must be a JSON object"),
        (json.dumps({"auths": {"a.io": {"auth": "%%%"}}}), "not base64"),
        (json.dumps({"auths": {"a.io": {"auth": _b64("nocolon")}}}), "user:password"),
    ],
)
def test_bad_config_is_input_error(docker_config: WriteConfig, content: str, message: str) -> None:
    path = docker_config({})
    path.write_text(content)
    with pytest.raises(InvalidInputError, match=message) as caught:
        load_credentials("a.io")
    assert str(path) in str(caught.value)


@pytest.fixture
def fake_helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``docker-credential-fake`` on PATH: knows a.io and index.docker.io; logs its input."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "helper.log"
    script = bin_dir / "docker-credential-fake"
    script.write_text(
        "#!/bin/sh\n"
        f'read server; echo "$1 $server" >> {log}\n'
        'case "$server" in\n'
        '  a.io) echo \'{"ServerURL":"a.io","Username":"helper-user","Secret":"s3"}\' ;;\n'
        '  https://index.docker.io/v1/) echo \'{"Username":"<token>","Secret":"idt"}\' ;;\n'
        '  *) echo "credentials not found in native keychain"; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_cred_helpers_and_store(docker_config: WriteConfig, fake_helper: Path) -> None:
    docker_config(
        {
            "credHelpers": {"a.io": "fake", "gone.io": "not-installed"},
            "credsStore": "fake",
            "auths": {"c.io": {"auth": _b64("file:user")}},
        }
    )
    assert load_credentials("a.io") == Credentials("helper-user", "s3")
    assert load_credentials("docker.io") == Credentials(identity_token="idt")
    assert load_credentials("gone.io") is None  # a missing helper: no credentials
    assert load_credentials("c.io") == Credentials("file", "user")  # store knows none
    assert fake_helper.read_text().splitlines() == [
        "get a.io",
        "get https://index.docker.io/v1/",
        "get c.io",
    ]


def test_parse_challenge() -> None:
    bearer = 'Bearer realm="https://auth.io/token",service="reg.io",scope="repository:a/b:pull"'
    assert parse_challenge(['Basic realm="x"', bearer]) == (
        "bearer",
        {"realm": "https://auth.io/token", "service": "reg.io", "scope": "repository:a/b:pull"},
    )
    assert parse_challenge(['Basic realm="test-registry"']) == ("basic", {"realm": "test-registry"})
    assert parse_challenge(["Negotiate"]) is None


# --- Basic auth on an htpasswd registry ---------------------------------------------------


@pytest.fixture(scope="module")
def private(
    htpasswd_registry: Callable[[Mapping[str, str]], RunningRegistry],
    image_builder: ImageBuilder,
) -> tuple[RunningRegistry, str]:
    running = htpasswd_registry({"alice": "wonderland"})
    digest = image_builder.build_and_push(
        f"{running.host}/private/app:1.0.0",
        {"dev.pep817.variant-label": "cpu"},
        creds=("alice", "wonderland"),
    )
    return running, digest


def _labels(url: str, **kwargs: Any) -> tuple[str, dict[str, str]]:
    async def go() -> tuple[str, dict[str, str]]:
        async with RegistryClient(url, **kwargs) as client:
            return await client.image_labels("private/app", "1.0.0")

    return asyncio.run(go())


@pytest.mark.e2e
def test_htpasswd_with_right_credentials(
    private: tuple[RunningRegistry, str], docker_config: WriteConfig
) -> None:
    running, digest = private
    docker_config({"auths": {running.host: {"auth": _b64("alice:wonderland")}}})
    client = RegistryClient.for_registry(running.host)
    assert client.base_url == running.url  # loopback: plain http

    async def go() -> tuple[str, dict[str, str]]:
        async with client:
            return await client.image_labels("private/app", "1.0.0")

    got, labels = asyncio.run(go())
    assert got == digest and labels["dev.pep817.variant-label"] == "cpu"


@pytest.mark.e2e
@pytest.mark.parametrize("auths", [{}, {"auth": _b64("alice:wrong")}, {"auth": _b64("bob:x")}])
def test_htpasswd_without_or_with_wrong_credentials(
    private: tuple[RunningRegistry, str], docker_config: WriteConfig, auths: dict[str, str]
) -> None:
    running, _ = private
    docker_config({"auths": {running.host: auths} if auths else {}})
    auth = RegistryAuth.from_docker_config(running.host)
    with pytest.raises(RegistryAuthError) as caught:
        _labels(running.url, auth=auth)
    assert caught.value.status == 401
    assert caught.value.code == "UNAUTHORIZED"
    assert caught.value.headers["www-authenticate"] == 'Basic realm="test-registry"'
    assert "manifest private/app:1.0.0" in str(caught.value)


@pytest.mark.e2e
def test_caller_authorization_passes_through(private: tuple[RunningRegistry, str]) -> None:
    running, digest = private
    header = {"Authorization": "Basic " + _b64("alice:wonderland")}
    # with an auth object holding other credentials, the caller's header still wins
    auth = RegistryAuth(Credentials("bob", "x"))
    assert _labels(running.url, headers=header, auth=auth)[0] == digest
    with pytest.raises(RegistryAuthError):
        _labels(running.url, headers={"Authorization": "Basic " + _b64("alice:no")})


# --- the Bearer token flow ------------------------------------------------------------------

CONFIG = b'{"config": {"Labels": {"k": "v"}}}'


def _token_registry(fake: FakeUpstream, token_key: str = "token") -> list[Seen]:
    """Registry routes needing ``Bearer tok-N``; a realm that wants alice:wonderland."""
    issued: list[Seen] = []
    realm = f"{fake.url}/token"
    challenge = f'Bearer realm="{realm}",service="fake-registry",scope="repository:app:pull"'

    def protected(body: bytes, content_type: str) -> Callable[[Seen], Reply]:
        def serve(seen: Seen) -> Reply:
            if seen.headers.get("authorization", "").startswith("Bearer tok-"):
                return Reply(body=body, headers={"Content-Type": content_type})
            error = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
            return Reply(401, error, {"WWW-Authenticate": challenge})

        return serve

    def token(seen: Seen) -> Reply:
        issued.append(seen)
        if seen.method == "POST":
            form = dict(httpx.QueryParams(seen.body.decode()))
            good = form.get("refresh_token") == "refresh-me"
        else:
            good = seen.headers.get("authorization") in (None, "Basic " + _b64("alice:wonderland"))
        if not good:
            return Reply(401, b'{"details":"bad credentials"}')
        body = {token_key: f"tok-{len(issued)}", "expires_in": 300}
        return Reply(body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})

    fake.routes["/token"] = token
    fake.routes["/v2/app/tags/list"] = protected(
        b'{"name":"app","tags":["1.0"]}', "application/json"
    )
    fake.routes["/v2/app/manifests/1.0"] = protected(raw_manifest(CONFIG), OCI_MANIFEST)
    fake.routes[f"/v2/app/blobs/{sha256_digest(CONFIG)}"] = protected(CONFIG, "application/json")
    return issued


def _scan_like(url: str, auth: RegistryAuth) -> tuple[list[str], dict[str, str]]:
    async def go() -> tuple[list[str], dict[str, str]]:
        async with RegistryClient(url, auth=auth) as client:
            tags = await client.list_tags("app")
            return tags, (await client.image_labels("app", "1.0"))[1]

    return asyncio.run(go())


@pytest.mark.parametrize("token_key", ["token", "access_token"])
def test_bearer_flow_with_credentials(fake_upstream: FakeUpstream, token_key: str) -> None:
    issued = _token_registry(fake_upstream, token_key)
    auth = RegistryAuth(Credentials("alice", "wonderland"))
    assert _scan_like(fake_upstream.url, auth) == (["1.0"], {"k": "v"})
    # one token for the scope, then every request goes out authorised: one 401 in all
    assert len(issued) == 1
    assert issued[0].query == {"service": ["fake-registry"], "scope": ["repository:app:pull"]}
    assert issued[0].headers["authorization"] == "Basic " + _b64("alice:wonderland")
    unauthorised = [r for r in fake_upstream.requests if r.path != "/token"]
    assert sum("authorization" not in r.headers for r in unauthorised) == 1


def test_bearer_flow_anonymous_and_refresh_token(fake_upstream: FakeUpstream) -> None:
    issued = _token_registry(fake_upstream)
    assert _scan_like(fake_upstream.url, RegistryAuth())[1] == {"k": "v"}
    assert "authorization" not in issued[0].headers
    auth = RegistryAuth(Credentials(identity_token="refresh-me"))
    assert _scan_like(fake_upstream.url, auth)[1] == {"k": "v"}
    assert issued[-1].method == "POST"


def test_bearer_token_expiry(fake_upstream: FakeUpstream) -> None:
    issued = _token_registry(fake_upstream)
    now = [0.0]
    auth = RegistryAuth(Credentials("alice", "wonderland"), clock=lambda: now[0])
    _scan_like(fake_upstream.url, auth)
    now[0] = 1000.0  # past expires_in: the cached token is not used again
    _scan_like(fake_upstream.url, auth)
    assert len(issued) == 2


def test_bearer_flow_wrong_credentials(fake_upstream: FakeUpstream) -> None:
    _token_registry(fake_upstream)
    with pytest.raises(RegistryAuthError) as caught:
        _scan_like(fake_upstream.url, RegistryAuth(Credentials("alice", "nope")))
    assert caught.value.status == 401
    assert "token endpoint" in str(caught.value)
    assert caught.value.headers["www-authenticate"].startswith("Bearer realm=")


def test_bearer_flow_garbage_token(fake_upstream: FakeUpstream) -> None:
    _token_registry(fake_upstream)
    fake_upstream.routes["/token"] = Reply(body=b"<html>", headers={"Content-Type": "text/html"})
    with pytest.raises(BadUpstreamResponseError, match=r"token endpoint .* not JSON"):
        _scan_like(fake_upstream.url, RegistryAuth())


def test_the_sync_client_answers_basic_and_bearer_challenges(
    private: tuple[RunningRegistry, str], docker_config: WriteConfig, fake_upstream: FakeUpstream
) -> None:
    """The sync client (``pull``, ``resolve``) with Docker's stored credentials: Basic on an
    htpasswd registry, and the token flow with one 401 in all."""
    running, digest = private
    docker_config({"auths": {running.host: {"auth": _b64("alice:wonderland")}}})
    with SyncRegistryClient.for_registry(running.host) as client:
        got, labels = client.image_labels("private/app", "1.0.0")
    assert got == digest and labels["dev.pep817.variant-label"] == "cpu"
    docker_config({"auths": {running.host: {"auth": _b64("alice:wrong")}}})
    with (
        SyncRegistryClient.for_registry(running.host) as client,
        pytest.raises(RegistryAuthError, match=r"manifest private/app:1\.0\.0"),
    ):
        client.image_labels("private/app", "1.0.0")

    issued = _token_registry(fake_upstream)
    auth = RegistryAuth(Credentials("alice", "wonderland"))
    with SyncRegistryClient(fake_upstream.url, auth=auth) as client:
        assert client.list_tags("app") == ["1.0"]
        assert client.image_labels("app", "1.0")[1] == {"k": "v"}
    assert len(issued) == 1
    unauthorised = [r for r in fake_upstream.requests if r.path != "/token"]
    assert sum("authorization" not in r.headers for r in unauthorised) == 1
