"""Agent identity in Kubernetes (issue 42), on the real v1.37.2 control plane: an agent
proves itself with a ServiceAccount token bound to its pod, minted by the real apiserver
(TokenRequest); ``variant-scheduler serve --agent-auth kubernetes`` reviews it (TokenReview)
and lets it report for the Node its pod is bound to only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

import devstack
import kubeplane
from docker_variant.scheduler.kubeauth import AUDIENCE
from test_scheduler_support import H200_R570, agent_body

CLIENT_TOKENS = '[[token]]\nrole = "client"\nname = "ci"\ntoken = "client-token-0123456789"\n'


def _minted(client: httpx.Client, namespace: str, pod: dict[str, Any], audience: str) -> str:
    """A token of the ``variant-agent`` ServiceAccount bound to ``pod``, as the kubelet
    projects it into the pod's volume."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    answer = client.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/variant-agent/token", json=request
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["status"]["token"])


def test_an_agent_reports_for_its_pods_node_only(
    kube: Any, kube_api: httpx.Client, tmp_path: Path
) -> None:
    namespace = kubeplane.namespace_of(kube_api)
    kubeplane.make_ready(
        kube_api, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
    )
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "variant-agent"}}
    created = kube_api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", json=account)
    assert created.status_code == 201, created.text
    pod = kubeplane.create(
        kube_api,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "agent-a"},
            "spec": {
                "serviceAccountName": "variant-agent",
                "nodeName": "node-a",  # bound, as the DaemonSet's pod is
                "containers": [{"name": "agent", "image": "variant-agent"}],
            },
        },
        namespace,
    )
    token = _minted(kube_api, namespace, pod, AUDIENCE)
    other_audience = _minted(kube_api, namespace, pod, "https://kubernetes.default.svc")

    (tmp_path / "tokens.toml").write_text(CLIENT_TOKENS)
    service = devstack.start_scheduler(
        tmp_path / "s",
        extra=[
            "--tokens", str(tmp_path / "tokens.toml"),
            "--agent-auth", "kubernetes",
            "--agent-service-account", f"{namespace}/variant-agent",
            "--kubeconfig", str(kube.kubeconfig),
        ],
    )  # fmt: skip

    def report(node: str, bearer: str) -> httpx.Response:
        return httpx.put(
            f"{service.url}/v1/agents/{node}",
            json=agent_body(H200_R570, 1),
            headers={"Authorization": f"Bearer {bearer}"},
        )

    try:
        assert report("node-a", token).status_code == 200
        refused = report("node-b", token)
        assert refused.status_code == 403, refused.text
        assert "'node-a' may not report 'node-b'" in refused.text
        assert report("node-a", "garbage-token-0123456789").status_code == 401
        assert report("node-a", other_audience).status_code == 401
        # a token of the client table is no agent's
        assert report("node-a", "client-token-0123456789").status_code == 403
        agents = httpx.get(
            f"{service.url}/v1/agents",
            headers={"Authorization": "Bearer client-token-0123456789"},
        ).json()["agents"]
        assert [a["agent_id"] for a in agents] == ["node-a"]
        assert token not in service.log_tail(100_000)
    finally:
        service.stop()
