"""CPU namespaces (``x86_64``, ``aarch64``): the wheelnext CPU plugins' rules.

The plugins' flag lists change between releases, so their features are not checked; only
the x86-64 microarchitecture level has a fixed form. CPU namespaces describe a node, not a
device: they rank after accelerator namespaces when no image states an order, and a DRA
claim leaves them out of its device selectors.
"""

from __future__ import annotations

import re

from docker_variant.vendors.base import NamespaceRules, ValueRule

__all__ = ["AARCH64", "CPU_NAMESPACES", "X86_64"]

X86_64 = NamespaceRules(
    "x86_64",
    None,
    values={
        "level": ValueRule(re.compile(r"v[1-4]"), "a microarchitecture level v1, v2, v3 or v4")
    },
    provider=("provider-variant-x86-64", "provider_variant_x86_64.plugin:X8664Plugin"),
)
AARCH64 = NamespaceRules(
    "aarch64",
    None,
    provider=("provider-variant-aarch64", "provider_variant_aarch64.plugin:AArch64Plugin"),
)
CPU_NAMESPACES = frozenset({X86_64.namespace, AARCH64.namespace})

# Features in the order the plugins list them first.
FEATURE_ORDER = {"x86_64": ("level",), "aarch64": ("version",)}
