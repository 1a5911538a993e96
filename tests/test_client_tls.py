"""Trust as docker and curl give it: ``--ca-file``, ``--client-cert``/``--client-key`` and
Docker's ``certs.d``, for the agent and ``what-if`` (a scheduler with a private CA, and with
mutual TLS) and for the CLI's registry commands (a TLS registry)."""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from clirun import cli_env, run_cli, run_in_process
from docker_variant.oci.http import TLSFiles, use_tls
from docker_variant.scheduler.__main__ import main
from imaging import push_raw_image
from tlsca import CertificateAuthority, Pair

HOSTS = Path(__file__).resolve().parent.parent / "examples" / "hosts"
AGENT_TOKEN = "agent-token-for-h200-0"
ADMIN_TOKEN = "admin-token-of-ops-0123"
TOKENS = f"""
[[token]]
role = "agent"
agent_id = "h200-0"
token = "{AGENT_TOKEN}"

[[token]]
role = "admin"
name = "ops"
token = "{ADMIN_TOKEN}"
"""
LINE_WAIT_S = 60  # for a log line the agent writes within its first heartbeats


@pytest.fixture(autouse=True)
def no_tls_left_behind() -> Iterator[None]:
    """A command run in this process sets its TLS files for the process: not for the next."""
    yield
    use_tls(TLSFiles())


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path / "ca", name="private test CA")


def _scheduler(tmp_path: Path, ca: CertificateAuthority, *more: str) -> devstack.Service:
    server = ca.server()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    return devstack.start_scheduler(
        tmp_path / "scheduler",
        extra=["--tokens", str(tokens), "--tls-cert", str(server.cert),
               "--tls-key", str(server.key), *more],
        scheme="https",
    )  # fmt: skip


class AgentProcess:
    """``variant-scheduler agent`` in a subprocess, its log lines read as they come."""

    def __init__(self, tmp_path: Path, scheduler: str, *more: str) -> None:
        token = tmp_path / "agent.token"
        token.write_text(AGENT_TOKEN)
        argv = [sys.executable, "-m", "docker_variant.scheduler", "agent",
                "--scheduler", scheduler, "--token-file", str(token), "--agent-id", "h200-0",
                "--providers-file", str(HOSTS / "h200-r570.json"), "--interval", "1", *more]  # fmt: skip
        env = {k: v for k, v in cli_env().items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")  # the agent exited

    def await_line(self, *words: str) -> str:
        """The first log line that holds every one of ``words``."""
        while True:
            try:
                line = self.lines.get(timeout=LINE_WAIT_S)
            except queue.Empty:
                raise AssertionError(f"no line with {words} in: {self.seen}") from None
            if not line:
                raise AssertionError(f"the agent exited; its lines: {self.seen}")
            self.seen.append(line)
            if all(word in line for word in words):
                return line

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _agents(service: devstack.Service, ca: CertificateAuthority, client: Pair) -> list[str]:
    context = TLSFiles((str(ca.ca),), str(client.cert), str(client.key))
    from docker_variant.oci.http import client_tls

    with httpx.Client(verify=client_tls(context)) as http:
        answer = http.get(
            f"{service.url}/v1/agents", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
    answer.raise_for_status()
    return [agent["agent_id"] for agent in answer.json()["agents"]]


def test_an_agent_trusts_a_private_ca_with_ca_file(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """Without --ca-file the agent's log line says what it trusted and names --ca-file;
    with it, the agent registers."""
    service = _scheduler(tmp_path, ca)
    try:
        untrusting = AgentProcess(tmp_path, service.url)
        try:
            line = untrusting.await_line("heartbeat 1", "failed")
        finally:
            untrusting.stop()
        assert "certificate verify failed" in line, line
        assert "trusting the system's CAs;" in line and "give --ca-file" in line, line
        trusting = AgentProcess(tmp_path, service.url, "--ca-file", str(ca.ca))
        try:
            line = trusting.await_line("registered with")
        finally:
            trusting.stop()
        assert f"registered with {service.url} as agent h200-0" in line, line
        assert not any("failed" in seen for seen in trusting.seen), trusting.seen
    finally:
        service.stop()


def test_mutual_tls_an_agent_without_a_client_certificate_is_refused(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    service = _scheduler(tmp_path, ca, "--tls-client-ca", str(ca.ca))
    client = ca.client()
    try:
        bare = AgentProcess(tmp_path, service.url, "--ca-file", str(ca.ca))
        try:
            line = bare.await_line("heartbeat 1", "failed")
        finally:
            bare.stop()
        assert "give --client-cert" in line, line
        assert _agents(service, ca, client) == []
        # curl's habit too: the key in the certificate's own file
        both = tmp_path / "agent.pem"
        both.write_bytes(client.cert.read_bytes() + client.key.read_bytes())
        with_cert = AgentProcess(tmp_path, service.url, "--ca-file", str(ca.ca),
                                 "--client-cert", str(both))  # fmt: skip
        try:
            with_cert.await_line("registered with")
        finally:
            with_cert.stop()
        assert _agents(service, ca, client) == ["h200-0"]
    finally:
        service.stop()


def test_what_if_takes_a_ca_file_and_a_client_certificate(
    tmp_path: Path, ca: CertificateAuthority, capsys: pytest.CaptureFixture[str]
) -> None:
    service = _scheduler(tmp_path, ca, "--tls-client-ca", str(ca.ca))
    client = ca.client()
    templates = tmp_path / "templates.json"
    templates.write_text('[{"name": "cpu", "host": {}}]')
    request = tmp_path / "request.json"
    request.write_text('{"image": "x:1", "nodes": 1, "devices_per_node": 0}')
    token = tmp_path / "ops.token"
    token.write_text(ADMIN_TOKEN)
    ask = ["what-if", "--scheduler", service.url, "--token-file", str(token),
           "--templates", str(templates), str(request)]  # fmt: skip
    try:
        code, err = run_in_process(main, ask, capsys)
        assert code == 3 and "certificate verify failed" in err and "--ca-file" in err, err
        code, err = run_in_process(main, [*ask, "--ca-file", str(ca.ca)], capsys)
        assert code == 3 and "give --client-cert" in err, err
        tls = ["--ca-file", str(ca.ca), "--client-cert", str(client.cert),
               "--client-key", str(client.key)]  # fmt: skip
        code, err = run_in_process(main, [*ask, *tls], capsys)
        assert "TLS" not in err and code != 3, err  # the scheduler answered
    finally:
        service.stop()


def _bad_tls_cases(tmp_path: Path, ca: CertificateAuthority) -> list[tuple[list[str], str]]:
    client, other = ca.client(), ca.client("other")
    not_pem = tmp_path / "ca.der"
    not_pem.write_bytes(b"\x30\x82\x01\x00 not PEM")
    missing = tmp_path / "missing.pem"
    return [
        (["--ca-file", str(missing)], f"--ca-file '{missing}': cannot read it (No such file"),
        (["--ca-file", str(not_pem)], f"--ca-file '{not_pem}': no PEM certificate in it"),
        (["--client-cert", str(client.cert)], "no private key in it; give --client-key"),
        (["--client-key", str(client.key)], f"--client-key '{client.key}': give --client-cert"),
        (["--client-cert", str(client.cert), "--client-key", str(other.key)],
         "the key does not fit the certificate"),
    ]  # fmt: skip


def test_bad_tls_files_are_one_line_and_exit_2(
    tmp_path: Path, ca: CertificateAuthority, capsys: pytest.CaptureFixture[str]
) -> None:
    scheduler = ["--scheduler", "https://127.0.0.1:1"]
    request = tmp_path / "request.json"
    request.write_text('{"image": "x:1", "nodes": 1, "devices_per_node": 0}')
    templates = tmp_path / "templates.json"
    templates.write_text("[]")
    for args, expected in _bad_tls_cases(tmp_path, ca):
        agent = ["agent", *scheduler, "--providers-file", str(HOSTS / "h200-r570.json"), *args]
        what_if = ["what-if", *scheduler, "--templates", str(templates), str(request), *args]
        for argv in (agent, what_if):
            code, err = run_in_process(main, argv, capsys)
            assert code == 2 and expected in err and err.count("\n") == 1, (argv, err)
    args, expected = _bad_tls_cases(tmp_path, ca)[1]
    done = run_cli("ls", "127.0.0.1:1/a:1", *args, tmp=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith(f"docker-variant: error: {expected}")
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.fixture
def tls_registry(tmp_path: Path, ca: CertificateAuthority) -> Iterator[devstack.Service]:
    """A registry over HTTPS (a certificate of the private CA) that asks for a client
    certificate of that CA, holding ``tls/app:1.0`` (pushed before it turned to TLS)."""
    plain = devstack.start_registry(tmp_path / "registry")
    config = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    try:
        push_raw_image(plain.url, "tls/app", "1.0", config)
    finally:
        plain.stop()
    server = ca.server("registry")
    registry = devstack.start_registry(
        tmp_path / "registry", tls=(server.cert, server.key), client_ca=ca.ca
    )
    try:
        yield registry
    finally:
        registry.stop()


def test_a_registry_is_trusted_as_docker_certs_d_says(
    tmp_path: Path, ca: CertificateAuthority, tls_registry: devstack.Service
) -> None:
    """certs.d/<host:port>/: ca.crt trusts the registry, client.cert/client.key answer its
    request for a client certificate; --client-cert and --ca-file do the same."""
    docker = tmp_path / "docker"
    env = {"DOCKER_CONFIG": str(docker)}
    ref = f"{tls_registry.address}/tls/app:1.0"
    certs = docker / "certs.d" / tls_registry.address
    certs.mkdir(parents=True)
    shutil.copy(ca.ca, certs / "ca.crt")
    refused = run_cli("resolve", ref, env=env, tmp=tmp_path)
    assert refused.returncode == 3, refused.stderr
    assert "TLS:" in refused.stderr and "--client-cert" in refused.stderr, refused.stderr
    client = ca.client()
    shutil.copy(client.cert, certs / "client.cert")
    half = run_cli("resolve", ref, env=env, tmp=tmp_path)
    assert half.returncode == 2 and "missing key" in half.stderr, half.stderr
    shutil.copy(client.key, certs / "client.key")
    done = run_cli("resolve", ref, env=env, tmp=tmp_path)
    assert done.returncode == 0 and done.stdout == f"{ref}\n", done.stderr
    # the command's own client certificate, with certs.d's CA
    (certs / "client.cert").unlink()
    (certs / "client.key").unlink()
    tls = ["--client-cert", str(client.cert), "--client-key", str(client.key)]
    done = run_cli("resolve", ref, *tls, env=env, tmp=tmp_path)
    assert done.returncode == 0 and done.stdout == f"{ref}\n", done.stderr
    # and --ca-file, where certs.d holds no CA
    (certs / "ca.crt").unlink()
    shutil.copy(client.cert, certs / "client.cert")
    shutil.copy(client.key, certs / "client.key")
    untrusted = run_cli("resolve", ref, env=env, tmp=tmp_path)
    assert untrusted.returncode == 3 and "certificate verify failed" in untrusted.stderr
    assert "give --ca-file" in untrusted.stderr, untrusted.stderr
    done = run_cli("--ca-file", str(ca.ca), "resolve", ref, env=env, tmp=tmp_path)
    assert done.returncode == 0 and done.stdout == f"{ref}\n", done.stderr


def _ctr_fetch(
    containerd: devstack.Service, hosts: Path, ref: str
) -> subprocess.CompletedProcess[str]:
    sock = containerd.address.removeprefix("unix://")
    return subprocess.run(
        ["ctr", "-a", sock, "content", "fetch", "--hosts-dir", str(hosts), ref],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_containerd_trusts_the_ca_and_presents_the_client_certificate_of_hosts_toml(
    tmp_path: Path,
    ca: CertificateAuthority,
    tls_registry: devstack.Service,
    containerd: devstack.Service,
) -> None:
    """`k8s containerd-hosts --ca-file --client-cert --client-key` writes containerd's
    ``ca`` and ``client``: the real containerd then fetches from the mutual-TLS registry,
    which it cannot without them."""
    client = ca.client()
    registry = tls_registry.address
    ref = f"{registry}/tls/app:1.0"
    write = ["k8s", "containerd-hosts", registry, "--server", tls_registry.url,
             "--providers-file", str(HOSTS / "h200-r570.json")]  # fmt: skip
    done = run_cli(*write, "--output", str(tmp_path / "bare"), tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    refused = _ctr_fetch(containerd, tmp_path / "bare", ref)
    assert refused.returncode != 0 and "x509" in refused.stderr, refused.stderr
    tls = ["--ca-file", str(ca.ca), "--client-cert", str(client.cert),
           "--client-key", str(client.key)]  # fmt: skip
    done = run_cli(*write, *tls, "--output", str(tmp_path / "hosts"), tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    written = tomllib.loads((tmp_path / "hosts" / registry / "hosts.toml").read_text())
    host = written["host"][tls_registry.url]
    assert host["ca"] == str(ca.ca)
    assert host["client"] == [[str(client.cert), str(client.key)]]
    fetched = _ctr_fetch(containerd, tmp_path / "hosts", ref)
    assert fetched.returncode == 0, fetched.stderr


def test_the_agents_hosts_toml_lets_containerd_reach_a_mutual_tls_proxy(
    tmp_path: Path,
    ca: CertificateAuthority,
    tls_registry: devstack.Service,
    containerd: devstack.Service,
) -> None:
    """The agent's ``--containerd-ca-file`` and ``--containerd-client-cert/-key``: the files
    are kept beside hosts.toml, named relatively, and the real containerd, reading them
    there, fetches from the mutual-TLS registry."""
    from docker_variant.agent.node import Agent, AgentSettings

    client = ca.client()
    registry = tls_registry.address
    settings = AgentSettings(
        None,
        "h200-0",
        providers_file=HOSTS / "h200-r570.json",
        containerd_hosts=(registry,),
        containerd_dir=tmp_path / "certs.d",
        containerd_server=tls_registry.url,
        containerd_ca=ca.ca,
        containerd_client_cert=client.cert,
        containerd_client_key=client.key,
    )
    agent = Agent(settings)
    try:
        agent.beat()
    finally:
        agent.close()
    host = tomllib.loads((tmp_path / "certs.d" / registry / "hosts.toml").read_text())
    assert host["host"][tls_registry.url]["ca"] == "ca.crt"
    fetched = _ctr_fetch(containerd, tmp_path / "certs.d", f"{registry}/tls/app:1.0")
    assert fetched.returncode == 0, fetched.stderr
