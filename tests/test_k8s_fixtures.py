"""The cluster fixtures (``tests/fixtures/k8s/``, loaded by ``tests/k8sfixtures.py``): valid
objects of every supported Kubernetes release, devices as the two DRA drivers publish them,
and the subrequest each example's claim takes on each node (the allocator emulated; the
real control plane runs the same fixtures)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from docker_variant.k8s.claim import claim_template, cli_selectors, plan_claim
from docker_variant.variant import VariantIndex
from k8s_cel_env import Semver, compile_selector, matches
from k8sfixtures import (
    AMD_NODES,
    FIXTURES,
    NODES,
    NVIDIA_NODES,
    class_selectors,
    devices,
    first_fit,
    load_cluster,
)

K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def example(name: str) -> VariantIndex:
    return VariantIndex.from_json(json.loads((EXAMPLES / name).read_text()), name)


def template(name: str, count: int = 1, partitions: bool = False) -> dict[str, Any]:
    return claim_template(plan_claim(example(name), partitions=partitions), name="t", count=count)


def test_every_fixture_file_is_loaded_and_valid_in_every_release() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.yaml")) == sorted([*NODES, "deviceclasses"])
    objects = load_cluster()
    assert [o["kind"] for o in objects[:2]] == ["DeviceClass", "DeviceClass"]
    for obj in objects:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    for node in NODES:
        kinds = [o["kind"] for o in load_cluster([node], classes=False)]
        assert kinds == ["Node", "ResourceSlice"], node


def test_devices_follow_the_apiserver_rules() -> None:
    """What the schema leaves to pkg/apis/resource/validation: DNS-label device names,
    unique per pool; at most 32 attributes and capacities; strict semver versions."""
    objects = load_cluster(classes=False)
    for obj in objects:
        if obj["kind"] != "ResourceSlice":
            continue
        spec = obj["spec"]
        assert spec["pool"] == {"name": spec["nodeName"], "generation": 1, "resourceSliceCount": 1}
        names = [d["name"] for d in spec["devices"]]
        assert len(set(names)) == len(names) <= 8
        for device in spec["devices"]:
            assert re.fullmatch(DNS_LABEL, device["name"])
            assert len(device["attributes"]) + len(device.get("capacity", {})) <= 32
            for value in device["attributes"].values():
                assert len(value) == 1
                if "version" in value:
                    Semver.parse(value["version"])
    assert {node for node, _ in devices(objects)} == set(NODES)


def test_the_device_classes_admit_what_the_charts_admit() -> None:
    objects = load_cluster()
    classes = class_selectors(objects)
    assert set(classes) == {"gpu.nvidia.com", "gpu.amd.com"}
    for node, device in devices(objects):
        for name, expressions in classes.items():
            compile_selector(expressions[0])
            admitted = all(matches(e, device) for e in expressions)
            assert admitted is (device.driver == name), (node, device.name, name)
    by_node = {node: device for node, device in devices(objects)}
    assert by_node["mi300x-vf"].attributes["type"] == "vfio"  # the class admits it anyway
    assert all(by_node[n].driver == "gpu.nvidia.com" for n in NVIDIA_NODES)
    assert all(by_node[n].driver == "gpu.amd.com" for n in AMD_NODES)


def test_the_in_tree_node_has_no_driver_version() -> None:
    found = {n: d for n, d in devices(load_cluster(AMD_NODES, classes=False))}
    assert "driverVersion" not in found["amd-intree"].attributes
    assert found["mi300x"].attributes["driverVersion"] == Semver(6, 16, 13)


def test_every_selector_the_cli_writes_evaluates_on_every_fixture_device() -> None:
    """No selector aborts an allocation (a CEL error) on any device of any driver."""
    everything = devices(load_cluster(classes=False))
    for name in ("rocm-app-1.0.0.json", "gpu-app-2.0.0.json", "pytorch-2.12.0.json"):
        for expression in cli_selectors(example(name)):
            for _, device in everything:
                assert matches(expression, device) in (True, False)


EXPECTED: dict[tuple[str, int, bool], dict[str, str | None]] = {
    # whole GPUs: the CPX partitions and the VFs are never taken
    ("rocm-app-1.0.0.json", 1, False): {
        "mi300x": "rocm72",  # driver 30.30 runs ROCm 7.2
        "mi300x-cpx": None,
        "mi300x-vf": None,
        "mi210": "rocm64",  # gfx90a, driver 6.12.12: ROCm 6.4, not 7.2
        "amd-intree": "hip",  # no driverVersion: only the gfx-only variant
    },
    ("rocm-app-1.0.0.json", 8, False): {
        "mi300x": "rocm72",
        "mi300x-cpx": None,  # eight partitions of one GPU are not eight GPUs
        "mi300x-vf": None,
        "mi210": None,  # four GPUs
        "amd-intree": None,
    },
    ("rocm-app-1.0.0.json", 8, True): {
        "mi300x": "rocm72",
        "mi300x-cpx": "rocm64",  # asked for: the eight partitions
        "mi300x-vf": None,
        "mi210": None,
        "amd-intree": None,
    },
    ("gpu-app-2.0.0.json", 1, False): {
        "h100-cuda128": "cu128",
        "h100-cuda128-b": "cu128",
        "a100-cuda126": "cu126",
        "l4": "cu126",
        "h200-l4": "cu128",  # the H200 ranks first; the L4 would take cu126
        "mi300x": "rocm72",
        "mi210": "rocm64",
        "amd-intree": None,  # the fallback asks the best subrequest's class, NVIDIA's
    },
    ("gpu-app-2.0.0.json", 2, False): {
        "h200-l4": None,  # an H200 and an L4 are not one product
        "h100-cuda128": "cu128",
    },
    ("pytorch-2.12.0.json", 1, False): {
        "h100-cuda128": "cu128",
        "a100-cuda126": "cu126",
        "l4": "cu126",
        "mi300x": None,
    },
}


@pytest.mark.parametrize(("name", "count", "partitions"), list(EXPECTED))
def test_the_subrequest_each_node_takes(name: str, count: int, partitions: bool) -> None:
    objects = load_cluster()
    document = template(name, count, partitions)
    members = json.loads(
        document["spec"]["metadata"]["annotations"]["variant.pep817.dev/subrequests"]
    )
    for node, expected in EXPECTED[(name, count, partitions)].items():
        fit = first_fit(document, objects, node)
        assert (fit and fit[0]) == expected, (node, fit)
        if fit is not None:
            assert len(set(fit[1])) == count
            assert fit[0] in members
