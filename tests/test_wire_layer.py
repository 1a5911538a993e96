"""The rest of the wire layer: one OCI error registry (writer and a reader that never
raises), JSON read with bounds, and one HTTP client factory (trust, User-Agent) that every
client uses."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docker_variant import __version__
from docker_variant.docker.engine import Engine, EngineError
from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import load_json, read_json_stream
from docker_variant.oci.auth import Credentials, RegistryAuth
from docker_variant.oci.client import RegistryClient
from docker_variant.oci.errcode import ERROR_BODY_LIMIT, ErrorCode, error_body, read_error
from docker_variant.oci.errors import BadUpstreamResponseError
from docker_variant.oci.http import USER_AGENT, sync_client, system_tls
from fakeupstream import FakeUpstream, Reply, Seen

SRC = Path(__file__).resolve().parents[1] / "src" / "docker_variant"

# --------------------------------------------------------------------------- errcode


def test_the_error_body_is_the_distribution_shape_on_one_line() -> None:
    body = json.loads(error_body(ErrorCode.NAME_INVALID, "bad\nname", {"name": "x"}))
    assert body == {
        "errors": [{"code": "NAME_INVALID", "message": "bad name", "detail": {"name": "x"}}]
    }
    assert ErrorCode.NAME_INVALID.status == 400 and ErrorCode.UNAUTHORIZED.status == 401
    assert all(isinstance(code.status, int) for code in ErrorCode)


def test_the_reader_reads_what_the_writer_wrote() -> None:
    found = read_error(error_body(ErrorCode.DENIED, "no", None))
    assert found is not None and (found.code, found.message) == ("DENIED", "no")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>502</html>",
        b"\xff\xfe",
        b"[" * 100_000,
        b'{"errors": "x"}',
        b'{"errors": []}',
        b'{"errors": [1]}',
        b'{"errors": [{"code": 1, "message": ["x"]}]}',
        b'{"errors": [{"code": "X"}]}' + b" " * ERROR_BODY_LIMIT,
        b"1e99999",
    ],
)
def test_the_reader_never_raises(body: bytes) -> None:
    found = read_error(body)
    assert found is None or (found.code is None and found.message is None)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_the_reader_never_raises_on_any_bytes(body: bytes) -> None:
    read_error(body)


def test_no_error_code_is_written_as_a_string_literal_outside_the_registry() -> None:
    literal = re.compile(r'"(' + "|".join(code.value for code in ErrorCode) + r')"')
    found = [
        f"{path.relative_to(SRC)}:{number}"
        for path in SRC.rglob("*.py")
        if path.name != "errcode.py"
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if literal.search(line)
    ]
    assert found == []


def test_every_error_body_reader_is_the_registry_s() -> None:
    """Nobody indexes ``["errors"][0]`` by hand."""
    found = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if '["errors"][0]' in path.read_text("utf-8")
    ]
    assert found == []


# --------------------------------------------------------------------------- jsondoc


def test_every_json_document_goes_through_jsondoc() -> None:
    found = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "jsondoc.py" and "json.loads(" in path.read_text("utf-8")
    ]
    assert found == []


def test_documents_over_their_bound_are_refused_before_parsing() -> None:
    with pytest.raises(InvalidInputError, match="larger than the 10 bytes"):
        load_json(b"[" + b"1," * 10 + b"1]", "doc", max_bytes=10)
    assert load_json(b"[1, 2]", "doc", max_bytes=10) == [1, 2]


def test_a_stream_is_read_no_further_than_its_bound() -> None:
    stream = io.BytesIO(b"[" + b" " * (1 << 20) + b"]")
    with pytest.raises(InvalidInputError, match="larger than 1000 bytes"):
        read_json_stream(stream, "doc", max_bytes=1000)
    assert stream.tell() == 1001


def test_json_is_strict_utf8() -> None:
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        load_json(b'{"a": "\xe9"}', "doc")


# --------------------------------------------------------------------------- http factory


def test_the_factory_s_clients_share_one_trust_store_and_user_agent() -> None:
    assert f"docker-variant/{__version__}" == USER_AGENT
    with sync_client() as client:
        assert client.headers["user-agent"] == USER_AGENT
    assert system_tls() is system_tls()


def test_every_client_is_made_by_the_factory() -> None:
    """Nothing outside ``oci/http.py`` builds its own httpx client, transport or SSL context."""
    construction = re.compile(
        r"httpx\.(?:Async)?(?:Client|HTTPTransport)\(|httpx\.(?:get|post|put|stream)\("
        r"|ssl\.create_default_context\("
    )
    found = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "http.py" and construction.search(path.read_text("utf-8"))
    ]
    assert found == []


def test_registry_and_token_requests_say_the_user_agent(fake_upstream: FakeUpstream) -> None:
    realm = f"{fake_upstream.url}/token"
    challenge = f'Bearer realm="{realm}",service="fake",scope="repository:app:pull"'

    def tags(seen: Seen) -> Reply:
        if seen.headers.get("authorization") != "Bearer t":
            return Reply(401, b"{}", {"WWW-Authenticate": challenge})
        return Reply(body=b'{"name": "app", "tags": ["1"]}')

    fake_upstream.routes["/v2/app/tags/list"] = tags
    fake_upstream.routes["/token"] = Reply(body=b'{"token": "t"}')

    async def go() -> list[str]:
        async with RegistryClient(fake_upstream.url, auth=RegistryAuth()) as client:
            tags: list[str] = await client.list_tags("app")
            return tags

    assert asyncio.run(go()) == ["1"]
    assert {r.headers.get("user-agent") for r in fake_upstream.requests} == {USER_AGENT}


def test_a_token_answer_is_read_with_a_bound(fake_upstream: FakeUpstream) -> None:
    realm = f"{fake_upstream.url}/token"
    fake_upstream.routes["/v2/app/tags/list"] = Reply(
        401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}"'}
    )
    fake_upstream.routes["/token"] = Reply(
        body=b'{"token": "' + b"t" * (2 << 20) + b'"}', chunked=True
    )

    async def go() -> Any:
        auth = RegistryAuth(Credentials("u", "p"))
        async with RegistryClient(fake_upstream.url, auth=auth) as client:
            return await client.list_tags("app")

    with pytest.raises(BadUpstreamResponseError, match="more than the 1048576 bytes"):
        asyncio.run(go())


@pytest.mark.parametrize(
    ("stream", "needle"),
    [
        (b'{"status": "pulling"}\n' + b"x" * (2 << 20), "progress line of more than"),
        (b"[" * 100_000 + b"\n", "malformed progress line"),
        (b'{"status": "ok"}\n{"error": ""}\n', "pull r.example/app:1: failed"),
    ],
)
def test_the_engine_s_progress_stream_is_read_with_bounds(
    fake_upstream: FakeUpstream, stream: bytes, needle: str
) -> None:
    fake_upstream.routes["/images/create"] = Reply(body=stream, chunked=True)
    events: list[dict[str, Any]] = []
    with (
        Engine(f"tcp://127.0.0.1:{fake_upstream.port}") as engine,
        pytest.raises(EngineError, match=needle) as caught,
    ):
        engine.pull("r.example/app", "1", "r.example", events.append)
    assert "\n" not in str(caught.value)


def test_the_engine_client_says_the_user_agent(fake_upstream: FakeUpstream) -> None:
    fake_upstream.routes["/_ping"] = Reply(body=b"OK")
    with Engine(f"tcp://127.0.0.1:{fake_upstream.port}") as engine:
        engine.ping()
    assert fake_upstream.requests[0].headers["user-agent"] == USER_AGENT


def test_the_proxy_says_the_user_agent_upstream(fake_upstream: FakeUpstream) -> None:
    from proxyrunner import ProxyServer

    fake_upstream.routes["/v2/"] = Reply(body=b"{}")
    with ProxyServer(fake_upstream.url) as proxy:
        transport = httpx.HTTPTransport()
        request = httpx.Request("GET", f"{proxy.url}/v2/", headers={"user-agent": ""})
        del request.headers["user-agent"]
        with transport:
            transport.handle_request(request).read()
    assert fake_upstream.requests[-1].headers["user-agent"] == USER_AGENT
