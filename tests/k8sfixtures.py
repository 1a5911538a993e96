"""The cluster fixtures under ``tests/fixtures/k8s/``: Nodes and the ResourceSlices their DRA
drivers publish, and the drivers' DeviceClasses. Pure: reads YAML, talks to no apiserver.

- ``load_cluster(names)``: the DeviceClasses, then each named node's Node and
  ResourceSlice(s), as dicts in the order ``kubectl apply -f`` takes them;
- ``devices(objects)``: each ResourceSlice device as ``k8s_cel_env.Device`` (its node's name
  first), for evaluating CEL selectors here;
- ``first_fit(template, objects, node)``: the subrequest the allocator takes on one node,
  emulated (the first whose class and selectors admit ``count`` devices that agree on the
  claim's ``matchAttribute`` constraints); the real control plane is the proof.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from k8s_cel_env import Device, Semver, matches

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
CLASSES = "deviceclasses"
NVIDIA_NODES = ("h100-cuda128", "h100-cuda128-b", "a100-cuda126", "l4", "h200-l4")
AMD_NODES = ("mi300x", "mi300x-cpx", "mi300x-vf", "mi210", "amd-intree")
NODES = NVIDIA_NODES + AMD_NODES


def _documents(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / f"{name}.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def load_cluster(names: Iterable[str] = NODES, classes: bool = True) -> list[dict[str, Any]]:
    """The DeviceClasses (unless ``classes=False``), then each node's objects."""
    objects = _documents(CLASSES) if classes else []
    for name in names:
        objects.extend(_documents(name))
    return objects


def _value(attribute: Mapping[str, Any]) -> object:
    (kind, value), *_ = attribute.items()
    return Semver.parse(value) if kind == "version" else value


def devices(objects: Iterable[Mapping[str, Any]]) -> list[tuple[str, Device]]:
    """(node name, device) for every device of every ResourceSlice in ``objects``."""
    found = []
    for obj in objects:
        if obj.get("kind") != "ResourceSlice":
            continue
        spec = obj["spec"]
        for device in spec.get("devices", []):
            attributes = {key: _value(value) for key, value in device["attributes"].items()}
            found.append((spec["nodeName"], Device(device["name"], spec["driver"], attributes)))
    return found


def class_selectors(objects: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """DeviceClass name -> its CEL expressions."""
    return {
        obj["metadata"]["name"]: [s["cel"]["expression"] for s in obj["spec"]["selectors"]]
        for obj in objects
        if obj.get("kind") == "DeviceClass"
    }


def _attribute(device: Device, qualified: str) -> object:
    domain, _, name = qualified.rpartition("/")
    if domain == device.driver and name in device.attributes:
        return device.attributes[name]
    return device.attributes.get(qualified)


def first_fit(
    template: Mapping[str, Any], objects: Iterable[Mapping[str, Any]], node: str
) -> tuple[str, list[str]] | None:
    """(subrequest, device names) the allocator would give the template's one request on
    ``node``: subrequests in order, each asking ``count`` devices that its class and its
    selectors admit and that share every constraint attribute; ``None``: nothing fits."""
    objects = list(objects)
    classes = class_selectors(objects)
    on_node = [device for name, device in devices(objects) if name == node]
    claim = template["spec"]["spec"]["devices"]
    (request,) = claim["requests"]
    for sub in request["firstAvailable"]:
        expressions = classes[sub["deviceClassName"]] + [
            s["cel"]["expression"] for s in sub.get("selectors", [])
        ]
        admitted = [d for d in on_node if all(matches(e, d) for e in expressions)]
        ref = f"{request['name']}/{sub['name']}"
        shared = [
            c["matchAttribute"]
            for c in claim.get("constraints", [])
            if request["name"] in c["requests"] or ref in c["requests"]
        ]
        groups: dict[tuple[object, ...], list[Device]] = {}
        for device in admitted:
            key = tuple(_attribute(device, attribute) for attribute in shared)
            if None in key:
                continue  # a device without a constrained attribute never satisfies it
            groups.setdefault(key, []).append(device)
        for group in groups.values():
            if len(group) >= sub["count"]:
                return sub["name"], [d.name for d in group[: sub["count"]]]
    return None
