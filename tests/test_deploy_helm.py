"""deploy/helm/docker-variant: the chart lints, renders objects that validate against every
Kubernetes version supported here under its defaults and under every option, and its
defaults are exactly the kustomize base deploy/kubernetes/ (kubectl kustomize builds the
same objects). helm and kubectl are the real binaries (scripts/k8s-tools)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import render_kubernetes

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy/helm/docker-variant"
GUIDE = REPO / "docs/guides/operators.md"
BIN = Path(sys.executable).parent
KUBERNETES = ("1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")


def _tool(name: str) -> str:
    path = render_kubernetes.tool(name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} not found at {path}: bash scripts/k8s-tools installs it")
    return path


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _template(*values: str) -> list[dict[str, Any]]:
    _tool("helm")
    return _objects(render_kubernetes.helm_template(*values))


def _key(document: dict[str, Any]) -> tuple[str, str]:
    return document["kind"], document["metadata"]["name"]


def _by_key(documents: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    keyed = {_key(d): d for d in documents}
    assert len(keyed) == len(documents), Counter(map(_key, documents)).most_common(3)
    return keyed


# Every option a user may turn, rendered: each set must give valid objects.
VALUE_SETS = {
    "defaults": (),
    "everything": (
        "namespace.create=true", "serviceMonitor.enabled=true", "agent.runtimeClassName=nvidia",
        "image.pullPolicy=IfNotPresent", "image.registry=registry.example.internal:5000",
        "image.prefix=dv/",
        "proxy.replicas=3", "scheduler.registries={a.example,b.example:5000}",
        "agent.descriptors.warboy\\.toml=name = 'x'", "agent.nodeLabels.cpuFlags=true",
    ),
    "managed-redis": ("redis.enabled=false", "proxy.metrics.enabled=false"),
    "proxy-only": ("scheduler.enabled=false", "agent.enabled=false", "serviceMonitor.enabled=true"),
    "dashboard": ("grafana.dashboard.enabled=true", "grafana.dashboard.namespace=monitoring"),
    "no-containerd-hosts": ("agent.containerdHosts.enabled=false",),
    "no-node-labels": ("agent.nodeLabels.enabled=false",),
    "mutual-tls": ("scheduler.clientCA.secret=variant-scheduler-client-ca",
                   "agent.clientCertSecret=variant-agent-client"),
    "private-ca-proxy": ("agent.containerdHosts.caBundle.configMap=variant-proxy-ca",
                         "agent.containerdHosts.clientCertSecret=variant-containerd-client"),
    "static-agent-tokens": ("agent.auth=tokens",),
    "static-agent-tokens-no-labels": ("agent.auth=tokens", "agent.nodeLabels.enabled=false"),
}  # fmt: skip


def test_helm_lint_is_clean() -> None:
    result = subprocess.run(
        [_tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_the_base_is_what_the_chart_renders() -> None:
    """deploy/kubernetes/ is current: rendering it again changes no file."""
    _tool("helm")
    result = subprocess.run(
        [sys.executable, str(REPO / "devtools/render_kubernetes.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_kubectl_kustomize_builds_the_charts_defaults() -> None:
    built = subprocess.run(
        [_tool("kubectl"), "kustomize", str(REPO / "deploy/kubernetes")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert _by_key(_objects(built)) == _by_key(_template("namespace.create=true"))


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_rendering_validates(values: str) -> None:
    documents = _template(*VALUE_SETS[values])
    services = [d for d in documents if d["kind"] == "Service"]
    for document in documents:
        if document["kind"] == "ServiceMonitor":  # a CRD: checked against its Service here
            _check_service_monitor(document, services)
            continue
        for version in KUBERNETES:
            kubernetes_validate.validate(document, version, strict=True)


def _check_service_monitor(monitor: dict[str, Any], services: list[dict[str, Any]]) -> None:
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    (service,) = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports, (monitor["metadata"]["name"], endpoint)
        assert endpoint["path"] == "/metrics"
        if endpoint["scheme"] == "https":  # the scheduler's /metrics takes a token
            assert endpoint["authorization"]["credentials"]["key"]


def test_values_reach_the_objects() -> None:
    objects = _by_key(_template(*VALUE_SETS["everything"]))
    proxy = objects[("Deployment", "variant-proxy")]["spec"]
    assert proxy["replicas"] == 3
    images = {c["image"] for c in proxy["template"]["spec"]["containers"]}
    assert "registry.example.internal:5000/dv/variant-proxy:0.1.0" in images
    scheduler = objects[("Deployment", "variant-scheduler")]["spec"]["template"]["spec"]
    args = scheduler["containers"][0]["args"]
    assert [a for a in args if a.startswith("--registry=")] == [
        "--registry=a.example", "--registry=b.example:5000"]  # fmt: skip
    agent = objects[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == "nvidia"
    assert {c["imagePullPolicy"] for c in agent["containers"]} == {"IfNotPresent"}
    descriptors = objects[("ConfigMap", "variant-agent-descriptors")]["data"]
    assert descriptors == {"warboy.toml": "name = 'x'"}
    assert "--cpu-flags" in agent["containers"][0]["args"]


def test_a_managed_redis_leaves_out_redis_and_its_policy() -> None:
    kinds = {_key(d) for d in _template(*VALUE_SETS["managed-redis"])}
    assert not {k for k in kinds if k[1] == "variant-proxy-redis"}
    proxy = {k for k in kinds if k[1] == "variant-proxy"}
    assert ("Deployment", "variant-proxy") in proxy


def test_the_redis_budget_lets_a_drain_move_it() -> None:
    """Redis has a budget selecting its pod, which never blocks a drain: the proxies serve
    from their own caches while it is away."""
    objects = _by_key(_template())
    budget = objects[("PodDisruptionBudget", "variant-proxy-redis")]["spec"]
    pod = objects[("Deployment", "variant-proxy-redis")]["spec"]
    assert (
        budget["selector"]["matchLabels"].items() <= pod["template"]["metadata"]["labels"].items()
    )
    assert budget["maxUnavailable"] >= pod["replicas"]


def test_an_https_upstream_is_refused_by_name() -> None:
    argv = [_tool("helm"), "template", "x", str(CHART), "--set", "proxy.upstream=https://reg:5000",
            *_site_values_but("proxy.upstream")]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode != 0
    assert "proxy.upstream" in result.stderr and "http://HOST:PORT" in result.stderr


def _site_values_but(name: str) -> list[str]:
    """``--set`` arguments of the site values the chart requires, but ``name``'s."""
    pairs = [v for v in render_kubernetes.SITE if not v.startswith(f"{name}=")]
    return [argument for value in pairs for argument in ("--set", value)]


@pytest.mark.parametrize(
    ("missing", "said"),
    [
        ("proxy.upstream", "the chart deploys none"),
        ("image.registry", "no public registry has them"),
        ("agent.containerdHosts.server", "as the nodes resolve it"),
        ("scheduler.registries", "agent.containerdHosts.registries: no registry"),
    ],
)
def test_the_chart_refuses_to_render_without_a_site_value(missing: str, said: str) -> None:
    """The chart deploys no registry and pushes no image: what it cannot know, it asks for,
    naming the value, rather than rendering placeholders that pull nothing."""
    argv = [_tool("helm"), "template", "x", str(CHART), *_site_values_but(missing)]
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode != 0
    assert said in result.stderr, result.stderr
    assert missing.split(".")[-1] in result.stderr, result.stderr


def _guide_sh_block(containing: str) -> str:
    """The operators' guide's ``sh`` block holding ``containing``: commands run verbatim."""
    blocks = re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if containing in b]
    return block


def _arguments(container: dict[str, Any], option: str) -> list[str]:
    return [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{option}=")]


def test_the_guides_commands_render_a_setup_whose_parts_agree(tmp_path: Path) -> None:
    """The guide's Helm commands, run as they stand (``helm install`` as ``helm template``,
    kubectl recorded): the scheduler and the agents name the same registries, the proxy fronts
    one of them, every node's hosts.toml (written as the agent writes it) sends its pulls to
    the proxy, and the images come from the registry the guide's image build pushed to."""
    rendered, recorded = tmp_path / "rendered.yaml", tmp_path / "kubectl.log"
    stubs = (
        f'kubectl() {{ echo "$*" >>{shlex.quote(str(recorded))}; }}\n'
        f'helm() {{ [ "$1" = install ] || exit 9; shift; '
        f'{shlex.quote(_tool("helm"))} template "$@" >>{shlex.quote(str(rendered))}; }}\n'
    )
    script = stubs + _guide_sh_block("helm install")
    subprocess.run(["bash", "-euc", script], cwd=REPO, check=True, capture_output=True)
    namespace = recorded.read_text().splitlines()[0].removeprefix("create namespace ")
    objects = _by_key(_objects(rendered.read_text()))
    pods = {
        name: objects[(kind, name)]["spec"]["template"]["spec"]
        for kind, name in objects
        if kind in ("Deployment", "DaemonSet")
    }
    assert {objects[key]["metadata"]["namespace"] for key in objects if key[0] == "Deployment"} == {
        namespace}  # fmt: skip
    containers = {c["name"]: c for pod in pods.values() for c in pod["containers"]}
    registries = _arguments(containers["variant-scheduler"], "--registry")
    assert registries and _arguments(containers["containerd-hosts"], "--containerd-hosts") == (
        registries)  # fmt: skip
    (upstream,) = _arguments(containers["variant-proxy"], "--upstream")
    assert upstream.removeprefix("http://") in registries
    (server,) = _arguments(containers["containerd-hosts"], "--containerd-server")
    certs = tmp_path / "certs.d"
    subprocess.run(
        [str(BIN / "docker-variant"), "k8s", "containerd-hosts", *registries, "--server", server,
         "--providers-file", str(REPO / "examples/hosts/h200-r570.json"), "--output", str(certs)],
        check=True, capture_output=True,
    )  # fmt: skip
    for registry in registries:
        hosts = tomllib.loads((certs / registry / "hosts.toml").read_text())
        assert hosts["server"] == server and list(hosts["host"]) == [server]
    built = re.search(r"IMAGE_PREFIX=(\S+)", _guide_sh_block("deploy/images/build.sh"))
    assert built
    ours = {
        c["image"] for c in containers.values() if c["image"].split("/")[-1].startswith("variant-")
    }
    assert ours and all(image.startswith(built.group(1)) for image in ours), ours


# --------------------------------------------------------------------------- node labels
POLICY = "variant-agent-own-node-labels"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"  # k8s.io/apiserver serviceaccount


def test_the_agent_labels_its_own_node_as_its_service_account() -> None:
    objects = _by_key(_template())
    pod = objects[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "variant-agent"
    assert pod["automountServiceAccountToken"] is True
    (agent,) = [c for c in pod["containers"] if c["name"] == "variant-agent"]
    assert "--label-node" in agent["args"] and "--cpu-flags" not in agent["args"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    role = objects[("ClusterRole", "variant-agent-node-labels")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = objects[("ClusterRoleBinding", "variant-agent-node-labels")]
    assert binding["roleRef"]["name"] == "variant-agent-node-labels"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "variant-agent", "namespace": "docker-variant"}
    ]
    policy = objects[("ValidatingAdmissionPolicy", POLICY)]["spec"]
    (condition,) = policy["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:docker-variant:variant-agent"'
    )
    assert policy["failurePolicy"] == "Fail"
    assert objects[("ValidatingAdmissionPolicyBinding", POLICY)]["spec"] == {
        "policyName": POLICY, "validationActions": ["Deny"]}  # fmt: skip


def test_without_node_labels_the_agent_has_no_access_to_the_apiserver() -> None:
    """Without node labels the agent's ServiceAccount only names it to the scheduler: no
    apiserver token in its pods, no role; with static tokens too, it has none at all."""
    objects = _by_key(_template(*VALUE_SETS["no-node-labels"]))
    pod = objects[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "variant-agent"
    assert "--label-node" not in pod["containers"][0]["args"]
    agent_roles = {n for k, n in objects if k in ("ClusterRole", "ClusterRoleBinding")}
    assert not {n for n in agent_roles if n.startswith("variant-agent")}
    assert "ValidatingAdmissionPolicy" not in {kind for kind, _name in objects}
    static = _by_key(_template(*VALUE_SETS["static-agent-tokens-no-labels"]))
    pod = static[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    kinds = {kind for kind, _name in static}
    assert not kinds & {"ServiceAccount", "ClusterRole", "ValidatingAdmissionPolicy"}


def _node(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"a": "1"}},
            "spec": {"podCIDR": "10.0.0.0/24", **spec}}  # fmt: skip


def _admits(old: dict[str, Any], new: dict[str, Any], extra: dict[str, list[str]]) -> list[str]:
    """The messages of the policy's validations that fail (CEL on cel-python: an emulation;
    the real apiserver is the integration test's)."""
    import celpy

    policy = _by_key(_template())[("ValidatingAdmissionPolicy", POLICY)]["spec"]
    user: dict[str, Any] = {"username": "system:serviceaccount:docker-variant:variant-agent"}
    if extra:
        user["extra"] = extra
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": "UPDATE", "userInfo": user}),
    }
    env = celpy.Environment()
    (condition,) = policy["matchConditions"]
    assert env.program(env.compile(condition["expression"])).evaluate(activation)
    failed = []
    for validation in policy["validations"]:
        result = env.program(env.compile(validation["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            failed.append(validation.get("message") or validation["messageExpression"])
    return failed


OLD_LABELS = {"kubernetes.io/hostname": "gpu-1", "variant.pep817.dev/x86_64.level": "3",
              "variant.pep817.dev/nvidia.sm_arch.90_real": "true"}  # fmt: skip
OWN = {NODE_NAME_KEY: ["gpu-1"]}


@pytest.mark.parametrize(
    ("labels", "spec", "annotations", "extra", "refused"),
    [
        # the agent's own patch: prefix labels added, changed, removed
        ({"kubernetes.io/hostname": "gpu-1", "variant.pep817.dev/x86_64.level": "4",
          "variant.pep817.dev/nvidia.sm_arch.9": "0"}, {}, None, OWN, None),
        (dict(OLD_LABELS), {}, None, OWN, None),
        # another node's
        ({**OLD_LABELS, "variant.pep817.dev/x86_64.level": "4"}, {}, None,
         {NODE_NAME_KEY: ["gpu-2"]}, "only the Node its pod runs on"),
        # a token bound to no node (no extra)
        ({**OLD_LABELS, "variant.pep817.dev/x86_64.level": "4"}, {}, None, {},
         "only the Node its pod runs on"),
        # other labels: changed, added, removed
        ({**OLD_LABELS, "kubernetes.io/hostname": "x"}, {}, None, OWN, "prefix"),
        ({**OLD_LABELS, "node-role.kubernetes.io/control-plane": ""}, {}, None, OWN, "prefix"),
        ({k: v for k, v in OLD_LABELS.items() if k != "kubernetes.io/hostname"}, {}, None,
         OWN, "prefix"),
        # a label that only looks like the prefix
        ({**OLD_LABELS, "variant.pep817.dev.evil/x": "1"}, {}, None, OWN, "prefix"),
        # the spec and the annotations
        (dict(OLD_LABELS), {"unschedulable": True}, None, OWN, "not its spec"),
        (dict(OLD_LABELS), {"taints": [{"key": "k", "effect": "NoSchedule"}]}, None, OWN,
         "not its spec"),
        (dict(OLD_LABELS), {}, {"a": "2"}, OWN, "not its spec"),
    ],
)  # fmt: skip
def test_the_policy_lets_the_agent_change_only_its_own_nodes_prefix_labels(
    labels: dict[str, str],
    spec: dict[str, Any],
    annotations: dict[str, str] | None,
    extra: dict[str, list[str]],
    refused: str | None,
) -> None:
    old = _node("gpu-1", dict(OLD_LABELS))
    new = _node("gpu-1", labels, **spec)
    if annotations is not None:
        new["metadata"]["annotations"] = annotations
    failed = _admits(old, new, extra)
    if refused is None:
        assert failed == []
    else:
        assert failed and all(refused in message for message in failed[:1]), failed


def _args(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in container["args"] if "=" in a)


def test_both_servers_run_with_their_connection_limits() -> None:
    """The chart passes each server's limits; the defaults are the servers' own, and the
    nginx front it carries times heads, bodies and idle connections as the proxy does."""
    from docker_variant.proxy.__main__ import LIMITS
    from docker_variant.scheduler.__main__ import _parser

    objects = _by_key(_template("proxy.limits.headTimeout=10", "scheduler.limits.keepAlive=7"))
    pods = {
        name: objects[("Deployment", name)]["spec"]["template"]["spec"]
        for name in ("variant-proxy", "variant-scheduler")
    }
    (proxy,) = [c for c in pods["variant-proxy"]["containers"] if c["name"] == "variant-proxy"]
    assert _args(proxy)["--head-timeout"] == "10"
    assert _args(pods["variant-scheduler"]["containers"][0])["--keep-alive"] == "7"
    defaults = _by_key(_template())
    proxy_spec = defaults[("Deployment", "variant-proxy")]["spec"]["template"]["spec"]
    (proxy,) = [c for c in proxy_spec["containers"] if c["name"] == "variant-proxy"]
    given = _args(proxy)
    assert int(given["--max-head-bytes"]) == LIMITS.max_head_bytes
    assert float(given["--head-timeout"]) == LIMITS.head_timeout
    assert float(given["--body-timeout"]) == LIMITS.body_timeout
    assert float(given["--keep-alive"]) == LIMITS.keep_alive
    assert int(given["--max-connections"]) == LIMITS.max_connections
    scheduler = defaults[("Deployment", "variant-scheduler")]["spec"]["template"]["spec"]
    given = _args(scheduler["containers"][0])
    serve = _parser().parse_args(["serve"])
    for flag, value in given.items():
        attribute = flag.removeprefix("--").replace("-", "_")
        if attribute in ("max_head_bytes", "head_timeout", "body_timeout", "keep_alive",
                         "max_connections"):  # fmt: skip
            assert float(value) == getattr(serve, attribute), flag
    front = defaults[("ConfigMap", "variant-proxy-nginx")]["data"]["variant-proxy.conf"]
    assert f"client_header_timeout {LIMITS.head_timeout:g}s;" in front
    assert f"client_body_timeout {LIMITS.body_timeout:g}s;" in front
    assert f"keepalive_timeout {LIMITS.keep_alive:g}s;" in front
    assert "large_client_header_buffers 4 64k;" in front  # 4 x 64k: the proxy's head
    assert LIMITS.max_head_bytes == 4 * 64 * 1024


def test_a_second_agent_keeps_containerd_hosts_as_root_without_capabilities() -> None:
    """The hosts.toml files are kept current by an agent that only does that (root, for the
    host's certs.d, with no capability and no agent token); the heartbeating agent stays
    unprivileged. Without containerdHosts neither the container nor the mount is there."""
    pod = _by_key(_template())[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    keeper, agent = containers["containerd-hosts"], containers["variant-agent"]
    assert keeper["image"] == agent["image"]  # the agent's image: variant-scheduler agent
    assert keeper["args"][:3] == [
        "--containerd-hosts=registry.example.internal:5000",  # scheduler.registries
        "--containerd-hosts-dir=/host/etc/containerd/certs.d",
        "--containerd-server=https://variant-proxy.example.internal:5080",
    ]
    assert not any(a.startswith(("--scheduler", "--label-node", "--token")) for a in keeper["args"])
    assert keeper["securityContext"]["runAsUser"] == 0
    assert keeper["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert agent["securityContext"]["runAsUser"] == 65534
    assert "tokens" not in {m["name"] for m in keeper["volumeMounts"]}
    assert "containerd-certs" not in {m["name"] for m in agent["volumeMounts"]}
    off = _by_key(_template(*VALUE_SETS["no-containerd-hosts"]))
    spec = off[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["variant-agent"]
    assert "containerd-certs" not in {v["name"] for v in spec["volumes"]}


def test_containerd_trusts_the_proxys_private_ca_and_presents_a_client_certificate() -> None:
    """With caBundle and clientCertSecret, the containerd-hosts agent is given both, mounted
    from their ConfigMap and Secret (the key readable by that container's root only); without
    them it is given neither, and mounts neither."""
    pod = _agent_pod(_by_key(_template(*VALUE_SETS["private-ca-proxy"])))
    keeper = _container(pod, "containerd-hosts")
    given = _args(keeper)
    ca = _mounted(pod, keeper, given["--containerd-ca-file"])
    assert ca["configMap"]["name"] == "variant-proxy-ca"
    assert given["--containerd-ca-file"].endswith("/ca.crt")
    for option in ("--containerd-client-cert", "--containerd-client-key"):
        volume = _mounted(pod, keeper, given[option])
        assert volume["secret"] == {"secretName": "variant-containerd-client", "defaultMode": 0o400}
    assert not any(a.startswith("--containerd") for a in _container(pod, "variant-agent")["args"])
    plain = _agent_pod(_by_key(_template()))
    assert not any("--containerd-c" in a for a in _container(plain, "containerd-hosts")["args"])
    assert {"proxy-ca", "containerd-client"}.isdisjoint(v["name"] for v in plain["volumes"])


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_the_real_apiserver_takes_the_agents_daemonset(values: str, kube_api: Any) -> None:
    """The rendered agent DaemonSet (its containers' arguments and every volume the values
    add: the CA bundles, the client certificates) created on the real v1.37.2 apiserver,
    strict field validation, as a dry run (no controller makes its pods)."""
    import kubeplane

    objects = _by_key(_template(*VALUE_SETS[values]))
    daemonset = objects.get(("DaemonSet", "variant-agent"))
    if daemonset is None:
        return  # agent.enabled=false renders none
    daemonset = {**daemonset, "metadata": {**daemonset["metadata"]}}
    daemonset["metadata"].pop("namespace", None)
    url = f"/apis/apps/v1/namespaces/{kubeplane.namespace_of(kube_api)}/daemonsets"
    answer = kube_api.post(
        url, json=daemonset, params={"fieldValidation": "Strict", "dryRun": "All"}
    )
    assert answer.status_code == 201, answer.text
    taken, rendered = (
        answer.json()["spec"]["template"]["spec"],
        daemonset["spec"]["template"]["spec"],
    )
    assert [c.get("args") for c in taken["containers"]] == [
        c.get("args") for c in rendered["containers"]
    ]
    assert [v["name"] for v in taken["volumes"]] == [v["name"] for v in rendered["volumes"]]


# --------------------------------------------------------------------------- notifications
def test_the_registry_is_told_to_notify_the_front_which_admits_only_its_addresses() -> None:
    objects = _by_key(_template("proxy.notify.allowFrom={10.244.0.0/16,fd00::/8}"))
    front = objects[("ConfigMap", "variant-proxy-nginx")]["data"]["variant-proxy.conf"]
    location = front[front.index("location = /_notify {") :]
    location = location[: location.index("\n    }")]
    rules = [
        line.strip() for line in location.splitlines() if line.strip().startswith(("allow", "deny"))
    ]
    # POST alone (limit_except), then loopback and the addresses given, then nobody else
    assert rules == ["deny all;", "allow 127.0.0.1;", "allow 10.244.0.0/16;", "allow fd00::/8;",
                     "deny all;"]  # fmt: skip
    config = objects[("ConfigMap", "variant-proxy-registry-notifications")]["data"]["config.yml"]
    (endpoint,) = yaml.safe_load(config)["notifications"]["endpoints"]
    service = objects[("Service", "variant-proxy")]["spec"]
    (https,) = [p["port"] for p in service["ports"] if p["name"] == "https"]
    assert (
        endpoint["url"] == f"https://variant-proxy.docker-variant.svc.cluster.local:{https}/_notify"
    )
    assert [h.split()[0] for h in endpoint["headers"]["Authorization"]] == ["Bearer"]
    assert (endpoint["timeout"], endpoint["threshold"], endpoint["backoff"]) == ("1s", 5, "1s")
    pod = objects[("Deployment", "variant-proxy")]["spec"]["template"]["spec"]
    (proxy,) = [c for c in pod["containers"] if c["name"] == "variant-proxy"]
    assert any(a.startswith("--notify-secret-file=") for a in proxy["args"])
    default = _by_key(_template())[("ConfigMap", "variant-proxy-nginx")]["data"]
    assert "allow 127.0.0.1;\n        # allow" in default["variant-proxy.conf"]  # loopback alone


@pytest.mark.parametrize("value", ["all", "10.0.0.0/8; allow all"])
def test_a_notify_address_that_is_no_address_is_refused_by_name(value: str) -> None:
    argv = [_tool("helm"), "template", "x", str(CHART), *_site_values_but(""), "--set-json",
            f"proxy.notify.allowFrom={json.dumps([value])}"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode != 0
    assert "proxy.notify.allowFrom" in result.stderr and value in result.stderr, result.stderr


def _mounted(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume behind the mount of ``container`` whose directory holds ``path``."""
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    return next(v for v in pod["volumes"] if v["name"] == mount["name"])


def test_the_agents_trust_the_schedulers_ca_and_mutual_tls_is_end_to_end() -> None:
    """Every agent trusts the private CA of the scheduler's certificate (--ca-file from the
    caBundle ConfigMap); with clientCA the scheduler requires client certificates, the agents
    present theirs, and the probes, which have none, only connect."""
    plain = _by_key(_template())
    agent_pod = plain[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    agent = agent_pod["containers"][0]
    ca_file = _args(agent)["--ca-file"]
    assert _mounted(agent_pod, agent, ca_file)["configMap"]["name"] == "variant-scheduler-ca"
    assert ca_file.endswith("/ca.crt") and "--client-cert" not in _args(agent)
    scheduler = plain[("Deployment", "variant-scheduler")]["spec"]["template"]["spec"]
    assert "--tls-client-ca" not in _args(scheduler["containers"][0])
    assert scheduler["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz"

    mutual = _by_key(_template(*VALUE_SETS["mutual-tls"]))
    scheduler = mutual[("Deployment", "variant-scheduler")]["spec"]["template"]["spec"]
    server = scheduler["containers"][0]
    client_ca = _args(server)["--tls-client-ca"]
    assert _mounted(scheduler, server, client_ca)["secret"]["secretName"] == (
        "variant-scheduler-client-ca"
    )
    for probe in ("livenessProbe", "readinessProbe"):
        assert server[probe]["tcpSocket"] == {"port": "https"} and "httpGet" not in server[probe]
    agent_pod = mutual[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    agent = agent_pod["containers"][0]
    given = _args(agent)
    for option in ("--client-cert", "--client-key"):
        volume = _mounted(agent_pod, agent, given[option])
        assert volume["secret"]["secretName"] == "variant-agent-client"


# --------------------------------------------------------------------------- agent identity
def _agent_pod(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = objects[("DaemonSet", "variant-agent")]["spec"]["template"]["spec"]
    return pod


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name)


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_no_agent_pod_mounts_a_secret_of_node_tokens(values: str) -> None:
    """Under every option the agents' pods mount no Secret but the client certificates
    (the agent's, for mutual TLS; containerd's, for the proxy): no pod can read another
    node's token."""
    objects = _by_key(_template(*VALUE_SETS[values]))
    if ("DaemonSet", "variant-agent") not in objects:
        return
    pod = _agent_pod(objects)
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    secrets |= {
        source["secret"]["name"]
        for v in pod["volumes"]
        for source in v.get("projected", {}).get("sources", [])
        if "secret" in source
    }
    assert secrets <= {"variant-agent-client", "variant-containerd-client"}, secrets
    agent = _container(pod, "variant-agent")
    token = _mounted(pod, agent, _args(agent)["--token-file"])
    assert "secret" not in token and token["name"] == "agent-token"
    for container in pod["containers"]:  # the containerd-hosts keeper has no token
        if container is not agent:
            assert "agent-token" not in {m["name"] for m in container["volumeMounts"]}


def test_agents_prove_themselves_with_a_projected_token_the_scheduler_reviews() -> None:
    """By default (agent.auth kubernetes) the agent's --token-file is its pod's projected
    ServiceAccount token of the scheduler's audience; the scheduler runs with --agent-auth
    kubernetes naming that ServiceAccount, as its own ServiceAccount, which may create
    TokenReviews and nothing else."""
    from docker_variant.scheduler.kubeauth import AUDIENCE

    objects = _by_key(_template())
    pod = _agent_pod(objects)
    agent = _container(pod, "variant-agent")
    token_file = _args(agent)["--token-file"]
    (source,) = _mounted(pod, agent, token_file)["projected"]["sources"]
    projected = source["serviceAccountToken"]
    assert projected["audience"] == AUDIENCE
    assert 600 <= projected["expirationSeconds"] <= 86400  # the kubelet's bounds, a day at most
    assert token_file.endswith("/" + projected["path"])

    scheduler = objects[("Deployment", "variant-scheduler")]["spec"]["template"]["spec"]
    given = _args(scheduler["containers"][0])
    assert given["--agent-auth"] == "kubernetes"
    assert given["--agent-service-account"] == f"docker-variant/{pod['serviceAccountName']}"
    assert ("ServiceAccount", pod["serviceAccountName"]) in objects
    assert scheduler["serviceAccountName"] == "variant-scheduler"
    assert scheduler["automountServiceAccountToken"] is True  # the apiserver's client
    assert ("ServiceAccount", "variant-scheduler") in objects
    (binding,) = [
        b for k, b in objects.items()
        if k[0] == "ClusterRoleBinding" and b["subjects"][0]["name"] == "variant-scheduler"
    ]  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "variant-scheduler", "namespace": "docker-variant"}
    ]
    role = objects[("ClusterRole", binding["roleRef"]["name"])]
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
         "verbs": ["create"]}
    ]  # fmt: skip


def test_static_agent_tokens_come_from_each_nodes_own_disk() -> None:
    """agent.auth tokens keeps tokens.toml's agent tokens: each pod reads its own node's
    from a host directory, and the scheduler has neither --agent-auth kubernetes nor any
    Kubernetes identity."""
    objects = _by_key(_template(*VALUE_SETS["static-agent-tokens"], "agent.tokenHostDir=/srv/t"))
    pod = _agent_pod(objects)
    agent = _container(pod, "variant-agent")
    token_file = _args(agent)["--token-file"]
    volume = _mounted(pod, agent, token_file)
    assert volume["hostPath"] == {"path": "/srv/t", "type": "Directory"}
    assert token_file.endswith("/token")
    scheduler = objects[("Deployment", "variant-scheduler")]["spec"]["template"]["spec"]
    assert "--agent-auth" not in _args(scheduler["containers"][0])
    assert scheduler["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in scheduler
    assert ("ServiceAccount", "variant-scheduler") not in objects


def test_an_unknown_agent_auth_is_refused_by_name() -> None:
    argv = [_tool("helm"), "template", "x", str(CHART), "--set", "agent.auth=secret"]
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode != 0
    assert "agent.auth" in result.stderr and '"secret"' in result.stderr, result.stderr


def test_the_readme_says_what_the_chart_brings() -> None:
    """The README's account of the chart names each server it runs a third party's image of
    (nginx, Redis) and says that the registry and the database are the site's own."""
    readme = (REPO / "README.md").read_text().replace("\n", " ")
    told = readme[readme.index("a Helm chart (`deploy/helm/docker-variant/`") :]
    told = told[: told.index(") with a kustomize base")]
    images = {
        c["image"].split("/")[-1].split(":")[0]
        for d in _template()
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert {"nginx-unprivileged", "redis"} <= images and not images & {"postgres", "registry"}
    assert "nginx" in told and "Redis" in told
    assert "deploys no registry and no database" in told, told
