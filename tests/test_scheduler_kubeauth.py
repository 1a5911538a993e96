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
from docker_variant.scheduler.kubeauth import AUDIENCE, NODE_NAME_EXTRA
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


def _agent_pod_on_node_a(
    kube_api: httpx.Client, namespace: str, name: str, **spec: Any
) -> dict[str, Any]:
    """A pod of the agents' ServiceAccount bound to the ready Node node-a, as the
    DaemonSet's pod is (``spec``: more of its spec)."""
    kubeplane.make_ready(
        kube_api, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": "variant-agent",
            "nodeName": "node-a",
            "containers": [{"name": "agent", "image": "variant-agent"}],
            **spec,
        },
    }
    return kubeplane.create(kube_api, pod, namespace)


def test_an_agent_reports_for_its_pods_node_only(
    kube: Any, kube_api: httpx.Client, tmp_path: Path
) -> None:
    namespace = kubeplane.namespace_of(kube_api)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "variant-agent"}}
    created = kube_api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", json=account)
    assert created.status_code == 201, created.text
    pod = _agent_pod_on_node_a(kube_api, namespace, "agent-a")
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


KUBERNETES_BASE = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
RBAC_COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/docker-variant/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


def _apply_identities(client: httpx.Client) -> list[str]:
    """The chart's ServiceAccounts and RBAC (the base's rendering), created with strict field
    validation where absent (another test may have made the agent's); the URLs it made."""
    import yaml

    if client.get("/api/v1/namespaces/docker-variant").status_code == 404:
        kubeplane.create(
            client,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "docker-variant"}},
        )
    made = []
    for name in ("agent-rbac.yaml", "scheduler-rbac.yaml"):
        for document in yaml.safe_load_all((KUBERNETES_BASE / name).read_text()):
            collection = RBAC_COLLECTIONS[document["kind"]]
            answer = client.post(collection, json=document, params={"fieldValidation": "Strict"})
            assert answer.status_code in (201, 409), answer.text
            if answer.status_code == 201:
                made.append(f"{collection}/{document['metadata']['name']}")
    return made


def _review_as(kube: Any, account: str, token: str) -> httpx.Response:
    """A TokenReview of ``token`` created as the ServiceAccount ``account`` of the chart's
    namespace (impersonated by the admin)."""
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": [AUDIENCE]},
    }
    with kube.client() as client:
        client.headers["Impersonate-User"] = f"system:serviceaccount:docker-variant:{account}"
        client.headers["Impersonate-Group"] = "system:serviceaccounts"
        return client.post("/apis/authentication.k8s.io/v1/tokenreviews", json=review)


def test_the_charts_scheduler_account_may_review_the_charts_agents_tokens(
    kube: Any, kube_api: httpx.Client
) -> None:
    """deploy/kubernetes/ (the chart's defaults) on the real apiserver: the scheduler's
    ServiceAccount may create TokenReviews, and reviews a token of the agents' ServiceAccount
    bound to a pod on node-a as that Node's; the agents' ServiceAccount may not review."""
    made = _apply_identities(kube_api)
    try:
        pod = _agent_pod_on_node_a(
            kube_api, "docker-variant", "chart-agent-a", automountServiceAccountToken=False
        )
        token = _minted(kube_api, "docker-variant", pod, AUDIENCE)
        reviewed = _review_as(kube, "variant-scheduler", token)
        assert reviewed.status_code == 201, reviewed.text
        status = reviewed.json()["status"]
        assert status["authenticated"] is True
        assert status["user"]["username"] == "system:serviceaccount:docker-variant:variant-agent"
        assert status["user"]["extra"][NODE_NAME_EXTRA] == ["node-a"]
        refused = _review_as(kube, "variant-agent", token)
        assert refused.status_code == 403, refused.text
    finally:
        kubeplane.delete_all(kube_api, "Pod", "docker-variant")
        for url in made:
            kube_api.delete(url)
