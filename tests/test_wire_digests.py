"""Digests come from the bytes received, never from what a registry says: a
``Docker-Content-Digest`` that is not the digest of the manifest it came with is refused
(exit 3, both digests named), and whatever is fetched by digest is checked against it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.oci.client import RegistryClient
from docker_variant.oci.errors import BadUpstreamResponseError
from fakeupstream import FakeUpstream, Reply
from imaging import sha256_digest

CONFIG = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {}}}).encode()
OTHER_IMAGE = "sha256:" + "e" * 64


def _call(fake: FakeUpstream, call: Any) -> Any:
    async def go() -> Any:
        async with RegistryClient(fake.url) as client:
            return await call(client)

    return asyncio.run(go())


def test_a_truthful_digest_header_is_taken(fake_upstream: FakeUpstream) -> None:
    digest = fake_upstream.serve_image("app", "1.0", CONFIG)
    manifest = _call(fake_upstream, lambda c: c.get_manifest("app", "1.0"))
    assert manifest.digest == digest == sha256_digest(manifest.raw)


def test_a_tag_whose_digest_header_lies_is_refused_naming_both(
    fake_upstream: FakeUpstream,
) -> None:
    digest = fake_upstream.serve_image("app", "1.0", CONFIG, stated_digest=OTHER_IMAGE)
    with pytest.raises(BadUpstreamResponseError) as caught:
        _call(fake_upstream, lambda c: c.image_labels("app", "1.0"))
    message = str(caught.value)
    assert OTHER_IMAGE in message and digest in message
    assert caught.value.exit_code == 3 and "\n" not in message
    # nothing was read on the strength of the lie: no config blob was asked for
    assert [r.path for r in fake_upstream.requests] == ["/v2/app/manifests/1.0"]


@pytest.mark.parametrize("stated", ["sha256:zz", "md5:abc", "garbage\x1b[31m"])
def test_a_digest_header_that_is_no_digest_is_refused(
    fake_upstream: FakeUpstream, stated: str
) -> None:
    fake_upstream.serve_image("app", "1.0", CONFIG, stated_digest=stated)
    with pytest.raises(BadUpstreamResponseError, match="Docker-Content-Digest") as caught:
        _call(fake_upstream, lambda c: c.get_manifest("app", "1.0"))
    assert "\x1b" not in str(caught.value)  # shown escaped


def test_a_manifest_fetched_by_digest_must_hash_to_it(fake_upstream: FakeUpstream) -> None:
    child = fake_upstream.serve_image("app", "child", CONFIG)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": child,
                "size": 1,
                "platform": {"os": "linux", "architecture": "amd64"},
            }
        ],
    }
    fake_upstream.routes["/v2/app/manifests/1.0"] = Reply(
        body=json.dumps(index).encode(),
        headers={"Content-Type": "application/vnd.oci.image.index.v1+json"},
    )
    # the registry answers the child's digest with other bytes (and no digest header)
    other = fake_upstream.routes["/v2/app/manifests/child"]
    assert isinstance(other, Reply)
    fake_upstream.routes[f"/v2/app/manifests/{child}"] = Reply(
        body=other.body + b" ", headers={"Content-Type": other.headers["Content-Type"]}
    )
    with pytest.raises(BadUpstreamResponseError, match="does not match its digest"):
        _call(fake_upstream, lambda c: c.get_manifest("app", "1.0"))


def test_a_digest_of_an_algorithm_that_cannot_be_checked_is_not_fetched(
    fake_upstream: FakeUpstream,
) -> None:
    with pytest.raises(InvalidInputError, match="cannot verify a blake3 digest"):
        _call(fake_upstream, lambda c: c.fetch_manifest("app", "blake3:" + "a" * 64))
    assert fake_upstream.requests == []


def test_a_push_whose_digest_header_lies_is_refused(fake_upstream: FakeUpstream) -> None:
    fake_upstream.routes["/v2/app/manifests/1.0"] = Reply(
        201, headers={"Docker-Content-Digest": OTHER_IMAGE}
    )
    body = b'{"schemaVersion": 2, "manifests": []}'
    with pytest.raises(BadUpstreamResponseError) as caught:
        _call(
            fake_upstream,
            lambda c: c.put_manifest("app", "1.0", body, "application/vnd.oci.image.index.v1+json"),
        )
    assert OTHER_IMAGE in str(caught.value) and sha256_digest(body) in str(caught.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "docker_variant", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["inspect", "ls"])
def test_the_cli_refuses_a_lying_registry_with_exit_3(
    fake_upstream: FakeUpstream, command: str
) -> None:
    digest = fake_upstream.serve_image("app", "1.0", CONFIG, stated_digest=OTHER_IMAGE)
    fake_upstream.routes["/v2/app/tags/list"] = Reply(
        body=json.dumps({"name": "app", "tags": ["1.0"]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    done = _cli(command, f"127.0.0.1:{fake_upstream.port}/app:1.0")
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert OTHER_IMAGE in lines[0] and digest in lines[0]


def test_a_config_digest_outside_the_grammar_is_never_put_in_a_url(
    fake_upstream: FakeUpstream,
) -> None:
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"digest": "sha256:../../../v2/other/blobs/x", "size": 1},
            "layers": [],
        }
    ).encode()
    fake_upstream.serve_image("app", "1.0", CONFIG, manifest=manifest)
    with pytest.raises(BadUpstreamResponseError, match=r"config digest .* is not sha256"):
        _call(fake_upstream, lambda c: c.image_labels("app", "1.0"))
    assert [r.path for r in fake_upstream.requests] == ["/v2/app/manifests/1.0"]


def test_a_layer_digest_outside_the_grammar_is_not_fetched(fake_upstream: FakeUpstream) -> None:
    async def stream(client: RegistryClient) -> list[bytes]:
        return [chunk async for chunk in client.stream_blob("app", "sha256:../x")]

    with pytest.raises(InvalidInputError, match="only sha256 digests"):
        _call(fake_upstream, stream)
    assert fake_upstream.requests == []
