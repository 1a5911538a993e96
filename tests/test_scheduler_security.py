"""The scheduler as an attacker and a careless user would meet it (issue 11): tokens and
roles, bodies over the limit, SSRF, loopback-only without tokens, mutual TLS."""

from __future__ import annotations

import hashlib
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from docker_variant.scheduler.tokens import Principal, TokenTable, load_tokens
from fakeupstream import FakeUpstream
from proxyrunner import eventually
from test_scheduler_api import client_for, open_store
from test_scheduler_support import H200_R570, INDEX, agent_body
from tlsca import CertificateAuthority

TOKENS = {
    "agent0": "agent-zero-secret-0000",
    "agent1": "agent-one-secret-11111",
    "alice": "client-alice-secret-aa",
    "bob": "client-bob-secret-bbbbb",
    "ops": "admin-ops-secret-zzzzzz",
}
TOKENS_TOML = f"""
[[token]]
role = "agent"
agent_id = "h200-0"
token = "{TOKENS["agent0"]}"

[[token]]
role = "agent"
agent_id = "h200-1"
sha256 = "{hashlib.sha256(TOKENS["agent1"].encode()).hexdigest()}"

[[token]]
role = "client"
name = "alice"
token = "{TOKENS["alice"]}"

[[token]]
role = "client"
name = "bob"
token = "{TOKENS["bob"]}"

[[token]]
role = "admin"
name = "ops"
token = "{TOKENS["ops"]}"
"""


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS_TOML)
    return path


@pytest.fixture
def secured(tokens_file: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        open_store("sqlite", tmp_path) as store,
        client_for(store, tokens=load_tokens(tokens_file)) as api,
    ):
        yield api


def _place(api: httpx.Client, who: str) -> httpx.Response:
    body = {"index": INDEX, "nodes": 1, "devices_per_node": 1}
    return api.post("/v1/placements", json=body, headers=bearer(who))


def test_no_token_or_a_wrong_one_is_401_with_a_challenge(secured: httpx.Client) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer not-a-token-at-all"},
        {"Authorization": "Basic eDp5"},
    ):
        for method, path in [("GET", "/v1/agents"), ("PUT", "/v1/agents/h200-0"),
                             ("POST", "/v1/placements"), ("GET", "/v1/placements"),
                             ("DELETE", "/v1/agents/h200-0")]:  # fmt: skip
            answer = secured.request(method, path, headers=headers, json={})
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.headers["www-authenticate"].startswith('Bearer realm="variant-scheduler"')
            assert answer.json()["errors"][0]["code"] == "UNAUTHORIZED"
    wrong = secured.get("/v1/agents", headers={"Authorization": "Bearer not-a-token-at-all"})
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


def test_a_rogue_cannot_overwrite_an_agents_report(secured: httpx.Client) -> None:
    own = secured.put("/v1/agents/h200-0", json=agent_body(H200_R570, 8), headers=bearer("agent0"))
    assert own.status_code == 200, own.text
    for rogue in ("agent1", "alice"):  # another agent, a client
        empty = secured.put("/v1/agents/h200-0", json={"devices": {}}, headers=bearer(rogue))
        assert empty.status_code == 403, empty.text
    # a fake agent without any token is refused, and the real one keeps its 8 GPUs
    fake = secured.put("/v1/agents/fake-64", json=agent_body(H200_R570, 64))
    assert fake.status_code == 401
    agents = secured.get("/v1/agents", headers=bearer("alice")).json()["agents"]
    assert [a["agent_id"] for a in agents] == ["h200-0"]
    assert len(agents[0]["devices"]["cuda"]["free"]) == 8


def test_clients_see_and_delete_only_their_own_placements(secured: httpx.Client) -> None:
    secured.put("/v1/agents/h200-0", json=agent_body(H200_R570, 8), headers=bearer("agent0"))
    mine = _place(secured, "alice")
    assert mine.status_code == 201, mine.text
    assert mine.json()["owner"] == "alice"
    theirs = _place(secured, "bob").json()
    assert _place(secured, "agent0").status_code == 403  # an agent does not place
    pid = mine.json()["id"]
    assert secured.get(f"/v1/placements/{pid}", headers=bearer("bob")).status_code == 403
    assert secured.delete(f"/v1/placements/{pid}", headers=bearer("bob")).status_code == 403
    listed = secured.get("/v1/placements", headers=bearer("bob")).json()["placements"]
    assert [(p["id"], p["owner"]) for p in listed] == [(theirs["id"], "bob")]
    everything = secured.get("/v1/placements", headers=bearer("ops")).json()["placements"]
    assert {p["owner"] for p in everything} == {"alice", "bob"}
    assert secured.delete(f"/v1/placements/{pid}", headers=bearer("alice")).status_code == 204


def test_an_agents_view_names_only_the_callers_own_placements(secured: httpx.Client) -> None:
    secured.put("/v1/agents/h200-0", json=agent_body(H200_R570, 8), headers=bearer("agent0"))
    alice, bob = (_place(secured, who).json()["id"] for who in ("alice", "bob"))

    def shown(who: str) -> list[str]:
        answer = secured.get("/v1/agents/h200-0", headers=bearer(who))
        assert answer.status_code == 200, answer.text
        placements: list[str] = answer.json()["placements"]
        return placements

    assert shown("alice") == [alice]
    assert shown("bob") == [bob]
    assert shown("agent0") == []  # an agent makes no placement: it sees none
    assert shown("ops") == sorted([alice, bob])  # an admin sees every one


def test_only_an_admin_drains_and_deregisters_an_agent(secured: httpx.Client) -> None:
    secured.put("/v1/agents/h200-0", json=agent_body(H200_R570, 8), headers=bearer("agent0"))
    placed = _place(secured, "alice").json()
    for who in ("alice", "agent0"):
        assert secured.delete("/v1/agents/h200-0", headers=bearer(who)).status_code == 403
    drained = secured.delete("/v1/agents/h200-0", headers=bearer("ops"))
    assert drained.status_code == 200, drained.text
    assert drained.json() == {"agent_id": "h200-0", "placements_deleted": [placed["id"]]}
    assert secured.get("/v1/agents", headers=bearer("ops")).json()["agents"] == []
    assert secured.get(f"/v1/placements/{placed['id']}", headers=bearer("ops")).status_code == 404
    assert secured.delete("/v1/agents/h200-0", headers=bearer("ops")).status_code == 404


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[token]]\nrole = 'root'\nname = 'x'\ntoken = 'a-long-enough-token'\n", "role 'root'"),
        ("[[token]]\nrole = 'client'\ntoken = 'a-long-enough-token'\n", "needs a name"),
        ("[[token]]\nrole = 'client'\nname = 'x'\ntoken = ''\n", "non-empty string"),
        ("[[token]]\nrole = 'agent'\nname = 'x'\nsha256 = 'abc'\n", "sha256 must be"),
        ("nothing = 1\n", "no [[token]] entries"),
        ("not toml [", "not valid TOML"),
        ("a = " + "[" * 100_000 + "]" * 100_000, "nested more than 32 levels"),
        ("a = 1" + "0" * 5_000, "a number of more than"),
        (
            "[[token]]\nrole = 'agent'\nagent_id = 'ci'\ntoken = 'a-long-enough-token-1'\n"
            "[[token]]\nrole = 'client'\nname = 'ci'\ntoken = 'a-long-enough-token-2'\n",
            "name 'ci' is both an agent's (token[1]) and a client's (token[2])",
        ),
        (
            "[[token]]\nrole = 'client'\nname = 'ops'\ntoken = 'a-long-enough-token-1'\n"
            "[[token]]\nrole = 'admin'\nname = 'ops'\ntoken = 'a-long-enough-token-2'\n",
            "name 'ops' is both a client's (token[1]) and an admin's (token[2])",
        ),
    ],
)
def test_a_bad_tokens_file_is_exit_2_naming_it(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    done = _serve(tmp_path, "--tokens", str(path))
    assert done.returncode == 2
    assert expected in done.stderr and done.stderr.count("\n") == 1
    assert str(path) in done.stderr


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "docker_variant.scheduler", "serve",
            "--db", f"sqlite:///{tmp_path / 'db.sqlite'}", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_without_tokens_it_serves_loopback_only(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--listen", "0.0.0.0:0")
    assert done.returncode == 2
    assert "without --tokens the scheduler serves loopback only" in done.stderr


def test_with_tokens_it_may_listen_beyond_loopback(tmp_path: Path, tokens_file: Path) -> None:
    service = devstack.start_scheduler(
        tmp_path / "s", extra=["--tokens", str(tokens_file)], host="0.0.0.0"
    )
    try:
        assert httpx.get(f"{service.url}/v1/agents").status_code == 401
        health = httpx.get(f"{service.url}/healthz")
        assert health.json() == {"status": "ok"}  # no database URL for anonymous callers
        log = service.log_tail(100_000)
        assert not any(token in log for token in TOKENS.values())  # never logged
    finally:
        service.stop()


def test_a_short_token_serves_with_a_warning(tmp_path: Path) -> None:
    """How strong a token must be is the operator's call: a short literal one is taken,
    and the server says at start that it is easy to guess (without the token)."""
    path = tmp_path / "tokens.toml"
    path.write_text("[[token]]\nrole = 'client'\nname = 'ci'\ntoken = 's3cret'\n")
    service = devstack.start_scheduler(tmp_path / "s", extra=["--tokens", str(path)])
    try:
        assert httpx.get(f"{service.url}/v1/agents").status_code == 401
        found = httpx.get(f"{service.url}/v1/agents", headers={"Authorization": "Bearer s3cret"})
        assert found.status_code == 200, found.text
        log = service.log_tail(100_000)
        assert "warning: tokens file" in log and "token[1] has fewer than 16 characters" in log
        assert "s3cret" not in log
    finally:
        service.stop()


def _agent_tokens(*entries: tuple[str, str]) -> str:
    return "".join(
        f'[[token]]\nrole = "agent"\nagent_id = "{a}"\ntoken = "{t}"\n' for a, t in entries
    )


def test_the_tokens_file_is_read_again_on_change_and_on_sighup(tmp_path: Path) -> None:
    """A new node's token works without a restart: when the file changes (a Secret volume
    swaps it), or on SIGHUP when nothing the file system shows changed. A file that no
    longer loads keeps the tokens in force, with the reason logged."""
    path = tmp_path / "tokens.toml"
    a, b, c = (("node-a", "a" * 24), ("node-b", "b" * 24), ("node-c", "c" * 24))
    path.write_text(_agent_tokens(a))
    service = devstack.start_scheduler(tmp_path / "s", extra=["--tokens", str(path)])

    def status(agent: tuple[str, str]) -> int:
        url = f"{service.url}/v1/agents/{agent[0]}"
        body = agent_body(H200_R570, 1)
        return httpx.put(
            url, json=body, headers={"Authorization": f"Bearer {agent[1]}"}
        ).status_code

    try:
        assert (status(a), status(b)) == (200, 401)
        path.write_text(_agent_tokens(a, b))  # changed: seen at the next request
        assert (status(a), status(b)) == (200, 200)

        # node-c takes node-b's place in a file of the same size and time: only SIGHUP tells
        before = path.stat()
        with path.open("r+") as same:
            same.write(_agent_tokens(a, c))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_mtime_ns == before.st_mtime_ns
        assert status(c) == 401
        os.kill(service.process.pid, signal.SIGHUP)
        eventually(lambda: status(c) == 200, 30, "node-c's token taken after SIGHUP")
        assert status(b) == 401

        path.write_text("[[token]]\nrole = 'agent'\n")  # broken: node-c's token stays
        assert status(c) == 200
        log = service.log_tail(100_000)
        assert "tokens not reloaded, the previous ones stay in force" in log
        assert "c" * 24 not in log
    finally:
        service.stop()


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_200_mb_body_is_refused_without_being_buffered(tmp_path: Path) -> None:
    service = devstack.start_scheduler(tmp_path / "big")
    try:

        def chunks() -> Iterator[bytes]:
            block = b" " * (1 << 20)
            for _ in range(200):
                yield block

        with httpx.Client(timeout=60) as client:
            streamed = client.put(f"{service.url}/v1/agents/big", content=chunks())
            assert streamed.status_code == 413, streamed.text
            assert "16777216 bytes" in streamed.json()["errors"][0]["message"]
            big = b" " * (200 << 20)
            sized = client.put(f"{service.url}/v1/agents/big", content=big)
            del big
            assert sized.status_code == 413
            assert "209715200 bytes is over" in sized.json()["errors"][0]["message"]
        peak = _peak_rss_kib(service.process.pid)
        assert peak < 100 * 1024, f"peak RSS {peak} KiB"
    finally:
        service.stop()


def test_an_image_on_an_unlisted_registry_is_never_fetched(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    target = f"127.0.0.1:{fake_upstream.port}"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    with open_store("sqlite", tmp_path) as store:
        for registries in (None, ["registry.internal:5000"]):
            # an exposed scheduler (with tokens): nothing but its allow-list
            with client_for(store, registries=registries, tokens=load_tokens(tokens)) as api:
                body = {"image": f"{target}/x:1", "nodes": 1, "devices_per_node": 0}
                answer = api.post("/v1/placements", json=body, headers=bearer("alice"))
            assert answer.status_code == 400, answer.text
            message = answer.json()["errors"][0]["message"]
            assert f"'{target}/x:1'" in message
            if registries:
                assert f"registry '{target}' is not one this scheduler may contact" in message
            else:
                assert 'send {"index": ...} instead' in message
    assert fake_upstream.requests == []  # not one connection to the named host
    # an allow-list binds a loopback-only scheduler (no tokens) too
    (tmp_path / "2").mkdir()
    with (
        open_store("sqlite", tmp_path / "2") as store,
        client_for(store, registries=["registry.internal:5000"]) as api,
    ):
        body = {"image": f"{target}/x:1", "nodes": 1, "devices_per_node": 0}
        assert api.post("/v1/placements", json=body).status_code == 400
    assert fake_upstream.requests == []


def test_an_agent_heartbeat_over_mutual_tls(tmp_path: Path, tokens_file: Path) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    server, agent = ca.server(), ca.client()
    service = devstack.start_scheduler(
        tmp_path / "tls",
        extra=["--tokens", str(tokens_file), "--tls-cert", str(server.cert),
               "--tls-key", str(server.key), "--tls-client-ca", str(ca.ca)],
        scheme="https",
    )  # fmt: skip
    try:
        trusted = ssl.create_default_context(cafile=str(ca.ca))
        with_cert = ssl.create_default_context(cafile=str(ca.ca))
        with_cert.load_cert_chain(str(agent.cert), str(agent.key))
        with httpx.Client(verify=with_cert) as client:
            beat = client.put(
                f"{service.url}/v1/agents/h200-0",
                json=agent_body(H200_R570, 8),
                headers=bearer("agent0"),
            )
            assert beat.status_code == 200, beat.text
        with pytest.raises(httpx.TransportError), httpx.Client(verify=trusted) as client:
            client.get(f"{service.url}/v1/agents", headers=bearer("ops"))  # no client cert
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://{service.address}/v1/agents")  # no TLS at all
    finally:
        service.stop()


def test_bad_tls_arguments_are_exit_2(tmp_path: Path, tokens_file: Path) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.server()
    cases = [
        (["--tls-cert", str(server.cert)], "--tls-cert and --tls-key go together"),
        (["--tls-cert", str(server.cert), "--tls-key", str(tmp_path / "none.key")], "--tls-key"),
        (["--tls-client-ca", str(ca.ca)], "needs --tls-cert"),
    ]
    for args, expected in cases:
        done = _serve(tmp_path, "--tokens", str(tokens_file), *args)
        assert done.returncode == 2 and expected in done.stderr, done.stderr


def test_several_tokens_of_one_client_are_one_owner(tmp_path: Path) -> None:
    """A name clash is between roles; two tokens of one client (a rotation) are one owner."""
    path = tmp_path / "tokens.toml"
    path.write_text(
        "[[token]]\nrole = 'client'\nname = 'ci'\ntoken = 'a-long-enough-token-1'\n"
        "[[token]]\nrole = 'client'\nname = 'ci'\ntoken = 'a-long-enough-token-2'\n"
    )
    table = load_tokens(path)
    assert table.find("a-long-enough-token-1") == table.find("a-long-enough-token-2")


def test_an_agent_never_sees_a_clients_placements_even_of_its_own_name(tmp_path: Path) -> None:
    """A table built without the load-time check: agent 'alice' and client 'alice'. The
    agent owns nothing, so it lists, reads and deletes none of the client's placements."""
    digest = hashlib.sha256
    table = TokenTable(
        [
            (digest(TOKENS["agent0"].encode()).digest(), Principal("agent", "alice", "alice")),
            (digest(TOKENS["alice"].encode()).digest(), Principal("client", "alice")),
        ]
    )
    with open_store("sqlite", tmp_path) as store, client_for(store, tokens=table) as api:
        beat = api.put("/v1/agents/alice", json=agent_body(H200_R570, 8), headers=bearer("agent0"))
        assert beat.status_code == 200, beat.text
        placed = _place(api, "alice")
        assert placed.status_code == 201, placed.text
        pid = placed.json()["id"]
        view = api.get("/v1/agents/alice", headers=bearer("agent0")).json()
        assert view["placements"] == []
        assert api.get("/v1/agents/alice", headers=bearer("alice")).json()["placements"] == [pid]
        for method, path in [("GET", "/v1/placements"), ("GET", f"/v1/placements/{pid}"),
                             ("DELETE", f"/v1/placements/{pid}")]:  # fmt: skip
            answer = api.request(method, path, headers=bearer("agent0"))
            assert answer.status_code == 403, (method, path, answer.text)


def test_a_client_at_its_quota_is_429_and_another_client_is_not(
    tokens_file: Path, tmp_path: Path
) -> None:
    with (
        open_store("sqlite", tmp_path, max_placements=2) as store,
        client_for(store, tokens=load_tokens(tokens_file)) as api,
    ):
        api.put("/v1/agents/h200-0", json=agent_body(None), headers=bearer("agent0"))

        def host_only(who: str) -> httpx.Response:
            body = {"index": INDEX, "nodes": 1, "devices_per_node": 0}
            return api.post("/v1/placements", json=body, headers=bearer(who))

        first, _ = (host_only("alice") for _ in range(2))
        assert first.status_code == 201, first.text
        over = host_only("alice")
        assert over.status_code == 429, over.text
        [error] = over.json()["errors"]
        assert error["code"] == "TOOMANYREQUESTS"
        assert error["message"] == (
            "client 'alice' keeps 2 placements, the most one client may keep "
            "(--max-placements 2); delete one first"
        )
        assert host_only("bob").status_code == 201
        gone = api.delete(f"/v1/placements/{first.json()['id']}", headers=bearer("alice"))
        assert gone.status_code == 204
        assert host_only("alice").status_code == 201
        metrics = api.get("/metrics", headers=bearer("ops")).text
        assert 'operation="place",outcome="denied"} 1.0' in metrics


def test_the_quota_and_request_bound_are_serve_options(tmp_path: Path) -> None:
    for args, expected in [
        (["--max-placements", "-1"], "--max-placements: must be an integer >= 0, got '-1'"),
        (["--max-placement-request", "64k"], "--max-placement-request: must be an integer"),
    ]:
        done = _serve(tmp_path, *args)
        assert done.returncode == 2 and expected in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1
    service = devstack.start_scheduler(tmp_path / "s", extra=["--max-placements", "1"])
    try:
        httpx.put(f"{service.url}/v1/agents/cpu", json=agent_body(None)).raise_for_status()
        body = {"index": INDEX, "nodes": 1, "devices_per_node": 0}
        codes = [httpx.post(f"{service.url}/v1/placements", json=body).status_code for _ in "ab"]
        assert codes == [201, 429]
    finally:
        service.stop()
