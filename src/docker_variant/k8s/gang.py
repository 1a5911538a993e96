"""A gang on Kubernetes: one variant for every pod of a multi-node job (docs/reference/kubernetes.md).

A DRA claim is allocated node by node: a Job's pods with the ``k8s claim`` template get
``cu128`` on H100 nodes and ``cu126`` on A100 nodes. Here the choice is made once, for the
whole gang, by the pure planner ``variant-scheduler`` uses (``planner.placement.plan``),
fed from the cluster instead of heartbeats:

- each Node is an agent; its host lists are what its ``variant.pep817.dev/`` labels say
  (``labels.host_lists``), its platform its ``kubernetes.io/os`` and ``kubernetes.io/arch``;
  a cordoned Node, or one tainted ``NoSchedule``/``NoExecute``, is left out, with the reason;
- each device of its ResourceSlices (the newest generation of each pool) is a device of
  its driver's name, its lists read back from its attributes by the vendor's hook
  (``DraMapping.device_lists``: NVIDIA's CUDA driver and compute capability, AMD's device
  ID and driver version); what is not a whole GPU is left out, as the claims leave it out;
- a device is free unless a ResourceClaim's ``status.allocation`` holds it.

The gang is planned on each product's devices alone first (as the scheduler plans resource
groups: ``best_plan`` picks), so that its devices are one product where possible; only when
no product can take it alone is it planned on all devices of a driver (one variant still,
on compatible products). ``gang_objects`` then writes what holds the gang to that choice:
an exact DRA request for the chosen variant (and product), the image pinned by digest, node
affinity for the variant's CPU properties, pod anti-affinity (one pod a node, as planned),
and a Workload and PodGroup whose gang policy admits all ``pods`` or none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.k8s.claim import (
    ANNOTATION_PREFIX,
    REQUEST_NAME,
    check_dns_subdomain,
    plan_claim,
)
from docker_variant.k8s.labels import host_lists, node_affinity
from docker_variant.planner.placement import (
    BARE,
    Judge,
    Plan,
    Refusal,
    best_plan,
    candidate_key,
    merged_reasons,
    plan,
)
from docker_variant.planner.pool import AgentReport, Node, Pool, build_pool
from docker_variant.variant import Variant, VariantIndex
from docker_variant.variant.model import SupportedLists

__all__ = [
    "CLAIM_NAME",
    "GANG_LABEL",
    "MAX_PODS",
    "POD_GROUP_TEMPLATE",
    "Cluster",
    "Gang",
    "cluster_objects",
    "gang_objects",
    "plan_gang",
    "read_cluster",
]

MAX_PODS = 10_000  # pods of one gang, as the scheduler's nodes of one placement
WORKLOAD_API = "scheduling.k8s.io/v1beta1"  # served by 1.37 with the GenericWorkload gate
POD_GROUP_TEMPLATE = "workers"
CLAIM_NAME = "gpus"  # the pod's name for its claim
GANG_LABEL = f"{ANNOTATION_PREFIX}/gang"
_NO_SCHEDULE = ("NoSchedule", "NoExecute")
_HOSTNAME = "kubernetes.io/hostname"

DeviceKey = tuple[str, str, str]  # (node, driver, device id)


@dataclass(frozen=True)
class Cluster:
    """What ``read_cluster`` read: one report per schedulable Node, its devices by driver."""

    reports: tuple[AgentReport, ...]
    allocated: frozenset[DeviceKey]
    products: Mapping[DeviceKey, str]  # the device's productName ('' when it has none)
    unavailable: Mapping[str, str] = field(default_factory=dict)  # node -> why left out


def cluster_objects(documents: Iterable[object]) -> Iterator[Mapping[str, Any]]:
    """The objects of YAML/JSON documents as ``kubectl get -o yaml`` writes them: single
    objects, or Lists (``kind: List``, ``NodeList``...) of them; anything else is skipped."""
    for document in documents:
        if not isinstance(document, Mapping):
            continue
        items = document.get("items")
        if str(document.get("kind", "")).endswith("List") and isinstance(items, list):
            yield from cluster_objects(items)
        elif isinstance(document.get("kind"), str):
            yield document


def _vendor_of(driver: str) -> str | None:
    """The namespace whose DRA driver is ``driver`` and whose devices read back to lists."""
    for vendor in vendors.registered():
        dra = vendor.dra
        if dra is not None and dra.device_class == driver and dra.device_lists is not None:
            return vendor.namespace
    return None


def _attributes(driver: str, attributes: object) -> dict[str, str]:
    """A device's attributes of its own driver's domain, as text (``version`` ones too)."""
    found: dict[str, str] = {}
    if not isinstance(attributes, Mapping):
        return found
    for name, typed in attributes.items():
        domain, slash, short = str(name).rpartition("/")
        if (slash and domain != driver) or not isinstance(typed, Mapping) or not typed:
            continue
        value = next(iter(typed.values()))
        found[short] = str(value).lower() if isinstance(value, bool) else str(value)
    return found


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _unavailable(node: Mapping[str, Any]) -> str | None:
    spec = _spec(node)
    if spec.get("unschedulable"):
        return "cordoned (spec.unschedulable)"
    for taint in spec.get("taints") or ():
        if isinstance(taint, Mapping) and taint.get("effect") in _NO_SCHEDULE:
            return f"tainted {taint.get('key')}:{taint.get('effect')}"
    return None


def _platform(labels: Mapping[str, str]) -> str | None:
    os_name, arch = labels.get("kubernetes.io/os"), labels.get("kubernetes.io/arch")
    return f"{os_name}/{arch}" if os_name and arch else None


def read_cluster(objects: Iterable[Mapping[str, Any]]) -> Cluster:
    """Nodes, ResourceSlices and ResourceClaims as a pool's reports (see the module docstring)."""
    nodes: dict[str, Mapping[str, Any]] = {}
    slices: list[Mapping[str, Any]] = []
    claims: list[Mapping[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Node" and (name := _metadata(obj).get("name")):
            nodes[str(name)] = obj
        elif kind == "ResourceSlice":
            slices.append(obj)
        elif kind == "ResourceClaim":
            claims.append(obj)
    # only the newest generation of a pool counts (the driver replaces its slices)
    newest: dict[tuple[str, str], int] = {}
    for piece in slices:
        spec = _spec(piece)
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver")), str(pool.get("name")))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    devices: dict[str, dict[str, dict[str, SupportedLists]]] = {}
    products: dict[DeviceKey, str] = {}
    where: dict[tuple[str, str, str], DeviceKey] = {}  # (driver, pool, device) -> key
    for piece in slices:
        spec = _spec(piece)
        driver, node = str(spec.get("driver")), spec.get("nodeName")
        pool = spec.get("pool") or {}
        namespace = _vendor_of(driver)
        if not node or str(node) not in nodes or namespace is None:
            continue  # devices of no one node, or of a driver no variant is built for
        if int(pool.get("generation") or 0) < newest[(driver, str(pool.get("name")))]:
            continue
        dra = vendors.for_namespace(namespace).dra
        assert dra is not None and dra.device_lists is not None
        for device in spec.get("devices") or ():
            if not isinstance(device, Mapping) or not device.get("name"):
                continue
            attributes = _attributes(driver, device.get("attributes"))
            lists = dra.device_lists(attributes)
            if lists is None:
                continue  # not a whole GPU: no claim takes it
            device_id = f"{pool.get('name')}/{device['name']}"
            devices.setdefault(str(node), {}).setdefault(driver, {})[device_id] = {namespace: lists}
            held = (str(node), driver, device_id)
            products[held] = attributes.get("productName", "")
            where[(driver, str(pool.get("name")), str(device["name"]))] = held
    allocated: set[DeviceKey] = set()
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        for result in results:
            if isinstance(result, Mapping):
                found = where.get(
                    (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
                )
                if found is not None:
                    allocated.add(found)
    reports = []
    unavailable: dict[str, str] = {}
    for name in sorted(nodes):
        labels = {str(k): str(v) for k, v in (_metadata(nodes[name]).get("labels") or {}).items()}
        if (why := _unavailable(nodes[name])) is not None:
            unavailable[name] = why
            continue
        reports.append(
            AgentReport(name, "", host_lists(labels), devices.get(name, {}), _platform(labels))
        )
    return Cluster(tuple(reports), frozenset(allocated), products, unavailable)


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Gang:
    plan: Plan
    driver: str  # the DRA driver of every device (the pool's device name)
    product: str | None  # the product of every device; None: compatible products mixed

    @property
    def label(self) -> str | None:
        return self.plan.candidate.label


def _only(pool: Pool, keep: Mapping[str, set[str]]) -> Pool:
    """The pool with each node's devices of ``driver`` limited to ``keep[node]`` (nodes
    with none left out), on the same profiles, so that one judge serves every part."""
    nodes = []
    for node in pool.nodes:
        ids = keep.get(node.agent_id)
        if ids:
            kept = {
                name: [d for d in members if d.device_id in ids]
                for name, members in node.devices.items()
            }
            nodes.append(Node(node.agent_id, node.host, kept, node.platform))
    return Pool(nodes, pool.profiles, pool.unavailable)


def plan_gang(index: VariantIndex, cluster: Cluster, pods: int, count: int) -> Gang | Refusal:
    """The gang the planner picks for ``pods`` nodes with ``count`` free devices each:
    one product where possible, else compatible products of one driver; or why none."""
    if not 1 <= pods <= MAX_PODS:
        raise InvalidInputError(f"--pods {pods}: a gang has 1 to {MAX_PODS} pods")
    full = build_pool(cluster.reports, cluster.allocated)
    pool = Pool(full.nodes, full.profiles, cluster.unavailable)
    judge = Judge(index, pool.profiles)
    by_product: dict[tuple[str, str], dict[str, set[str]]] = {}
    for (node, driver, device_id), product in cluster.products.items():
        by_product.setdefault((driver, product), {}).setdefault(node, set()).add(device_id)
    outcomes: dict[str, Plan | Refusal] = {}
    parts: dict[str, tuple[str, str]] = {}
    for (driver, product), keep in sorted(by_product.items()):
        part = f"{driver} {product}"
        parts[part] = (driver, product)
        outcomes[part] = plan(
            index, _only(pool, keep), pods, count, device_name=driver, judge=judge
        )
    best = best_plan(outcomes, judge)
    if best is not None:
        driver, product = parts[best[0]]
        return Gang(best[1], driver, product or None)
    drivers = sorted({driver for driver, _ in by_product})
    mixed = {d: plan(index, pool, pods, count, device_name=d, judge=judge) for d in drivers}
    found = best_plan(mixed, judge)
    if found is not None:
        return Gang(found[1], found[0], None)
    if not drivers:
        reasons = plan(index, pool, pods, count, judge=judge)
        assert isinstance(reasons, Refusal), "no devices, yet a gang with devices"
        return reasons
    if len(mixed) == 1:
        (refusal,) = mixed.values()
        assert isinstance(refusal, Refusal)
        return refusal
    return Refusal(merged_reasons(mixed, "driver"))


# --------------------------------------------------------------------------- objects


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _request(index: VariantIndex, gang: Gang, count: int) -> tuple[dict[str, Any], str]:
    """The exact request for the gang's variant (and product), and the variant's tag."""
    namespace = _vendor_of(gang.driver)
    assert namespace is not None, "a gang's driver maps to a vendor"
    dra = vendors.for_namespace(namespace).dra
    assert dra is not None
    key = candidate_key(gang.plan.candidate)
    # every variant of the index, none cut: the one request names one variant
    claim = plan_claim(index, max_subrequests=len(index.variants) + 2)
    wanted = None if key == BARE else key
    sub = next((s for s in claim.subrequests if wanted in s.members), None)
    if sub is None:
        why = claim.left_out.get(key, "no DRA selector says it")
        raise InvalidInputError(f"variant {key}: it cannot be asked of a device ({why})")
    selectors = list(sub.selectors)
    if sub.vendor != namespace:  # the selector-free subrequest, asked of this driver
        selectors = [dra.kind_selector(False)] if dra.kind_selector is not None else []
    if gang.product:
        attribute = f'device.attributes["{gang.driver}"].productName'
        selectors.append(f"has({attribute}) && {attribute} == {json.dumps(gang.product)}")
    exactly: dict[str, Any] = {"deviceClassName": dra.device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return exactly, sub.tags[sub.members.index(wanted)]


def gang_objects(
    index: VariantIndex,
    gang: Gang,
    *,
    name: str,
    pods: int,
    count: int,
    repository: str,
    source: str | None = None,
) -> list[dict[str, Any]]:
    """The ResourceClaimTemplate, Workload, PodGroup and Indexed Job of the gang, in the
    order they are created. ``repository``: what the image is pinned in (``reg/app``)."""
    check_dns_subdomain(name, "gang name")
    exactly, tag = _request(index, gang, count)
    candidate = gang.plan.candidate
    label = candidate_key(candidate)
    image = f"{repository}@{candidate.digest}" if candidate.digest else f"{repository}:{tag}"
    devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
    if count > 1:
        namespace = _vendor_of(gang.driver)
        dra = vendors.for_namespace(str(namespace)).dra
        assert dra is not None
        devices["constraints"] = [
            {"requests": [REQUEST_NAME], "matchAttribute": dra.homogeneous_attribute}
        ]
    annotations = {
        f"{ANNOTATION_PREFIX}/subrequests": _compact({REQUEST_NAME: [candidate.label]}),
        f"{ANNOTATION_PREFIX}/tags": _compact({REQUEST_NAME: [tag]}),
    }
    if source:
        annotations[f"{ANNOTATION_PREFIX}/source"] = source
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"metadata": {"annotations": dict(annotations)}, "spec": {"devices": devices}},
    }
    workload, pod_group = _gang_scheduling(name, pods)
    variant = index.variants.get(candidate.label) if candidate.label is not None else None
    chosen = {
        f"{ANNOTATION_PREFIX}/variant": label,
        f"{ANNOTATION_PREFIX}/image": image,
    }
    if gang.product:
        chosen[f"{ANNOTATION_PREFIX}/product"] = gang.product
    job = _job(name, pods, image, chosen, _affinity(name, variant))
    return [template, workload, pod_group, job]


def _gang_scheduling(name: str, pods: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Workload and PodGroup that schedule the Job's ``pods`` pods all or none."""
    gang_policy = {"gang": {"minCount": pods}}
    workload = {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name},
            "podGroupTemplates": [{"name": POD_GROUP_TEMPLATE, "schedulingPolicy": gang_policy}],
        },
    }
    pod_group = {
        "apiVersion": WORKLOAD_API,
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "workloadRef": {"workloadName": name, "templateName": POD_GROUP_TEMPLATE},
            "schedulingPolicy": gang_policy,
        },
    }
    return workload, pod_group


def _affinity(name: str, variant: Variant | None) -> dict[str, Any]:
    """One pod a node; nodes whose CPU runs the variant's CPU properties."""
    cpu = {
        ns: features
        for ns, features in (variant.properties if variant is not None else {}).items()
        if ns in vendors.CPU_NAMESPACES
    }
    affinity: dict[str, Any] = {
        # one pod a node, as the gang was planned: N nodes with the devices each
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {GANG_LABEL: name}}, "topologyKey": _HOSTNAME}
            ]
        }
    }
    if (selector := node_affinity(cpu)) is not None:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": selector}
    return affinity


def _job(
    name: str, pods: int, image: str, chosen: dict[str, str], affinity: dict[str, Any]
) -> dict[str, Any]:
    """The Indexed Job of ``pods`` pods running ``image``, each with a claim of the gang's."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": dict(chosen)},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "template": {
                "metadata": {"labels": {GANG_LABEL: name}, "annotations": dict(chosen)},
                "spec": {
                    "restartPolicy": "Never",
                    "schedulingGroup": {"podGroupName": name},
                    "affinity": affinity,
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "resources": {"claims": [{"name": CLAIM_NAME}]},
                        }
                    ],
                    "resourceClaims": [{"name": CLAIM_NAME, "resourceClaimTemplateName": name}],
                },
            },
        },
    }
