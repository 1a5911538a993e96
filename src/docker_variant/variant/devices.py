"""Several devices' supported lists as one host: what ranks, and what every device runs.

A container (``docker run --gpus all``, a pod on a node whose GPUs differ) may get devices
whose lists differ: an H200 lists ``sm_arch`` 90, an L4 89 down to 80. A variant runs there
only if it runs on each device it can be given, and PEP 817 matches each feature by "any of
its values": cu126 (code for 80, 86, 89 and 90) runs on both, yet the two lists have no
value in common. So one list cannot say it exactly; this module gives the three views:

- ``merged``: every device's values, first seen first: what the variants that fit every
  device are ranked by (the first device's preferences first);
- ``common``: per feature, the values every device lists, in the first device's order: a
  conservative single list (a variant it admits runs on every device; one with code for
  each device but no common value is left out). The containerd header sends it, so that a
  reader of that header alone never picks a variant some device cannot run;
- ``for_devices``: the lists a selection takes for a host and its devices (``select``'s
  ``host`` and ``devices``).

A device is judged only for the accelerator namespaces it lists (an NVIDIA GPU for a CUDA
build, not for a ROCm one): ``selection.select`` counts a device for a variant when the
device lists a non-CPU namespace the variant names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from docker_variant.variant.model import SupportedLists
from docker_variant.vendors import CPU_NAMESPACES

__all__ = ["accelerators", "common", "distinct", "for_devices", "merged"]


def accelerators(lists: Mapping[str, Mapping[str, list[str]]]) -> SupportedLists:
    """The non-CPU namespaces of ``lists``."""
    return {
        ns: {f: list(v) for f, v in features.items()}
        for ns, features in lists.items()
        if ns not in CPU_NAMESPACES
    }


def merged(devices: Iterable[SupportedLists]) -> SupportedLists:
    """Every value any device lists, per namespace and feature, first seen first."""
    result: SupportedLists = {}
    for lists in devices:
        for namespace, features in lists.items():
            into_ns = result.setdefault(namespace, {})
            for feature, values in features.items():
                into = into_ns.setdefault(feature, [])
                into.extend(v for v in values if v not in into)
    return result


def common(devices: Sequence[SupportedLists]) -> SupportedLists:
    """Per namespace, among the devices that list it: the values every one of them lists,
    in the first one's order. A feature some device lacks, or whose lists share no value, is
    left out (a variant naming it is then refused: none of its values is known to run on
    every device)."""
    result: SupportedLists = {}
    namespaces = list(dict.fromkeys(ns for lists in devices for ns in lists))
    for namespace in namespaces:
        having = [lists[namespace] for lists in devices if namespace in lists]
        first, rest = having[0], having[1:]
        features: dict[str, list[str]] = {}
        for feature, values in first.items():
            kept = [v for v in values if all(v in other.get(feature, ()) for other in rest)]
            if kept:
                features[feature] = kept
        result[namespace] = features
    return result


def distinct(devices: Iterable[SupportedLists]) -> list[SupportedLists]:
    """Each different set of lists once, in first-seen order (eight H200s judge as one)."""
    found: list[SupportedLists] = []
    for lists in devices:
        if lists not in found:
            found.append(lists)
    return found


def for_devices(
    host: SupportedLists, devices: Mapping[str, SupportedLists]
) -> tuple[SupportedLists, dict[str, SupportedLists]]:
    """``(rank lists, each device's lists)`` for a selection that must fit every device:
    ``host`` with each namespace the devices list replaced by the devices' merged lists
    (a namespace no device lists, a CPU's or a plugin's without devices, stays the host's),
    and each device's own lists over the host's CPU namespaces."""
    cpu = {ns: lists for ns, lists in host.items() if ns in CPU_NAMESPACES}
    own = {name: accelerators(lists) for name, lists in devices.items()}
    rank: SupportedLists = {**host, **merged(own.values())} if own else dict(host)
    return rank, {name: {**cpu, **lists} for name, lists in own.items()}
