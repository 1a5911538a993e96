"""deploy/: the Kubernetes manifests validate against every Kubernetes version supported here
and hang together (selectors, ports, probes, Secrets, one version of the images); the agent
DaemonSet follows the host-root convention; every option the manifests and systemd units pass
is one the program has; the units pass systemd-analyze verify; the containerd example is what
`k8s containerd-hosts` writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from docker_variant import __version__

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
KUBERNETES = ("1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")
BIN = Path(sys.executable).parent
UNITS = [
    DEPLOY / "systemd/variant-proxy.service",
    DEPLOY / "systemd/variant-scheduler.service",
    DEPLOY / "systemd/variant-scheduler-agent.service",
]


def _documents(pattern: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((DEPLOY / "kubernetes").glob(pattern)):
        if path.name != "kustomization.yaml":
            found += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return found


MANIFESTS = _documents("*.yaml")
SECRETS = _documents("example-secrets/*.yaml")


def _kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in MANIFESTS if d["kind"] == kind}


def _workloads() -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("Deployment", "DaemonSet"):
        for name, document in _kind(kind).items():
            yield name, document["spec"]["template"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


@pytest.mark.parametrize("version", KUBERNETES)
def test_manifests_validate(version: str) -> None:
    assert {d["kind"] for d in MANIFESTS} >= {"Namespace", "Deployment", "DaemonSet", "Service",
        "PodDisruptionBudget", "NetworkPolicy", "ConfigMap"}  # fmt: skip
    for document in MANIFESTS + SECRETS:
        kubernetes_validate.validate(document, version, strict=True)


CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding")  # fmt: skip


def test_every_document_is_in_the_namespace() -> None:
    for document in MANIFESTS + SECRETS:
        if document["kind"] not in CLUSTER_SCOPED:
            assert document["metadata"]["namespace"] == "docker-variant", document["metadata"]


def test_agent_daemonset_reads_the_host_under_its_host_root() -> None:
    """The agent reads DIR/sys/... with --host-root DIR: the host's /sys must be mounted,
    read-only, at DIR/sys, in every container that detects (the agent and the agent keeping
    containerd's hosts.toml)."""
    pod = _kind("DaemonSet")["variant-agent"]["spec"]["template"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for container in _containers(pod):
        argv = [*container.get("command", []), *container.get("args", [])]
        roots = [a.split("=", 1)[1] for a in argv if a.startswith("--host-root=")]
        assert roots == ["/host"], (container["name"], argv)
        host_mounts = {
            volumes[m["name"]]["hostPath"]["path"]: m
            for m in container["volumeMounts"]
            if "hostPath" in volumes[m["name"]]
        }
        assert "/sys" in host_mounts, container["name"]
        for host_path, mount in host_mounts.items():
            assert mount["mountPath"] == roots[0] + host_path, (container["name"], mount)
        assert host_mounts["/sys"].get("readOnly") is True
        assert volumes[host_mounts["/sys"]["name"]]["hostPath"]["type"] == "Directory"
    agent = pod["spec"]["containers"][0]
    assert agent["securityContext"]["runAsNonRoot"] is True
    assert "--agent-id=$(NODE_NAME)" in agent["args"]
    node_name = next(e for e in agent["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_images_are_this_version() -> None:
    for name, pod in _workloads():
        for container in _containers(pod):
            image = container["image"]
            if "/docker-variant/variant-" in image:
                assert image.endswith(f":{__version__}"), (name, image)


def test_services_probes_and_budgets_match_their_pods() -> None:
    pods = dict(_workloads())
    for name, service in _kind("Service").items():
        matched = [
            p
            for p in pods.values()
            if service["spec"]["selector"].items() <= p["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, name
        ports = {p["name"] for c in matched[0]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name
    # the container that serves each workload's port: the scheduler, and the proxy's nginx
    # front (whose TLS is on its listen line, test_the_proxy_pods_run_the_shipped_front)
    for name, serving in (("variant-proxy", "front"), ("variant-scheduler", "variant-scheduler")):
        container = next(c for c in pods[name]["spec"]["containers"] if c["name"] == serving)
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["path"].startswith("/healthz"), (name, probe)
            assert container[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
        if name == "variant-scheduler":
            assert any(a.startswith("--tls-cert=") for a in container["args"])
        budget = _kind("PodDisruptionBudget")[name]
        labels = pods[name]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"]["minAvailable"] < _kind("Deployment")[name]["spec"]["replicas"]


def test_the_proxy_pods_run_the_shipped_front() -> None:
    """The ConfigMap holds deploy/nginx/variant-proxy.conf itself, its placeholders set to
    the cluster's registry, the proxy on the pod's loopback and a TLS listener, and then a
    listener for Prometheus that serves /metrics alone; the proxy listens on that loopback
    address only."""
    shipped = (DEPLOY / "nginx/variant-proxy.conf").read_text()
    pod = dict(_workloads())["variant-proxy"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "variant-proxy")
    listen = next(a for a in proxy["args"] if a.startswith("--listen=")).split("=", 1)[1]
    upstream = next(a for a in proxy["args"] if a.startswith("--upstream=")).split("=", 1)[1]
    assert listen.startswith("127.0.0.1:")
    expected = (
        shipped.replace("server registry:5000;", f"server {upstream.removeprefix('http://')};")
        .replace("server variant-proxy:5080;", f"server {listen};")
        .replace(
            "listen 5000;",
            "listen 5080 ssl;\n    ssl_certificate /etc/variant-proxy/tls/tls.crt;\n"
            "    ssl_certificate_key /etc/variant-proxy/tls/tls.key;",
        )
    )
    assert expected != shipped
    config = _kind("ConfigMap")["variant-proxy-nginx"]["data"]["variant-proxy.conf"]
    assert config.startswith(expected)
    # then the metrics listener: /metrics only, on the front's "metrics" port
    front = next(c for c in pod["containers"] if c["name"] == "front")
    port = next(p["containerPort"] for p in front["ports"] if p["name"] == "metrics")
    metrics = config[len(expected) :]
    assert f"listen {port};" in metrics and "location = /metrics {" in metrics, metrics
    assert metrics.count("proxy_pass http://docker_variant_proxy;") == 1
    assert "location / {\n        return 404;" in metrics


def test_network_policies_deny_by_default_and_keep_redis_to_the_proxies() -> None:
    policies = _kind("NetworkPolicy")
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and "ingress" not in deny
    redis = policies["variant-proxy-redis"]["spec"]
    assert redis["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "variant-proxy-redis"}
    (rule,) = redis["ingress"]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "variant-proxy"}}}
    ]
    assert redis["egress"] == []


def test_secrets_and_config_maps_the_pods_use_exist() -> None:
    secrets = {s["metadata"]["name"]: s for s in SECRETS}
    # a site's own ConfigMaps (the scheduler's CA bundle) come with its Secrets
    config_maps = _kind("ConfigMap") | {
        d["metadata"]["name"]: d for d in SECRETS if d["kind"] == "ConfigMap"
    }
    for name, pod in _workloads():
        wanted: list[tuple[str, str | None]] = []
        for volume in pod["spec"]["volumes"]:
            if "secret" in volume:
                keys = [i["key"] for i in volume["secret"].get("items", [])]
                wanted += [(volume["secret"]["secretName"], k) for k in keys or [None]]
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (name, volume)
        for container in _containers(pod):
            for env in container.get("env", []):
                if ref := env.get("valueFrom", {}).get("secretKeyRef"):
                    wanted.append((ref["name"], ref["key"]))
        for secret, key in wanted:
            if secret.endswith("-tls"):  # kubectl create secret tls, as the example says
                continue
            assert secret in secrets, (name, secret)
            assert key is None or key in secrets[secret]["stringData"], (name, secret, key)


def _options(*argv: str) -> set[str]:
    """The long options a program's --help lists (rich or argparse)."""
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", result.stdout))


def _given(argv: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def test_every_option_the_manifests_pass_exists() -> None:
    programs = {
        "variant-proxy": _options(str(BIN / "variant-proxy"), "--help"),
        "variant-scheduler serve": _options(str(BIN / "variant-scheduler"), "serve", "--help"),
        "variant-scheduler agent": _options(str(BIN / "variant-scheduler"), "agent", "--help"),
    }
    entrypoints = {"variant-proxy": "variant-proxy", "variant-scheduler": "variant-scheduler serve",
                   "variant-agent": "variant-scheduler agent"}  # fmt: skip
    for name, pod in _workloads():
        for container in pod["spec"]["containers"]:
            image = container["image"].split("/")[-1].split(":")[0]
            if image in entrypoints:
                missing = _given(container["args"]) - programs[entrypoints[image]]
                assert not missing, (name, missing)
    # the hosts.toml files are kept by an agent container, not written once by an init one
    pod = _kind("DaemonSet")["variant-agent"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    (keeper,) = [c for c in pod["containers"] if c["name"] == "containerd-hosts"]
    assert any(a.startswith("--containerd-hosts=") for a in keeper["args"])
    assert keeper["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "containerd-certs", "mountPath": "/host/etc/containerd/certs.d"} in keeper[
        "volumeMounts"
    ]


def _exec_argv(unit: Path) -> list[str]:
    text = unit.read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def test_every_option_the_units_pass_exists() -> None:
    for unit in UNITS:
        argv = _exec_argv(unit)
        program = [
            Path(argv[0]).name,
            *([argv[1]] if Path(argv[0]).name == "variant-scheduler" else []),
        ]
        known = _options(str(BIN / program[0]), *program[1:], "--help")
        assert not _given(argv) - known, unit


def _install(*argv: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(DEPLOY / "systemd/install"), "--no-reload", *argv],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    return result.stdout


def test_units_installed_by_the_install_step_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """deploy/systemd/install writes each unit with ExecStart in the venv it installs to
    (this venv here: it has docker-variant and every extra, so nothing is installed), and
    each unit's environment file from its example, root's alone; the written units pass
    ``systemd-analyze verify`` with no warning about them."""
    units, etc = tmp_path / "units", tmp_path / "etc"
    out = _install("--venv", str(BIN.parent), "--unit-dir", str(units), "--etc", str(etc),
                   *(unit.stem for unit in UNITS))  # fmt: skip
    assert "into" not in out  # no pip
    assert sorted(p.name for p in units.iterdir()) == sorted(unit.name for unit in UNITS)
    modes = {str(p.relative_to(etc)): oct(p.stat().st_mode & 0o777) for p in etc.rglob("*")}
    assert modes == {
        "variant-proxy": "0o700", "variant-scheduler": "0o700",
        "variant-proxy/variant-proxy.env": "0o600",
        "variant-scheduler/variant-scheduler.env": "0o600",
        "variant-scheduler/variant-scheduler-agent.env": "0o600",
    }  # fmt: skip
    for unit in UNITS:
        installed = units / unit.name
        assert installed.read_text() == unit.read_text().replace(
            "/opt/docker-variant/.venv/bin/", f"{BIN}/"
        )
        (env,) = etc.glob(f"*/{unit.stem}.env")
        assert env.read_text() == unit.with_suffix(".env").read_text()
        result = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(installed)],
            capture_output=True, text=True,
        )  # fmt: skip
        output = [
            line for line in (result.stdout + result.stderr).splitlines() if unit.name in line
        ]
        assert result.returncode == 0 and not output, (unit.name, result.stdout + result.stderr)


def test_an_environment_file_is_written_once(tmp_path: Path) -> None:
    """A site's values survive installing again (an upgrade): the example is never written
    over an environment file that is there."""
    units, etc = tmp_path / "units", tmp_path / "etc"
    argv = ("--venv", str(BIN.parent), "--unit-dir", str(units), "--etc", str(etc))
    _install(*argv, "variant-scheduler-agent")
    env = etc / "variant-scheduler/variant-scheduler-agent.env"
    env.write_text("VARIANT_SCHEDULER_URL=https://sched.site:5090\n")
    _install(*argv, "variant-scheduler-agent", "variant-scheduler")
    assert env.read_text() == "VARIANT_SCHEDULER_URL=https://sched.site:5090\n"
    assert (etc / "variant-scheduler/variant-scheduler.env").is_file()


def _unit_settings(unit: Path, key: str) -> list[str]:
    return [
        line.split("=", 1)[1]
        for line in unit.read_text().replace("\\\n", " ").splitlines()
        if line.startswith(f"{key}=")
    ]


def _example_values(unit: Path) -> dict[str, str]:
    """The variables a unit's example environment file sets or shows (commented out)."""
    found = re.findall(r"^#?([A-Z_]+)=(.*)$", unit.with_suffix(".env").read_text(), re.MULTILINE)
    return dict(found)


def test_the_units_take_the_sites_values_from_their_environment_files() -> None:
    """No site value is written in a unit: each argument of ExecStart is an option, a
    credential (%d), a number, or a variable the unit's environment file sets, and that file
    (the one the install step writes) must exist. Every variable the example shows is one
    the unit or its program reads."""
    for unit in UNITS:
        (environment_file,) = _unit_settings(unit, "EnvironmentFile")
        assert environment_file == f"/etc/{_credential_dir(unit)}/{unit.stem}.env", unit.name
        assert not _unit_settings(unit, "Environment") or unit.stem == "variant-scheduler"
        examples = _example_values(unit)
        argv = _exec_argv(unit)
        for argument in argv[1:]:
            variable = re.fullmatch(r"\$\{?([A-Z_]+)\}?", argument)
            if variable:
                assert variable.group(1) in examples, (unit.name, argument)
            else:
                assert argument.startswith(("--", "%d/")) or argument in ("serve", "agent"), (
                    unit.name, argument)  # fmt: skip
        source = (REPO / "src/docker_variant").rglob("*.py")
        read = "".join(path.read_text() for path in source) + unit.read_text()
        for variable in examples:
            assert (
                f'"{variable}"' in read or f"${variable}" in read or (f"${{{variable}}}" in read)
            ), (unit.name, variable)


def _credential_dir(unit: Path) -> str:
    return "variant-proxy" if unit.stem == "variant-proxy" else "variant-scheduler"


def test_the_install_step_adds_the_extras_of_units_added_later(tmp_path: Path) -> None:
    """The agent's bare venv, then the proxy's unit into the same root: the venv gets the
    [proxy] extra (pip recorded here; scripts/wheel-smoke runs it for real), as variant-proxy
    would exit 2 without it."""
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "docker_variant_src.pth").write_text(str(REPO / "src") + "\n")  # a bare install
    recorded = tmp_path / "pip.args"
    for name, script in (("docker-variant", "exit 0"), ("pip", f'echo "$*" >>{recorded}')):
        (venv / "bin" / name).write_text(f"#!/bin/sh\n{script}\n")
        (venv / "bin" / name).chmod(0o755)
    argv = ("--venv", str(venv), "--unit-dir", str(tmp_path / "units"), "--etc", str(tmp_path))
    env = {**os.environ, "PACKAGE": "/wheels/docker_variant.whl"}
    env.pop("PYTHONPATH", None)
    _install(*argv, "variant-scheduler-agent", env=env)
    assert not recorded.exists()  # the agent needs no extra
    _install(*argv, "variant-proxy", "variant-scheduler-agent", env=env)
    assert recorded.read_text() == "install -q /wheels/docker_variant.whl[proxy]\n"


def test_the_install_step_refuses_an_unknown_unit(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(DEPLOY / "systemd/install"), "--unit-dir", str(tmp_path), "--no-reload", "variant-web"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown unit variant-web" in result.stderr
    assert not list(tmp_path.iterdir())


def _exposure(unit: Path) -> float:
    """``systemd-analyze security``'s overall exposure of a unit file (0 safest, 10 worst)."""
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--man=no", str(unit)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout[-500:]
    return float(found.group(1))


def test_units_are_hardened() -> None:
    """Every unit scores "OK" (under 2) on systemd-analyze security; the agent, which needs
    /sys and the NVIDIA devices, no more exposed than the servers allow themselves plus the
    device access (0.3)."""
    exposure = {unit.stem: _exposure(unit) for unit in UNITS}
    assert all(score < 2.0 for score in exposure.values()), exposure
    servers = max(exposure["variant-proxy"], exposure["variant-scheduler"])
    assert exposure["variant-scheduler-agent"] <= servers + 0.3, exposure


def test_containerd_example_is_what_containerd_hosts_writes() -> None:
    example = (DEPLOY / "containerd/hosts.toml.example").read_text()
    result = subprocess.run(
        [str(BIN / "docker-variant"), "k8s", "containerd-hosts", "registry.example.internal",
         "--server", "https://variant-proxy.example.internal:5080",
         "--providers-file", str(REPO / "examples/hosts/h200-r570.json")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout == example
    hosts = tomllib.loads(example)
    header = hosts["host"]["https://variant-proxy.example.internal:5080"]["header"]
    lists = json.loads(header["X-Variant-Properties"])
    assert lists == json.loads((REPO / "examples/hosts/h200-r570.json").read_text())
