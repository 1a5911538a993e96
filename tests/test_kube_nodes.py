"""Node labels on the real v1.37.2 control plane: the affinity ``k8s.labels.node_affinity``
writes is obeyed by the real kube-scheduler exactly where a variant fits the node; the agent
(``variant-scheduler agent --label-node``) keeps its own Node's labels through the real
apiserver; and the chart's ValidatingAdmissionPolicy confines the agent's ServiceAccount to
its own Node's ``variant.pep817.dev/`` labels, as the kubelet's NodeRestriction would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml

import kubeplane
from docker_variant.k8s.labels import LABEL_PREFIX, node_affinity, node_labels
from docker_variant.variant import VariantIndex, select

REPO = Path(__file__).resolve().parent.parent
HOSTS = REPO / "examples" / "hosts"
PYTORCH = REPO / "examples" / "pytorch-2.12.0.json"
POLICY = REPO / "deploy" / "kubernetes" / "agent-node-policy.yaml"
RBAC = REPO / "deploy" / "kubernetes" / "agent-rbac.yaml"
AGENT_USER = "system:serviceaccount:docker-variant:variant-agent"

pytestmark = pytest.mark.kube


def host_lists(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document.get("host", document) if "devices" in document else document


def ready_node(client: httpx.Client, name: str, labels: dict[str, str]) -> None:
    kubeplane.make_ready(
        client,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        },
    )


def _pod_state(client: httpx.Client, ns: str, name: str) -> str | None:
    current = kubeplane.get(client, "Pod", name, ns)
    if current["spec"].get("nodeName"):
        return "bound"
    for condition in current.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return "unschedulable"
    return None


def test_the_real_scheduler_places_by_affinity_exactly_where_a_variant_fits(
    kube_api: httpx.Client,
) -> None:
    """Each example host becomes a Node with ``node_labels``; each variant of the pytorch
    example becomes a pod with ``node_affinity``, pinned to one Node: the real scheduler
    binds it exactly when ``select`` finds the variant compatible with that host."""
    ns = kube_api.headers["X-Test-Namespace"]
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), str(PYTORCH))
    hosts = {path.stem: host_lists(path) for path in sorted(HOSTS.glob("*.json"))}
    for name, lists in hosts.items():
        labels = node_labels(lists).labels
        assert len(labels) <= 20, (name, len(labels))
        ready_node(kube_api, name, labels)
    expected: dict[str, str] = {}
    for host, lists in hosts.items():
        fits = {c.label for c in select(index, lists).ranked}
        for variant in index.variants.values():
            if variant.is_null:
                continue
            affinity = node_affinity(variant.properties)
            assert affinity is not None
            name = f"{variant.label}-on-{host}"
            kubeplane.create(
                kube_api,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "containers": [{"name": "main", "image": "app"}],
                        "nodeSelector": {"kubernetes.io/hostname": host},
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": affinity
                            }
                        },
                    },
                },
                ns,
            )
            expected[name] = "bound" if variant.label in fits else "unschedulable"
    assert set(expected.values()) == {"bound", "unschedulable"}
    seen = {
        name: kubeplane.await_value(lambda n=name: _pod_state(kube_api, ns, n), f"pod {name}")
        for name in expected
    }
    assert seen == expected


def test_the_agent_keeps_its_nodes_labels_through_the_real_apiserver(
    kube: Any, kube_api: httpx.Client, tmp_path: Path
) -> None:
    """``variant-scheduler agent --label-node`` (lightkube) sets its Node's labels, leaves
    the others alone, and replaces stale ones of the prefix."""
    ready_node(kube_api, "gpu-1", {"team": "a", f"{LABEL_PREFIX}/nvidia.stale": "1"})
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "docker_variant.scheduler",
            "agent",
            "--label-node",
            "--node-name",
            "gpu-1",
            "--kubeconfig",
            str(kube.kubeconfig),
            "--providers-file",
            str(HOSTS / "h200-r570.json"),
            "--interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    want = node_labels(host_lists(HOSTS / "h200-r570.json")).labels
    try:

        def labelled() -> dict[str, str] | None:
            labels: dict[str, str] = kubeplane.get(kube_api, "Node", "gpu-1")["metadata"]["labels"]
            ours = {k: v for k, v in labels.items() if k.startswith(f"{LABEL_PREFIX}/")}
            return labels if ours == want else None

        labels = kubeplane.await_value(labelled, "the agent's labels on gpu-1")
    finally:
        agent.terminate()
        output = agent.communicate(timeout=30)[0].decode(errors="replace")
    assert labels["team"] == "a", output
    assert f"{LABEL_PREFIX}/nvidia.stale" not in labels


def _as_agent(kube: Any, node: str | None) -> httpx.Client:
    """The admin's client impersonating the agent's ServiceAccount, with the node name a
    pod-bound token carries (``None``: a token bound to no pod)."""
    client = kube.client()
    client.headers["Impersonate-User"] = AGENT_USER
    client.headers["Impersonate-Group"] = "system:serviceaccounts"
    if node is not None:
        key = quote("authentication.kubernetes.io/node-name", safe="")
        client.headers[f"Impersonate-Extra-{key}"] = node
    return client


def _patch(client: httpx.Client, node: str, patch: dict[str, Any]) -> httpx.Response:
    return client.patch(
        f"/api/v1/nodes/{node}",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )


def test_the_policy_confines_the_agent_to_its_own_nodes_labels(
    kube: Any, kube_api: httpx.Client
) -> None:
    """The chart's policy and RBAC, created on the real apiserver: the agent may set its own
    Node's prefixed labels and nothing else."""
    if not kubeplane.items(kube_api, "Namespace") or "docker-variant" not in {
        n["metadata"]["name"] for n in kubeplane.items(kube_api, "Namespace")
    }:
        kubeplane.create(
            kube_api,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "docker-variant"}},
        )
    for document in [
        *yaml.safe_load_all(RBAC.read_text()),
        *yaml.safe_load_all(POLICY.read_text()),
    ]:
        if not document:
            continue
        kind = document["kind"]
        if kind == "ServiceAccount":
            kube_api.post(
                "/api/v1/namespaces/docker-variant/serviceaccounts",
                json=document,
                params={"fieldValidation": "Strict"},
            ).raise_for_status()
        elif kind in ("ClusterRole", "ClusterRoleBinding"):
            kube_api.post(
                f"/apis/rbac.authorization.k8s.io/v1/{kind.lower()}s",
                json=document,
                params={"fieldValidation": "Strict"},
            ).raise_for_status()
        else:
            kubeplane.create(kube_api, document)
    ready_node(kube_api, "own", {"team": "a"})
    ready_node(kube_api, "other", {"team": "a"})
    label = {"metadata": {"labels": {f"{LABEL_PREFIX}/nvidia.sm_arch.9": "0"}}}
    try:
        with _as_agent(kube, "own") as agent:
            # The policy takes effect once the apiserver has loaded it: await the first denial.
            denied = kubeplane.await_value(
                lambda: r if (r := _patch(agent, "other", label)).status_code >= 400 else None,
                "the policy to deny a patch of another Node",
            )
            assert denied.status_code == 403, denied.text
            assert "only the Node its pod runs on" in denied.text
            allowed = _patch(agent, "own", label)
            assert allowed.status_code == 200, allowed.text
            relabel = _patch(agent, "own", {"metadata": {"labels": {"team": "b"}}})
            assert relabel.status_code == 403 and "variant.pep817.dev/" in relabel.text
            cordon = _patch(agent, "own", {"spec": {"unschedulable": True}})
            assert cordon.status_code == 403, cordon.text
        with _as_agent(kube, None) as unbound:
            assert _patch(unbound, "own", label).status_code == 403
    finally:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            kube_api.delete(
                f"/apis/admissionregistration.k8s.io/v1/{kind}/variant-agent-own-node-labels"
            )
    node = kubeplane.get(kube_api, "Node", "own")
    assert node["metadata"]["labels"]["team"] == "a"
    assert node["metadata"]["labels"][f"{LABEL_PREFIX}/nvidia.sm_arch.9"] == "0"
    assert not node["spec"].get("unschedulable")


def test_the_pages_node_label_command_runs_verbatim(
    kube: Any, kube_api: httpx.Client, tmp_path: Path
) -> None:
    """ "Labels the agent keeps": the page's by-hand command, run as written with kubectl on
    the real control plane, gives the Node exactly ``node_labels``."""
    kubectl = REPO / ".cache" / "k8s-tools" / "kubectl"
    if not kubectl.is_file():
        pytest.skip("kubectl comes from scripts/k8s-tools (run by scripts/setup)")
    ready_node(kube_api, "by-hand", {})
    (tmp_path / "node.json").write_text((HOSTS / "h200-r570.json").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(kubectl)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", kubeplane.sh_block("### Labels the agent keeps")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "KUBECONFIG": str(kube.kubeconfig),
            "NODE": "by-hand",
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
    )
    assert done.returncode == 0, done.stderr
    labels = kubeplane.get(kube_api, "Node", "by-hand")["metadata"]["labels"]
    ours = {k: v for k, v in labels.items() if k.startswith(f"{LABEL_PREFIX}/")}
    assert ours == node_labels(host_lists(HOSTS / "h200-r570.json")).labels
