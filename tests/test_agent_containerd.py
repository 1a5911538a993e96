"""The agent keeps containerd's ``hosts.toml`` current (``--containerd-hosts``): written at the
first detection, rewritten atomically when a driver or a device changes the header, set
right when someone changes the file, and a failed write never stops the agent."""

from __future__ import annotations

import json
import logging
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from clirun import run_in_process
from docker_variant.agent.node import Agent, AgentSettings
from docker_variant.k8s.containerd import hosts_toml
from docker_variant.providers import read_providers_file
from docker_variant.providers.gpus import node_header
from docker_variant.scheduler.__main__ import main

HOSTS = Path(__file__).resolve().parent.parent / "examples" / "hosts"
REGISTRY = "registry.example.internal"
SERVER = "https://variant-proxy.example.internal:5080"


def _agent(tmp_path: Path, host: str) -> tuple[Agent, Path, Path]:
    providers = tmp_path / "node.json"
    shutil.copy(HOSTS / f"{host}.json", providers)
    directory = tmp_path / "certs.d"
    settings = AgentSettings(
        None,
        "gpu-1",
        providers_file=providers,
        containerd_hosts=(REGISTRY,),
        containerd_dir=directory,
        containerd_server=SERVER,
    )
    return Agent(settings), providers, directory / REGISTRY / "hosts.toml"


def _headers(path: Path) -> dict[str, Any]:
    document = tomllib.loads(path.read_text())
    found: dict[str, Any] = document["host"][SERVER]["header"]
    return {name: json.loads(value) for name, value in found.items()}


def _expected(host: str) -> str:
    lists, devices = node_header(read_providers_file(HOSTS / f"{host}.json"))
    return hosts_toml(REGISTRY, SERVER, lists, devices)


def test_the_agent_writes_and_rewrites_hosts_toml_as_the_node_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, providers, path = _agent(tmp_path, "h200-l4")
    with caplog.at_level(logging.INFO, "docker_variant.agent"):
        agent.beat()
    assert path.read_text() == _expected("h200-l4")  # what k8s containerd-hosts writes
    headers = _headers(path)
    # the mixed node: no sm_arch every GPU lists; each GPU's own lists beside
    assert "sm_arch" not in headers["X-Variant-Properties"]["nvidia"]
    assert [d["nvidia"]["sm_arch"][0] for d in headers["X-Variant-Devices"]] == [
        "90_real",
        "89_real",
    ]
    assert f"wrote {path}: what every device runs" in caplog.text
    written = path.stat().st_mtime_ns, path.stat().st_ino

    caplog.clear()
    with caplog.at_level(logging.INFO, "docker_variant.agent"):
        agent.beat()  # nothing changed: the file is left alone
    assert "wrote" not in caplog.text
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == written

    # the L4 taken out, the driver upgraded: one H200 on R580 (CUDA 13.0)
    upgraded = json.loads((HOSTS / "h200-r570.json").read_text())
    upgraded["nvidia"]["cuda_version_lower_bound"].insert(0, "13.0")
    providers.write_text(json.dumps(upgraded))
    agent.beat()
    headers = _headers(path)
    assert headers == {"X-Variant-Properties": upgraded}
    assert path.stat().st_ino != written[1]  # replaced (os.replace), never written in place
    assert [p.name for p in path.parent.iterdir()] == ["hosts.toml"]  # no temporary left


def test_a_changed_file_is_set_right_on_the_next_detection(tmp_path: Path) -> None:
    agent, _, path = _agent(tmp_path, "h200-l4")
    agent.beat()
    path.write_text("server = 'https://elsewhere'\n")
    agent.beat()
    assert path.read_text() == _expected("h200-l4")
    path.unlink()
    agent.beat()
    assert path.read_text() == _expected("h200-l4")


def test_a_failed_write_is_logged_once_and_the_agent_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _, path = _agent(tmp_path, "h200-l4")
    (tmp_path / "certs.d").write_text("not a directory")
    with caplog.at_level(logging.DEBUG, "docker_variant.agent"):
        agent.beat()
        agent.beat()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert f"keeping {path} failed (cannot write" in warnings[0].getMessage()
    assert agent.beats == 2  # the beats went on
    (tmp_path / "certs.d").unlink()
    agent.beat()
    assert path.read_text() == _expected("h200-l4")


def test_the_tls_files_are_kept_beside_hosts_toml_and_named_relatively(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--containerd-ca-file`` and the client certificate are copied into the registry's
    directory (the key 0600) and hosts.toml names them relatively, as containerd reads them
    there wherever the node mounts the directory; a rotated source is copied again, and an
    unreadable one is a warning once while the agent goes on."""
    agent, _, path = _agent(tmp_path, "h200-l4")
    sources = tmp_path / "tls"
    sources.mkdir()
    for name, text in (("ca.pem", "CA 1"), ("tls.crt", "CERT 1"), ("tls.key", "KEY 1")):
        (sources / name).write_text(text)
    agent.settings = replace(
        agent.settings,
        containerd_ca=sources / "ca.pem",
        containerd_client_cert=sources / "tls.crt",
        containerd_client_key=sources / "tls.key",
    )
    agent.beat()
    host = tomllib.loads(path.read_text())["host"][SERVER]
    assert host["ca"] == "ca.crt" and host["client"] == [["client.cert", "client.key"]]
    kept = path.parent
    assert sorted(p.name for p in kept.iterdir()) == [
        "ca.crt", "client.cert", "client.key", "hosts.toml"
    ]  # fmt: skip
    assert (kept / "ca.crt").read_text() == "CA 1"
    assert (kept / "client.key").stat().st_mode & 0o777 == 0o600
    assert (kept / "ca.crt").stat().st_mode & 0o777 == 0o644

    (sources / "ca.pem").write_text("CA 2")  # the Secret rotated
    with caplog.at_level(logging.INFO, "docker_variant.agent"):
        agent.beat()
    assert (kept / "ca.crt").read_text() == "CA 2"
    assert f"wrote {kept / 'ca.crt'} from {sources / 'ca.pem'}" in caplog.text
    assert "wrote " + str(path) not in caplog.text  # hosts.toml itself did not change

    caplog.clear()
    (sources / "tls.crt").unlink()
    with caplog.at_level(logging.DEBUG, "docker_variant.agent"):
        agent.beat()
        agent.beat()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"keeping {path} failed (cannot read {sources / 'tls.crt'}: "
                        "No such file or directory); retrying"], warnings  # fmt: skip
    assert (kept / "client.cert").read_text() == "CERT 1"  # the last good copy stays


def test_without_tls_files_hosts_toml_names_none(tmp_path: Path) -> None:
    agent, _, path = _agent(tmp_path, "h200-l4")
    agent.beat()
    host = tomllib.loads(path.read_text())["host"][SERVER]
    assert "ca" not in host and "client" not in host
    assert [p.name for p in path.parent.iterdir()] == ["hosts.toml"]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    return run_in_process(main, argv, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--containerd-hosts", "bad registry"], "registry 'bad registry' is not"),
        (["--containerd-hosts", REGISTRY, "--containerd-server", "ftp://x"],
         "server 'ftp://x' is not an http:// or https:// URL"),
        (["--label-node", "--node-name", "gpu-1", "--kubeconfig", "/no/such",
          "--containerd-server", SERVER], "--containerd-server: give --containerd-hosts"),
        (["--label-node", "--node-name", "gpu-1", "--kubeconfig", "/no/such",
          "--containerd-ca-file", "/etc/passwd"],
         "--containerd-ca-file: give --containerd-hosts REGISTRY too"),
        (["--containerd-hosts", REGISTRY, "--containerd-ca-file", "/no/such/ca.pem"],
         "--containerd-ca-file '/no/such/ca.pem': cannot read it (No such file or directory)"),
        (["--containerd-hosts", REGISTRY, "--containerd-client-cert", "/tmp"],
         "--containerd-client-cert '/tmp': cannot read it (Is a directory)"),
        (["--containerd-hosts", REGISTRY, "--containerd-client-key", "/etc/passwd"],
         "--containerd-client-key '/etc/passwd': give --containerd-client-cert too"),
        (["--containerd-hosts", REGISTRY, "--containerd-ca-file", "/etc/passwd"],
         "--containerd-ca-file '/etc/passwd': no PEM certificate in it (no -----BEGIN line)"),
    ],
)  # fmt: skip
def test_bad_containerd_input_exits_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    providers = tmp_path / "node.json"
    shutil.copy(HOSTS / "h200-l4.json", providers)
    code, err = run_main(["agent", "--providers-file", str(providers), *argv], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err
