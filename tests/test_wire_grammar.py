"""The one wire grammar (``oci.grammar``): linear-time patterns, lengths checked first, the
same answers as distribution's grammar, and every entry point (reference parsing, the
proxy's routes, the scheduler's image names, the command line) going through it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docker_variant.errors import InvalidInputError
from docker_variant.oci import grammar
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.reference import check_repository, parse_reference
from docker_variant.proxy.names import PathError, parse_v2_path

# Names that make a backtracking matcher of distribution's pattern (``[-]*`` inside a
# repeated group) take time exponential in their length: letters, then a character that
# makes the whole match fail at the very end.
PATHOLOGICAL = "a" * 10_000 + "!"
WITHIN_LIMIT = ["a" * 200 + "!", "a-" * 100 + "!", "a_" * 100 + "A", "a." * 120 + "-"]

# distribution's own pattern, as it was written here before (exponential in Python's re):
# used only on short strings, to check that the linear patterns accept the same language.
_OLD_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*"
_OLD_NAME = re.compile(rf"{_OLD_COMPONENT}(?:/{_OLD_COMPONENT})*")
_OLD_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_OLD_DOMAIN = re.compile(
    rf"(?:{_OLD_DOMAIN_COMPONENT}(?:\.{_OLD_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
)


def _repeats(parsed: Any) -> list[tuple[str, Any]]:
    """Every repetition node of a parsed pattern (``re._parser``), nested ones included."""
    found: list[tuple[str, Any]] = []
    for op, arg in parsed:
        name = str(op)
        if name.endswith("REPEAT"):
            found.append((name, arg))
            found += _repeats(arg[2])
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            found += _repeats(arg[-1])
        elif name == "BRANCH":
            for branch in arg[1]:
                found += _repeats(branch)
    return found


@pytest.mark.parametrize("pattern", grammar.PATTERNS, ids=lambda p: p.pattern[:40])
def test_every_repetition_is_possessive(pattern: re.Pattern[str]) -> None:
    """The bound by construction: a possessive repetition never gives back what it took,
    so the matcher cannot try the exponentially many ways to split a run of letters."""
    parser: Any = getattr(re, "_parser")  # noqa: B009 - the stdlib's pattern parser
    repeats = _repeats(parser.parse(pattern.pattern, pattern.flags))
    assert repeats, "a pattern without repetition needs no entry here"
    assert [kind for kind, _ in repeats if kind != "POSSESSIVE_REPEAT"] == []


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ab0._-/A", max_size=14))
def test_names_are_distribution_s_grammar(text: str) -> None:
    ok = grammar.name_problem(text) is None
    assert ok == (bool(_OLD_NAME.fullmatch(text)) and len(text) <= grammar.NAME_MAX)


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="aB0-.:[]9", max_size=14))
def test_registry_hosts_are_distribution_s_grammar(text: str) -> None:
    problem = grammar.domain_problem(text)
    if _OLD_DOMAIN.fullmatch(text) is None:
        assert problem is not None
    else:  # the pattern matches; a port outside 1-65535 is still refused
        port = text.rpartition("]")[2].rpartition(":")[2] if ":" in text else ""
        assert (problem is None) == (not port or 1 <= int(port) <= 65535)


def test_lengths_come_before_any_pattern() -> None:
    assert "longer than 255" in str(grammar.name_problem(PATHOLOGICAL))
    assert "does not match" in str(grammar.tag_problem("1" * 10_000))
    assert "longer than" in str(grammar.digest_problem("sha256:" + "a" * 10_000))
    assert "longer than" in str(grammar.digest_problem("a" * 10_000, strict=False))
    assert "not a valid host" in str(grammar.domain_problem("a" * 10_000 + "."))
    assert "is not host" in str(grammar.registry_problem("a" * 10_000 + "!"))
    # a port of thousands of digits is refused on its length, not by int()'s digit limit
    assert "port" in str(grammar.domain_problem("r.example:" + "9" * 5000))
    assert grammar.registry_problem("r.example:" + "9" * 5000) is not None


@pytest.mark.parametrize("name", [PATHOLOGICAL, *WITHIN_LIMIT])
def test_reference_parsing_refuses_pathological_names(name: str) -> None:
    with pytest.raises(InvalidInputError, match="invalid image reference") as caught:
        parse_reference(f"r.example/{name}:1")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 1000
    with pytest.raises(InvalidInputError, match="invalid repository name"):
        check_repository(name)


@pytest.mark.parametrize("name", [PATHOLOGICAL, *WITHIN_LIMIT])
def test_proxy_routes_refuse_pathological_names(name: str) -> None:
    with pytest.raises(PathError) as caught:
        parse_v2_path(f"/v2/{name}/manifests/x")
    assert caught.value.code is ErrorCode.NAME_INVALID and caught.value.code.status == 400
    assert len(caught.value.message) < 1000


@pytest.mark.parametrize(
    "digest",
    ["sha256:zz", "sha256:" + "A" * 64, "sha256:" + "a" * 63, "sha512:" + "a" * 64],
)
def test_registered_algorithms_need_their_hex_length(digest: str) -> None:
    assert grammar.digest_problem(digest) is not None
    assert grammar.digest_problem(digest, strict=False) is not None
    with pytest.raises(PathError) as caught:
        parse_v2_path(f"/v2/app/blobs/{digest}")
    assert caught.value.code == "DIGEST_INVALID"


def test_other_algorithms_follow_the_image_spec() -> None:
    assert grammar.digest_problem("sha256:" + "a" * 64) is None
    assert grammar.digest_problem("sha512:" + "0" * 128, strict=False) is None
    assert grammar.digest_problem("multihash+base58:QmRZxt2b1FVZPNqd8hsiykDL3TdBDeTSPX9Kv46HmX4Gx8", strict=False) is None  # fmt: skip
    assert grammar.digest_problem("blake3:" + "a" * 64, strict=False) is None


def test_the_grammar_loads_no_httpx() -> None:
    """``oci.grammar`` and ``oci.reference`` are pure: importing them starts no client."""
    code = (
        "import sys, docker_variant.oci.reference, docker_variant.oci.grammar;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'httpcore')))"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
    imported = [line.rpartition("|")[2].strip() for line in done.stderr.splitlines()]
    assert "docker_variant.oci.reference" in imported
    assert not [m for m in imported if m.startswith(("httpx", "httpcore"))]


# ------------------------------------------------------------------------ entry points


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "docker_variant", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", [PATHOLOGICAL, WITHIN_LIMIT[1]])
def test_cli_inspect_refuses_a_pathological_name_in_one_line(name: str) -> None:
    done = _cli("inspect", f"127.0.0.1:9/{name}:1")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid image reference" in lines[0]
    assert "Traceback" not in done.stderr


def test_cli_index_refuses_a_digest_that_is_not_sha256_hex(tmp_path: Path) -> None:
    index = {
        "variants": {"null": {}},
        "images": {"null": {"tag": "1.0.0-null", "digest": "sha256:zz"}},
    }
    path = tmp_path / "index.json"
    path.write_text(json.dumps(index))
    done = _cli("resolve", "--index", str(path))
    assert done.returncode == 2, done.stderr
    assert "sha256:zz" in done.stderr and "64 lowercase hex" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_proxy_answers_a_pathological_name_400() -> None:
    from fakeupstream import FakeUpstream
    from proxyrunner import ProxyServer

    upstream = FakeUpstream().start()
    try:
        with ProxyServer(upstream.url) as proxy:
            for name in (PATHOLOGICAL, "a" * 25 + "!", WITHIN_LIMIT[0]):
                answer = httpx.get(f"{proxy.url}/v2/{name}/manifests/x", timeout=30)
                assert answer.status_code == 400
                assert answer.json()["errors"][0]["code"] == "NAME_INVALID"
        assert upstream.requests == []  # nothing invalid goes upstream
    finally:
        upstream.stop()


def test_scheduler_refuses_a_pathological_image_400(tmp_path: Path) -> None:
    from test_scheduler_support import SchedulerServer, open_store

    with (
        open_store("sqlite", tmp_path) as store,
        SchedulerServer(store, None, registries=["r.example"]) as server,
    ):
        for name in (PATHOLOGICAL, WITHIN_LIMIT[1]):
            answer = httpx.post(
                f"{server.url}/v1/placements",
                json={"image": f"r.example/{name}:1", "nodes": 1, "devices_per_node": 1},
                timeout=30,
            )
            assert answer.status_code == 400, answer.text
            message = answer.json()["errors"][0]["message"]
            assert "invalid image reference" in message and len(message) <= 300
