"""Compatibility and ordering of variants on one host: the only place they are decided.

The order is PEP 825's, as variantlib's ``sort_and_filter_supported_variants`` computes it:
namespaces in the index's order, features and values in the host's order; variants compare
their best value index feature by feature; a variant holding a feature the other lacks wins
at that feature; a full tie goes to the label. ``HostMatcher`` compiles a host's lists once
into lookup tables so that scoring a variant costs a few dict look-ups; the parity tests
check it against variantlib on generated inputs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from docker_variant.variant.model import ACCELERATOR_FIRST_CPU_NAMESPACES, SupportedLists, Variant

__all__ = [
    "HostMatcher",
    "RankKey",
    "complete_namespace_order",
    "default_namespace_order",
    "merge_namespace_orders",
]

# (feature position, best value index) pairs, ending with a sentinel so that a variant
# holding one more feature sorts before one that is its prefix, then the label.
RankKey = tuple[tuple[tuple[int, int], ...], str]
_END = (sys.maxsize, 0)


def default_namespace_order(namespaces: Iterable[str]) -> list[str]:
    """Accelerator namespaces first, then CPU namespaces, each group alphabetical."""
    unique = set(namespaces)
    accelerators = sorted(ns for ns in unique if ns not in ACCELERATOR_FIRST_CPU_NAMESPACES)
    cpus = sorted(ns for ns in unique if ns in ACCELERATOR_FIRST_CPU_NAMESPACES)
    return accelerators + cpus


def merge_namespace_orders(first: Sequence[str], second: Sequence[str]) -> list[str] | None:
    """PEP 825 merge: equal, or one a prefix of the other (keep the longer); else None."""
    shorter, longer = sorted((list(first), list(second)), key=len)
    return longer if longer[: len(shorter)] == shorter else None


def complete_namespace_order(stated: Sequence[str], used: Iterable[str]) -> list[str]:
    """The stated order, then every other used namespace in the default order."""
    rest = default_namespace_order(ns for ns in used if ns not in stated)
    return [*stated, *rest]


@dataclass(frozen=True)
class Rejection:
    """Why a variant does not fit: a sentence a person can act on."""

    reason: str


def _describe_values(values: Sequence[str], limit: int = 6) -> str:
    if not values:
        return "none"
    shown = ", ".join(values[:limit])
    return shown if len(values) <= limit else f"{shown}, ... ({len(values)} values)"


class HostMatcher:
    """A host's supported lists, compiled for one namespace order."""

    def __init__(self, host: SupportedLists, namespace_order: Sequence[str]) -> None:
        self.host = host
        self._positions: dict[tuple[str, str], int] = {}
        self._value_index: dict[tuple[str, str], dict[str, int]] = {}
        # Host namespaces the order does not name still get positions, after the named ones.
        ranked = complete_namespace_order([ns for ns in namespace_order if ns in host], host)
        for namespace in ranked:
            for feature, values in host[namespace].items():
                key = (namespace, feature)
                self._positions[key] = len(self._positions)
                self._value_index[key] = {v: i for i, v in enumerate(values)}

    def evaluate(self, variant: Variant) -> RankKey | Rejection:
        """The variant's sort key on this host, or why it is not compatible."""
        pairs: list[tuple[int, int]] = []
        for namespace, features in variant.properties.items():
            host_features = self.host.get(namespace)
            if not host_features:
                return Rejection(f"no provider for namespace {namespace} on this host")
            for feature, values in features.items():
                index = self._value_index.get((namespace, feature))
                best = (
                    min((index[v] for v in values if v in index), default=None) if index else None
                )
                if best is None:
                    return Rejection(
                        f"{namespace} :: {feature} needs one of {', '.join(values)}; "
                        f"this host supports {_describe_values(host_features.get(feature, []))}"
                    )
                pairs.append((self._positions[(namespace, feature)], best))
        pairs.sort()
        pairs.append(_END)
        return (tuple(pairs), variant.label)
