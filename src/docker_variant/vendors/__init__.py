"""Vendor semantics in one home: what each accelerator's properties mean.

Every layer (the variant model, the providers, image inspection, Kubernetes claims, the
scheduler's views) asks the namespace's module, never a table of its own:

- ``vendors.nvidia``: CUDA bounds and ``sm_arch``; compute capability -> products; the
  ``gpu.nvidia.com`` DRA attributes;
- ``vendors.amd``: gfx targets and ROCm releases; PCI device IDs -> targets and products;
  AMD's ROCm/driver compatibility; the ``gpu.amd.com`` DRA attributes;
- ``vendors.cpu``: ``x86_64`` and ``aarch64``;
- any other namespace (a descriptor's, a third-party plugin's) gets ``generic_rules``: its
  features are taken as declared, values order naturally, nothing maps to DRA.

``for_namespace(ns)`` is the one lookup; ``describe(ns, lists)`` says what a device's lists
mean in products (for tables and ``/ui``). Adding a vendor is adding one module here.
"""

from __future__ import annotations

from functools import cache

from docker_variant.vendors import amd, cpu, nvidia
from docker_variant.vendors.base import (
    DraMapping,
    NamespaceRules,
    ValueRule,
    natural_key,
)

__all__ = [
    "ACCELERATOR_NAMESPACES",
    "BUILTIN_NAMESPACES",
    "CPU_NAMESPACES",
    "DraMapping",
    "NamespaceRules",
    "ValueRule",
    "amd",
    "cpu",
    "describe",
    "for_namespace",
    "generic_rules",
    "is_builtin",
    "natural_key",
    "newest_first",
    "nvidia",
]

_BUILTIN: dict[str, NamespaceRules] = {
    rules.namespace: rules for rules in (nvidia.RULES, amd.RULES, cpu.X86_64, cpu.AARCH64)
}
BUILTIN_NAMESPACES = frozenset(_BUILTIN)
CPU_NAMESPACES = cpu.CPU_NAMESPACES
ACCELERATOR_NAMESPACES = BUILTIN_NAMESPACES - CPU_NAMESPACES


def is_builtin(namespace: str) -> bool:
    """Whether a built-in provider answers for ``namespace`` (descriptors may not claim it)."""
    return namespace in _BUILTIN


@cache
def generic_rules(namespace: str) -> NamespaceRules:
    """A namespace without a module: any feature, any value, several values allowed."""
    return NamespaceRules(namespace, None, builtin=False)


def for_namespace(namespace: str) -> NamespaceRules:
    """The rules of ``namespace``: its vendor module's, else ``generic_rules``."""
    return _BUILTIN.get(namespace) or generic_rules(namespace)


def newest_first(namespace: str, feature: str, values: list[str] | tuple[str, ...]) -> list[str]:
    """``values`` most preferred first, as the namespace's provider orders them."""
    return for_namespace(namespace).newest_first(feature, values)


def describe(namespace: str, lists: dict[str, list[str]]) -> str | None:
    """A device's lists in a vendor's words (``sm 9.0 (H100, H200, GH200)``, ``gfx942
    (Instinct MI300A, ...)``); for other namespaces the first value of each feature."""
    if namespace == nvidia.NAMESPACE:
        return nvidia.describe(lists)
    if namespace == amd.NAMESPACE:
        return amd.describe(lists)
    firsts = [f"{feature} {values[0]}" for feature, values in lists.items() if values]
    return ", ".join(firsts) or None
