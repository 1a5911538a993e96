"""What every vendor module gives: the rules of one namespace, in one shape.

A ``NamespaceRules`` answers the questions every layer asks of a namespace: which features
it has (and in which order its provider lists them), which may carry several values, what a
value must look like, and how values order newest first. Values a namespace has no rule
for order by the package's one natural order, ``numtext.natural_key``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.numtext import natural_key

__all__ = [
    "DraMapping",
    "NamespaceRules",
    "OrderKey",
    "ValueRule",
    "clauses_in_order",
    "newest_first_natural",
    "shown",
]

#: A value's sort key (greater = newer) or ``None`` when the rule cannot read it.
OrderKey = Callable[[str, str], "tuple[int, ...] | None"]


SHOWN = 40  # characters of one value a device's description shows (its lists show it whole)


def shown(value: str) -> str:
    """``value`` as a description shows it: one line, at most ``SHOWN`` characters."""
    return one_line(value, SHOWN)


def newest_first_natural(values: Iterable[str]) -> list[str]:
    return sorted(dict.fromkeys(values), key=natural_key, reverse=True)


def clauses_in_order(
    values: Iterable[str], make: Callable[[str], str | None], limit: int
) -> tuple[list[str], list[str]]:
    """A DRA selector's clauses for ``values`` (in the order given, newest first), at most
    ``limit`` of them and none twice; the values left out past the limit come second."""
    clauses: list[str] = []
    left_out: list[str] = []
    for value in values:
        clause = make(value)
        if clause is None or clause in clauses:
            continue
        if len(clauses) == limit:
            left_out.append(value)
            continue
        clauses.append(clause)
    return clauses, left_out


@dataclass(frozen=True)
class ValueRule:
    """The form every value of one feature has; ``expected`` says it in words."""

    pattern: re.Pattern[str]
    expected: str

    def check(self, namespace: str, feature: str, value: str, where: str) -> str:
        if self.pattern.fullmatch(value) is None:
            prefix = f"{where}: " if where else ""
            raise InvalidInputError(
                f"{prefix}{namespace} :: {feature} value {one_line(value, 80)!r} "
                f"is not {self.expected}"
            )
        return value


@dataclass(frozen=True)
class DraMapping:
    """How the namespace's properties read on a Kubernetes DRA driver's devices.

    ``guard(feature)`` is the ``has(...)`` test of the attribute a feature reads (``None``:
    the feature has no device attribute); ``clauses(feature, values, limit)`` gives the
    alternatives (OR-ed) a device may satisfy, newest first, at most ``limit``, and the values
    left out beyond it. A value no device can have gives no alternative.
    """

    device_class: str
    homogeneous_attribute: str  # ``matchAttribute`` keeping a claim's devices alike
    guard: Callable[[str], str | None]
    clauses: Callable[[str, Sequence[str], int], tuple[list[str], list[str]]]
    #: ``kind_selector(partitions)``: the selector every subrequest of the vendor carries,
    #: where the device class admits devices no variant is built for (VFIO passthrough
    #: devices, partitions unless asked for); ``None``: the class admits only such devices
    kind_selector: Callable[[bool], str] | None = None
    #: the attribute whose value tells the kinds apart, matched across a claim when
    #: partitions are asked for (``gpu.amd.com/type``)
    kind_attribute: str | None = None
    #: ``device_lists(attributes)``: the namespace's lists of one device of the driver, read
    #: from its ResourceSlice attributes (name -> value as text, the driver's domain left
    #: off); ``None`` for a device no variant is built for (not a whole GPU)
    device_lists: Callable[[Mapping[str, str]], dict[str, list[str]] | None] | None = None


@dataclass(frozen=True)
class NamespaceRules:
    """One namespace's rules. ``features`` is ``None`` where the provider's feature list is
    not fixed (a CPU plugin's flags change between releases): any feature is accepted."""

    namespace: str
    features: tuple[str, ...] | None
    multi_value: frozenset[str] = frozenset()
    values: Mapping[str, ValueRule] = field(default_factory=dict)
    order_key: OrderKey | None = None
    builtin: bool = True
    dra: DraMapping | None = None
    # ``providers.<ns>`` of a PEP 825 document: the wheel-world plugin that reports this
    # namespace (pip requirement, plugin API); None: only docker-variant reports it
    provider: tuple[str, str | None] | None = None

    def provider_entry(self) -> dict[str, Any]:
        """What an index document says of the namespace's provider (PEP 825 v0.2.0): the
        plugin pip and uv install for it; else an optional provider requiring docker-variant,
        which installers skip unless asked (a descriptor's namespace, an opt-in plugin's)."""
        if self.provider is None:
            return {"requires": ["docker-variant"], "optional": True}
        requirement, plugin_api = self.provider
        entry: dict[str, Any] = {"requires": [requirement]}
        if plugin_api is not None:
            entry["plugin-api"] = plugin_api
        return entry

    def check_feature_values(self, feature: str, values: list[str], where: str) -> None:
        """Raise ``InvalidInputError`` naming the value and the rule a variant breaks."""
        ns = self.namespace
        if self.features is not None and feature not in self.features:
            raise InvalidInputError(
                f"{where}: {ns} :: {feature} is not a feature of the {ns} provider "
                f"(it knows {', '.join(sorted(self.features))})"
            )
        if rule := self.values.get(feature):
            for value in values:
                rule.check(ns, feature, value, where)
        if len(values) > 1 and self.builtin and feature not in self.multi_value:
            raise InvalidInputError(
                f"{where}: {ns} :: {feature} takes one value, got {','.join(values)} "
                f"(only features the provider declares multi-value may carry several)"
            )

    def feature_order(self, features: Iterable[str]) -> list[str]:
        """``features`` in the provider's order; features it does not name alphabetically."""
        present = list(dict.fromkeys(features))
        known = [f for f in self.features or () if f in present]
        return known + sorted(f for f in present if f not in known)

    def newest_first(self, feature: str, values: Iterable[str]) -> list[str]:
        """``values`` most preferred first, as the provider orders them; values its rule
        cannot read go last, in natural order."""
        unique = list(dict.fromkeys(values))
        if self.order_key is None:
            return newest_first_natural(unique)
        known: list[tuple[tuple[int, ...], str]] = []
        unknown: list[str] = []
        for value in unique:
            key = self.order_key(feature, value)
            if key is None:
                unknown.append(value)
            else:
                known.append((key, value))
        known.sort(key=lambda item: item[0], reverse=True)
        return [value for _, value in known] + newest_first_natural(unknown)
