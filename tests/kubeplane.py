"""Talking to the real control plane of ``devtools/kubecluster.py`` in the tests: create
objects with ``fieldValidation=Strict`` (as ``kubectl apply --validate=strict``), read them
back, make Nodes Ready, and await what the scheduler and the controllers do.

Plain REST over the cluster's own ``httpx`` client: the tests check objects as the apiserver
sees them, whatever client the product uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

# kind -> (API path prefix, resource, namespaced): the kinds the tests create.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Workload": ("/apis/scheduling.k8s.io/v1beta1", "workloads", True),
    "PodGroup": ("/apis/scheduling.k8s.io/v1beta1", "podgroups", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}


class ApiError(Exception):
    """The apiserver refused a request: its HTTP status and its Status message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def collection(kind: str, namespace: str | None = None) -> str:
    prefix, resource, namespaced = KINDS[kind]
    if namespaced:
        if namespace is None:
            raise ValueError(f"{kind} is namespaced: give a namespace")
        return f"{prefix}/namespaces/{namespace}/{resource}"
    return f"{prefix}/{resource}"


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise ApiError(response.status_code, message)
    body: dict[str, Any] = response.json()
    return body


def create(
    client: httpx.Client, obj: Mapping[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    """POST ``obj``; an unknown or duplicate field is an error, not a warning."""
    kind = obj["kind"]
    ns = obj.get("metadata", {}).get("namespace") or namespace
    url = collection(kind, ns if KINDS[kind][2] else None)
    return _answer(client.post(url, json=obj, params={"fieldValidation": "Strict"}))


def create_all(
    client: httpx.Client, objs: Iterable[Mapping[str, Any]], namespace: str | None = None
) -> list[dict[str, Any]]:
    return [create(client, obj, namespace) for obj in objs]


def get(client: httpx.Client, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    return _answer(client.get(f"{collection(kind, namespace)}/{name}"))


def items(client: httpx.Client, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = _answer(client.get(collection(kind, namespace)))["items"]
    return found


def delete_all(client: httpx.Client, kind: str, namespace: str | None = None) -> None:
    """Delete every object of ``kind`` now (grace period 0: no kubelet would confirm it)."""
    for obj in items(client, kind, namespace):
        response = client.delete(
            f"{collection(kind, namespace)}/{obj['metadata']['name']}",
            params={"gracePeriodSeconds": "0"},
        )
        if response.status_code not in (200, 202, 404):
            _answer(response)


def make_ready(client: httpx.Client, node: Mapping[str, Any]) -> dict[str, Any]:
    """Create ``node`` and mark it Ready through its status, as a kubelet would."""
    created = create(client, {k: v for k, v in node.items() if k != "status"})
    status = dict(node.get("status") or {})
    capacity = status.get("capacity") or {"cpu": "64", "memory": "512Gi", "pods": "110"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    created["status"] = {
        "capacity": capacity,
        "allocatable": status.get("allocatable") or capacity,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "created Ready by the tests (no kubelet)",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }
    name = created["metadata"]["name"]
    ready = _answer(client.put(f"/api/v1/nodes/{name}/status", json=created))
    # The apiserver taints a new Node not-ready (TaintNodesByCondition); the node lifecycle
    # controller lifts it once the kubelet reports Ready. Lift it as that controller would.
    taints = [
        t for t in ready["spec"].get("taints", []) if t["key"] != "node.kubernetes.io/not-ready"
    ]
    return _answer(
        client.patch(
            f"/api/v1/nodes/{name}",
            json={"spec": {"taints": taints or None}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    )


def await_value(read: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    """Poll ``read`` until it returns something other than None (the scheduler and the
    controllers act asynchronously); fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
