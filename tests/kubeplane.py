"""Talking to the real control plane of ``devtools/kubecluster.py`` in the tests: create
objects with ``fieldValidation=Strict`` (as ``kubectl apply --validate=strict``), read them
back, make Nodes Ready, and await what the scheduler and the controllers do; load the
cluster fixtures, run ``docker-variant`` and the Kubernetes page's commands. Every
real-control-plane test file shares these helpers.

Plain REST over the cluster's own ``httpx`` client: the tests check objects as the apiserver
sees them, whatever client the product uses.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from clirun import run_cli

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
KUBERNETES_PAGE = REPO / "docs" / "reference" / "kubernetes.md"
CLUSTER = REPO / "tests" / "fixtures" / "k8s"  # Nodes and slices as the DRA drivers publish them
# The kinds a test's namespace holds, deleted in this order (a Job's pods, then claims).
NAMESPACED = ("Job", "Pod", "ResourceClaimTemplate", "ResourceClaim", "PodGroup", "Workload")

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


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``docker-variant ARGS`` in a fresh interpreter, from the repository's root (the
    Kubernetes page's relative paths)."""
    return run_cli(*args, env={"COLUMNS": "200"}, timeout=120, cwd=REPO)


def printed(*args: str) -> list[dict[str, Any]]:
    """The objects a ``docker-variant`` command prints (YAML documents)."""
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def sh_block(heading: str) -> str:
    """The first ``sh`` block under ``heading`` in the Kubernetes page: the commands the
    tests run verbatim."""
    page = KUBERNETES_PAGE.read_text()
    section = page[page.index(heading) :]
    block = section[section.index("```sh\n") + 6 :]
    return block[: block.index("```")]


def clear_namespace(client: httpx.Client, namespace: str) -> None:
    """Delete what a test made in ``namespace`` and await its claims' going (they carry the
    ResourceClaim controller's finalizer until their pods are gone)."""
    for kind in NAMESPACED:
        delete_all(client, kind, namespace)
    await_value(
        lambda: True if not items(client, "ResourceClaim", namespace) else None,
        f"the ResourceClaims of {namespace} to be deleted",
    )


def load_nodes(client: httpx.Client, *names: str) -> None:
    """The device classes, then each named node (Ready) with its drivers' ResourceSlices."""
    if not items(client, "DeviceClass"):
        create_all(client, yaml.safe_load_all((CLUSTER / "deviceclasses.yaml").read_text()))
    for name in names:
        for obj in yaml.safe_load_all((CLUSTER / f"{name}.yaml").read_text()):
            if obj["kind"] == "Node":
                make_ready(client, obj)
            else:
                create(client, obj)


def pod(name: str, template: str, node: str | None = None, image: str = "app") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": image, "resources": {"claims": [{"name": "gpus"}]}}
        ],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def namespace_of(client: httpx.Client) -> str:
    return client.headers["X-Test-Namespace"]


def allocation(client: httpx.Client, pod_name: str) -> tuple[str, dict[str, Any]]:
    """Await the pod's binding and its claim's allocation: (node, claim)."""
    ns = namespace_of(client)

    def bound() -> tuple[str, dict[str, Any]] | None:
        current = get(client, "Pod", pod_name, ns)
        node = current["spec"].get("nodeName")
        statuses = current.get("status", {}).get("resourceClaimStatuses") or []
        if not node or not statuses:
            return None
        claim = get(client, "ResourceClaim", statuses[0]["resourceClaimName"], ns)
        if not claim.get("status", {}).get("allocation"):
            return None
        return node, claim

    return await_value(bound, f"pod {pod_name} to be bound with its claim allocated")


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return found


def unschedulable(client: httpx.Client, pod_name: str) -> str:
    """Await the scheduler's verdict that the pod cannot be placed: its message."""
    ns = namespace_of(client)

    def refused() -> str | None:
        current = get(client, "Pod", pod_name, ns)
        assert not current["spec"].get("nodeName"), f"{pod_name} was bound"
        for condition in current.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", ""))
        return None

    return await_value(refused, f"pod {pod_name} to be found unschedulable")


def variant_of(claim: dict[str, Any], subrequest: str) -> str:
    """The variant a claim's subrequest stands for, from the mapping the template put in
    ``spec.metadata`` (the controller copies it into every claim)."""
    mapping = json.loads(claim["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    (label,) = [labels[0] for name, labels in mapping.items() if name == subrequest]
    return str(label)


def device_of(client: httpx.Client, result: dict[str, Any]) -> dict[str, Any]:
    """The ResourceSlice device an allocation result names."""
    for slice_ in items(client, "ResourceSlice"):
        if slice_["spec"]["pool"]["name"] == result["pool"]:
            for device in slice_["spec"]["devices"]:
                if device["name"] == result["device"]:
                    found: dict[str, Any] = device
                    return found
    raise AssertionError(f"no device {result}")


def product_of(client: httpx.Client, result: dict[str, Any]) -> str:
    attributes = device_of(client, result)["attributes"]
    return str(attributes["productName"]["string"])
