"""A node whose GPUs differ (an H200 and an L4, tests/fixtures/k8s/h200-l4.yaml) on the real
v1.37.2 control plane: whichever GPU the real DRA allocator gives a pod's claim, the image
the node's containerd header resolves to runs on it.

The kubelet pulls the image once for the node, by tag, through the proxy with the header
``k8s containerd-hosts`` (or the agent) writes; the claim then picks a device. So the
header must resolve to a variant that every GPU of the node runs: with the union of the
two GPUs' lists it resolved to cu128 (sm_90/sm_100 code only), which the L4 (sm_89), the
claim's fall-back when the H200 is taken, cannot run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import kubeplane
from docker_variant.providers import HostReport, read_providers_file
from docker_variant.providers.gpus import node_header
from docker_variant.variant import HostMatcher, Variant, VariantIndex, select
from docker_variant.variant.devices import for_devices
from docker_variant.variant.ordering import Rejection
from docker_variant.variant.platform import platform_of_lists
from docker_variant.vendors import nvidia
from kubeplane import allocation, device_of, load_nodes, namespace_of, pod, printed, results

REPO = Path(__file__).resolve().parent.parent
PYTORCH = REPO / "examples" / "pytorch-2.12.0.json"
MIXED_HOST = REPO / "examples" / "hosts" / "h200-l4.json"
NODE = "h200-l4"

pytestmark = pytest.mark.kube


def _version(attribute: dict[str, Any]) -> tuple[int, int]:
    major, minor, _patch = attribute["version"].split(".")
    return int(major), int(minor)


def device_lists(device: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """What a ResourceSlice device runs, in the provider's words: its
    ``cudaComputeCapability`` as ``sm_arch`` values, its ``cudaDriverVersion`` as the CUDA
    bound lists."""
    attributes = device["attributes"]
    cc = _version(attributes["cudaComputeCapability"])
    cuda = _version(attributes["cudaDriverVersion"])
    lists = nvidia.supported_features(cuda, cc)
    assert lists["sm_arch"] == nvidia.sm_arch_values(cc)
    return {"nvidia": lists}


def node_report() -> HostReport:
    """The node as its agent reports it: the CPU of the example host, and each GPU that
    the node's ResourceSlice publishes (by UUID)."""
    cpu = {ns: v for ns, v in read_providers_file(MIXED_HOST).host.items() if ns != "nvidia"}
    documents = yaml.safe_load_all((REPO / "tests/fixtures/k8s" / f"{NODE}.yaml").read_text())
    (slice_,) = [d for d in documents if d and d["kind"] == "ResourceSlice"]
    gpus = {d["attributes"]["uuid"]["string"]: device_lists(d) for d in slice_["spec"]["devices"]}
    return HostReport(cpu, {"nvidia": gpus})


def proxy_choice(index: VariantIndex, host: Any, devices: list[Any]) -> Variant:
    """The variant the proxy answers the header with (proxy.variants.resolve_manifest's
    selection: a variant fitting each X-Variant-Devices entry, ranked by their merged
    lists)."""
    rank, per_device = for_devices(host, {str(i): d for i, d in enumerate(devices)})
    best = select(index, rank, platform_of_lists(host), per_device).best
    assert best is not None and best.variant is not None
    return best.variant


def runs_on(variant: Variant, lists: Any) -> bool:
    return not isinstance(HostMatcher(lists, list(lists)).evaluate(variant), Rejection)


def test_each_pod_on_the_mixed_node_gets_an_image_its_gpu_runs(kube_api: httpx.Client) -> None:
    load_nodes(kube_api, NODE)
    ns = namespace_of(kube_api)
    (template,) = printed("k8s", "claim", "--index", str(PYTORCH), "--count", "1")
    kubeplane.create(kube_api, template, ns)
    name = template["metadata"]["name"]
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")

    report = node_report()
    # the example host file describes this node's GPUs as the provider would
    example = read_providers_file(MIXED_HOST)
    assert list(report.devices["nvidia"].values()) == list(example.devices["nvidia"].values())
    host, devices = node_header(report)  # what k8s containerd-hosts and the agent send
    assert len(devices) == 2
    image = proxy_choice(index, host, devices)
    assert image.label == "cu126"

    given = {}
    for pod_name in ("first", "second"):  # the H200 first; the second, the H200 taken, the L4
        kubeplane.create(kube_api, pod(pod_name, name, NODE), ns)
        bound, claim = allocation(kube_api, pod_name)
        assert bound == NODE
        (result,) = results(claim)
        device = device_of(kube_api, result)
        given[pod_name] = device["attributes"]["productName"]["string"]
        lists = {**host, **device_lists(device)}
        assert runs_on(image, lists), (pod_name, given[pod_name], image.label)
    assert given == {"first": "NVIDIA H200", "second": "NVIDIA L4"}

    # the union of the GPUs' lists, the header before: cu128, which the L4 cannot run
    union = example.host
    before = select(index, union, platform_of_lists(union)).best
    assert before is not None and before.variant is not None
    assert before.label == "cu128"
    l4 = next(lists for lists in devices if "89_real" in lists["nvidia"]["sm_arch"])
    assert not runs_on(before.variant, {**host, **l4})
