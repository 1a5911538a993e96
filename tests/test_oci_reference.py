"""Image references parse the way Docker parses them."""

from __future__ import annotations

import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import (
    Reference,
    check_manifest_reference,
    check_repository,
    parse_reference,
    registry_base_url,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ubuntu", Reference("docker.io", "library/ubuntu")),
        ("ubuntu:24.04", Reference("docker.io", "library/ubuntu", "24.04")),
        ("myorg/app:1.0.0", Reference("docker.io", "myorg/app", "1.0.0")),
        ("docker.io/ubuntu", Reference("docker.io", "library/ubuntu")),
        ("index.docker.io/library/ubuntu:1", Reference("docker.io", "library/ubuntu", "1")),
        ("localhost/app", Reference("localhost", "app")),
        ("localhost:5000/app:1.0.0", Reference("localhost:5000", "app", "1.0.0")),
        (
            "127.0.0.1:5000/team/app:1.0.0-ubuntu24.04-cu128",
            Reference("127.0.0.1:5000", "team/app", "1.0.0-ubuntu24.04-cu128"),
        ),
        ("[::1]:5000/app:v1", Reference("[::1]:5000", "app", "v1")),
        ("ghcr.io/org/sub/app@" + DIGEST, Reference("ghcr.io", "org/sub/app", None, DIGEST)),
        ("reg.example.com/app:1.0@" + DIGEST, Reference("reg.example.com", "app", "1.0", DIGEST)),
        ("Registry/app", Reference("Registry", "app")),  # upper case makes it a host
        ("r.io/a.b/c_d/e__f/g-h/i---j", Reference("r.io", "a.b/c_d/e__f/g-h/i---j")),
        ("app:_private", Reference("docker.io", "library/app", "_private")),
        ("app:" + "t" * 128, Reference("docker.io", "library/app", "t" * 128)),
    ],
)
def test_parses_like_docker(text: str, expected: Reference) -> None:
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("", "empty"),
        ("App:1.0", "lowercase"),
        ("docker.io/Org/app", "lowercase"),
        ("127.0.0.1:5000/Team/app", "lowercase"),
        ("app:", "tag"),
        ("app:-dash", "tag"),
        ("app:" + "t" * 129, "tag"),
        ("app:1.0+build", "tag"),
        ("app@sha256:abc", "digest"),
        ("app@sha256:" + "A" * 64, "lowercase hex"),
        ("app@sha256", "digest"),
        ("app@" + "x" * 40, "digest"),
        ("a" * 64, "image ID"),
        ("my app", "whitespace"),
        (" app", "whitespace"),
        ("/app", "[a-z0-9]"),
        ("org//app", "[a-z0-9]"),
        ("org/_app", "[a-z0-9]"),
        ("org/app-", "[a-z0-9]"),
        ("-app", "[a-z0-9]"),
        ("a..b/app", "host"),
        ("localhost:port/app", "host"),
        ("-reg.io/app", "host"),
        ("r.io/", "missing"),
        ("r.io/" + "a" * 251, "255"),
    ],
)
def test_rejects_bad_references(text: str, rule: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_reference(text)
    message = str(caught.value)
    assert repr(text) in message  # names the offending value
    assert rule in message  # and the rule it breaks
    assert "\n" not in message


@pytest.mark.parametrize(
    "text",
    [
        "docker.io/library/ubuntu:24.04",
        "127.0.0.1:5000/team/app:1.0.0-cu128",
        f"ghcr.io/a/b:1@{DIGEST}",
        "localhost/app",
        "[::1]:5000/app@" + DIGEST,
    ],
)
def test_str_round_trips(text: str) -> None:
    assert str(parse_reference(text)) == text
    assert parse_reference(str(parse_reference(text))) == parse_reference(text)


def test_str_is_explicit_and_familiar_is_short() -> None:
    ref = parse_reference("ubuntu:24.04")
    assert str(ref) == "docker.io/library/ubuntu:24.04"
    assert ref.familiar() == "ubuntu:24.04"
    assert parse_reference("myorg/app").familiar() == "myorg/app"
    assert parse_reference("127.0.0.1:5000/app:1").familiar() == "127.0.0.1:5000/app:1"


def test_with_tag_replaces_tag_and_drops_digest() -> None:
    ref = parse_reference(f"127.0.0.1:5000/app:1.0.0@{DIGEST}")
    moved = ref.with_tag("1.0.0-cu128")
    assert str(moved) == "127.0.0.1:5000/app:1.0.0-cu128"
    assert moved.digest is None
    assert ref.tag == "1.0.0"  # frozen: the original is unchanged
    with pytest.raises(InvalidInputError, match="'bad tag'"):
        ref.with_tag("bad tag")


def test_with_digest() -> None:
    ref = parse_reference("r.io/app:1").with_digest(DIGEST)
    assert str(ref) == f"r.io/app:1@{DIGEST}"
    with pytest.raises(InvalidInputError, match="sha256:00"):
        ref.with_digest("sha256:00")


@pytest.mark.parametrize(
    ("registry", "url"),
    [
        ("docker.io", "https://registry-1.docker.io"),
        ("index.docker.io", "https://registry-1.docker.io"),
        ("localhost", "http://localhost"),
        ("localhost:5000", "http://localhost:5000"),
        ("127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("127.8.9.10", "http://127.8.9.10"),
        ("[::1]:5000", "http://[::1]:5000"),
        ("ghcr.io", "https://ghcr.io"),
        ("10.0.0.1:5000", "https://10.0.0.1:5000"),
        ("localhost.example.com", "https://localhost.example.com"),
        ("128.0.0.1", "https://128.0.0.1"),
    ],
)
def test_registry_base_url(registry: str, url: str) -> None:
    assert registry_base_url(registry) == url


def test_url_part_checks() -> None:
    check_repository("team/app")
    check_manifest_reference("1.0.0-cu128")
    check_manifest_reference(DIGEST)
    for bad in ("../etc", "Team/app", "app/"):
        with pytest.raises(InvalidInputError, match="invalid repository name"):
            check_repository(bad)
    for bad in ("../x", "a/b", "sha256:xyz"):
        with pytest.raises(InvalidInputError):
            check_manifest_reference(bad)
