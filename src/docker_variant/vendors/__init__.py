"""Vendor semantics in one home: what each accelerator's properties mean.

Each vendor module builds one ``Vendor`` (``vendors.vendor``): its namespace's rules and every
hook the layers above ask of it (describe, the label part, propose and verify for the
contents checks, the DRA mapping, the detector). ``register`` adds it to the one registry;
every other package loops over the registry and never names a vendor:

- ``vendors.nvidia``: CUDA bounds and ``sm_arch``; compute capability -> products; the
  ``gpu.nvidia.com`` DRA attributes;
- ``vendors.amd``: gfx targets and ROCm releases; PCI device IDs -> targets and products;
  AMD's ROCm/driver compatibility; the ``gpu.amd.com`` DRA attributes;
- ``vendors.cpu``: ``x86_64`` and ``aarch64`` (they describe the node, not a device);
- any other namespace (a descriptor's, a third-party plugin's) gets ``generic_rules``: its
  features are taken as declared, values order naturally, nothing maps to DRA.

``for_namespace(ns)`` is the rules' one lookup, ``vendor_of(ns)`` the vendor's;
``describe(ns, lists)`` says what a device's lists mean in products. Adding a vendor is
adding one module here and one ``register`` line below.
"""

from __future__ import annotations

from functools import cache

from docker_variant.vendors import amd, cpu, nvidia
from docker_variant.vendors.base import DraMapping, NamespaceRules, ValueRule
from docker_variant.vendors.vendor import (
    ContentsRules,
    Described,
    Detector,
    Interval,
    ListShape,
    PerMajor,
    Threshold,
    Vendor,
)

__all__ = [
    "CPU_NAMESPACES",
    "ContentsRules",
    "Described",
    "Detector",
    "DraMapping",
    "Interval",
    "ListShape",
    "NamespaceRules",
    "PerMajor",
    "Threshold",
    "ValueRule",
    "Vendor",
    "accelerator_namespaces",
    "amd",
    "builtin_namespaces",
    "cpu",
    "describe",
    "for_namespace",
    "generic_rules",
    "is_builtin",
    "newest_first",
    "nvidia",
    "register",
    "registered",
    "unregister",
    "vendor_of",
]

_VENDORS: dict[str, Vendor] = {}


def register(vendor: Vendor) -> Vendor:
    """Add ``vendor`` to the registry (after those registered before it: accelerators are
    numbered in this order); a namespace is registered once."""
    if vendor.namespace in _VENDORS:
        raise ValueError(f"vendor {vendor.namespace!r} is registered already")
    _VENDORS[vendor.namespace] = vendor
    return vendor


def unregister(namespace: str) -> None:
    """Take a vendor out of the registry (a test's own vendor)."""
    _VENDORS.pop(namespace, None)


for _vendor in (nvidia.VENDOR, amd.VENDOR, cpu.X86_64_VENDOR, cpu.AARCH64_VENDOR):
    register(_vendor)

CPU_NAMESPACES = cpu.CPU_NAMESPACES


def registered() -> tuple[Vendor, ...]:
    """Every vendor, in registration order."""
    return tuple(_VENDORS.values())


def vendor_of(namespace: str) -> Vendor | None:
    return _VENDORS.get(namespace)


def builtin_namespaces() -> frozenset[str]:
    """The namespaces a vendor answers for (descriptors may not claim them)."""
    return frozenset(_VENDORS)


def accelerator_namespaces() -> frozenset[str]:
    """The vendors' namespaces that describe devices (every one but a CPU's)."""
    return frozenset(ns for ns, vendor in _VENDORS.items() if vendor.device)


def is_builtin(namespace: str) -> bool:
    """Whether a vendor answers for ``namespace`` (descriptors may not claim it)."""
    return namespace in _VENDORS


@cache
def generic_rules(namespace: str) -> NamespaceRules:
    """A namespace without a module: any feature, any value, several values allowed."""
    return NamespaceRules(namespace, None, builtin=False)


def for_namespace(namespace: str) -> NamespaceRules:
    """The rules of ``namespace``: its vendor's, else ``generic_rules``."""
    vendor = _VENDORS.get(namespace)
    return vendor.rules if vendor is not None else generic_rules(namespace)


def newest_first(namespace: str, feature: str, values: list[str] | tuple[str, ...]) -> list[str]:
    """``values`` most preferred first, as the namespace's provider orders them."""
    return for_namespace(namespace).newest_first(feature, values)


def describe(namespace: str, lists: dict[str, list[str]]) -> str | None:
    """A device's product in its vendor's words (``sm 9.0 (H100, H200, GH200)``, ``gfx942
    (Instinct MI300A, ...)``); for other namespaces the first value of each feature."""
    vendor = _VENDORS.get(namespace)
    if vendor is not None and vendor.describe is not None:
        return vendor.describe(lists).product
    firsts = [f"{feature} {values[0]}" for feature, values in lists.items() if values]
    return ", ".join(firsts) or None
