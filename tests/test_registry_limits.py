"""A command's registry reads are bounded (docs/security.md): a tag list of at most
``DOCKER_VARIANT_REGISTRY_MAX_PAGES`` pages, all reads within ``DOCKER_VARIANT_REGISTRY_TIMEOUT``
seconds, a slow drip included; ``ls`` fails with one line (exit 3), completion offers nothing.
And a malformed index document exits 2 whether it comes from a file or from a registry."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clirun import run_cli
from docker_variant.cli.complete import complete_reference
from fakeupstream import FakeUpstream, Reply, Seen

TAGS = "/v2/app/tags/list"
#: The fake stops linking a next page here, so a client without a cap still ends (and
#: fails the test) instead of hanging it.
SAFETY_PAGES = 300
H200 = {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}}


def _endless(upstream: FakeUpstream) -> list[int]:
    """Serve tag list pages that always link a new next page (up to ``SAFETY_PAGES``);
    the list returned counts the pages served."""
    served: list[int] = []

    def page(seen: Seen) -> Reply:
        served.append(1)
        n = len(served)
        body = json.dumps({"name": "app", "tags": [f"1.0.{n}-a", f"1.0.{n}-b"]}).encode()
        link = {"Link": f'<{TAGS}?n=2&last=1.0.{n}-b>; rel="next"'} if n < SAFETY_PAGES else {}
        return Reply(body=body, headers={"Content-Type": "application/json", **link})

    upstream.routes[TAGS] = page
    return served


def _drip(upstream: FakeUpstream) -> None:
    """A tag list sent a byte at a time: each byte comes well within any per-read time-out."""
    body = json.dumps({"name": "app", "tags": ["1.0.0", "1.0.1", "1.0.2"]}).encode()
    upstream.routes[TAGS] = Reply(body=body, drip_s=0.05)


def _ls(
    upstream: FakeUpstream, tmp_path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    providers = tmp_path / "h200.json"
    providers.write_text(json.dumps(H200))
    ref = f"127.0.0.1:{upstream.port}/app:1.0.0"
    config = tmp_path / "docker"
    config.mkdir(exist_ok=True)
    return run_cli(
        "ls",
        "--providers-file",
        str(providers),
        ref,
        env={"DOCKER_CONFIG": str(config), **env},
        tmp=tmp_path,
    )


def test_ls_stops_at_the_page_cap(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    served = _endless(fake_upstream)
    done = _ls(fake_upstream, tmp_path, {"DOCKER_VARIANT_REGISTRY_MAX_PAGES": "20"})
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"registry 127.0.0.1:{fake_upstream.port}" in done.stderr
    assert "more than 20 pages" in done.stderr
    assert "DOCKER_VARIANT_REGISTRY_MAX_PAGES" in done.stderr
    assert len(served) == 20


def test_ls_deadline_covers_a_drip(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    _drip(fake_upstream)
    done = _ls(fake_upstream, tmp_path, {"DOCKER_VARIANT_REGISTRY_TIMEOUT": "0.5"})
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"registry 127.0.0.1:{fake_upstream.port} not read within 0.5 s" in done.stderr
    assert "DOCKER_VARIANT_REGISTRY_TIMEOUT" in done.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCKER_VARIANT_REGISTRY_TIMEOUT", "0"),
        ("DOCKER_VARIANT_REGISTRY_TIMEOUT", "soon"),
        ("DOCKER_VARIANT_REGISTRY_TIMEOUT", "1e9"),
        ("DOCKER_VARIANT_REGISTRY_MAX_PAGES", "0"),
        ("DOCKER_VARIANT_REGISTRY_MAX_PAGES", "2.5"),
    ],
)
def test_a_bad_limit_is_bad_input(
    fake_upstream: FakeUpstream, tmp_path: Path, name: str, value: str
) -> None:
    done = _ls(fake_upstream, tmp_path, {name: value})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"docker-variant: error: {name}={value!r}: "
        + (
            "expected seconds above 0, such as 60 or 2.5"
            if name.endswith("TIMEOUT")
            else "expected a whole number of pages, 1 or more"
        )
    )
    assert fake_upstream.requests == []  # refused before any request


def _complete_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no credentials of the user's
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_completion_offers_nothing_on_endless_pages(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = _endless(fake_upstream)
    _complete_env(monkeypatch, tmp_path, DOCKER_VARIANT_REGISTRY_MAX_PAGES="5")
    assert complete_reference(f"127.0.0.1:{fake_upstream.port}/app:1.0.") == []
    assert len(served) == 5


def test_completion_deadline_covers_a_drip(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx's read time-out is per read: a byte every 50 ms passes it for ever."""
    _drip(fake_upstream)
    _complete_env(monkeypatch, tmp_path, DOCKER_VARIANT_REGISTRY_TIMEOUT="0.3")
    assert complete_reference(f"127.0.0.1:{fake_upstream.port}/app:1.0.") == []
    assert [seen.path for seen in fake_upstream.requests] == [TAGS]


def test_completion_still_completes_within_its_limits(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = json.dumps({"name": "app", "tags": ["1.0.0", "1.0.1", "2.0.0"]}).encode()
    fake_upstream.routes[TAGS] = Reply(body=body)
    _complete_env(monkeypatch, tmp_path, DOCKER_VARIANT_REGISTRY_MAX_PAGES="1")
    host = f"127.0.0.1:{fake_upstream.port}"
    assert complete_reference(f"{host}/app:1.") == [f"{host}/app:1.0.0", f"{host}/app:1.0.1"]


MALFORMED = [
    pytest.param(b'{"variants": {"null": {}}}', "has no entry in 'images'", id="no-image"),
    pytest.param(b"<html>not json</html>", "JSON", id="not-json"),
    pytest.param(
        json.dumps(
            {
                "variants": {"cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"]}}},
                "images": {"cu128": {"tag": "1.0.0-cu128", "digest": ""}},
                "providers": {"nvidia": {"requires": ["nvidia-variant-provider"], "optional": 1}},
            }
        ).encode(),
        "providers.nvidia.optional: 1 is not true or false",
        id="provider-field",
    ),
]


@pytest.mark.parametrize(("document", "reason"), MALFORMED)
def test_a_malformed_document_exits_2_from_a_file_and_from_a_registry(
    fake_upstream: FakeUpstream, tmp_path: Path, document: bytes, reason: str
) -> None:
    """docs/reference/cli.md: a bad index document is bad input (2), whoever serves it."""
    fake_upstream.routes["/v2/app/_variants/1.0.0"] = Reply(
        body=document, headers={"Content-Type": "application/json"}
    )
    from_registry = _ls(fake_upstream, tmp_path, {})
    index = tmp_path / "index.json"
    index.write_bytes(document)
    from_file = run_cli(
        "ls", "--providers-file", str(tmp_path / "h200.json"), "--index", str(index)
    )
    for done in (from_registry, from_file):
        assert done.returncode == 2, done.stderr
        assert reason in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
