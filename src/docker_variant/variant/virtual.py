"""The host that supports every property of an index, each feature's values newest first.

``docker-variant k8s claim`` orders its DRA subrequests, and the scheduler breaks ties
between feasible variants, by how the variants rank on this host: the newest build wins.
"Newest" is each namespace's own value order, as its vendor module states it
(``vendors.for_namespace(ns).newest_first``): CUDA versions numerically, ``sm_arch`` by
major, ``real`` before ``virtual``, then minor; gfx targets and ROCm releases numerically;
any other feature in descending natural order (``v4`` before ``v3``).
"""

from __future__ import annotations

from collections.abc import Iterable

from docker_variant import vendors
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists

__all__ = ["cuda_value", "newest_first", "sm_arch_value", "virtual_host"]

cuda_value = vendors.nvidia.cuda_value
sm_arch_value = vendors.nvidia.sm_arch_value


def newest_first(namespace: str, feature: str, values: Iterable[str]) -> list[str]:
    """``values`` most preferred first, as the namespace's provider orders them."""
    return vendors.for_namespace(namespace).newest_first(feature, values)


def virtual_host(index: VariantIndex) -> SupportedLists:
    """A host that supports every property of the index, each feature's values newest first."""
    collected: dict[str, dict[str, list[str]]] = {}
    for variant in index.variants.values():
        for prop in variant.iter_properties():
            values = collected.setdefault(prop.namespace, {}).setdefault(prop.feature, [])
            if prop.value not in values:
                values.append(prop.value)
    host: SupportedLists = {}
    for namespace in sorted(collected):
        features = collected[namespace]
        rules = vendors.for_namespace(namespace)
        order = _feature_order(namespace, rules.feature_order(features))
        host[namespace] = {f: rules.newest_first(f, features[f]) for f in order}
    return host


def _feature_order(namespace: str, order: list[str]) -> list[str]:
    """CPU plugins fix no feature list, but list their level (or version) first."""
    first = [f for f in vendors.cpu.FEATURE_ORDER.get(namespace, ()) if f in order]
    return first + [f for f in order if f not in first]
