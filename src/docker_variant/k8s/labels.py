"""Kubernetes node labels from a host's supported lists, and the node affinity that reads
them (docs/reference/kubernetes.md).

A host lists every value it supports, which for versions means every CUDA release below its
driver's and above it: labelled one per value, an H200 node carried 116. Here a feature's
whole list is said by as few labels as its shape allows, and ``node_affinity`` turns a
variant's properties into node-selector terms that hold on exactly the nodes whose lists
the variant is compatible with (``HostMatcher``'s rule: every feature it names holds one of
its values):

- **thresholds** (a vendor's ``Threshold`` shape: ``nvidia.cuda_version_lower_bound``,
  ``nvidia.cuda_version_upper_bound``, ``x86_64.level``): one label whose value is an
  integer ``t``, the host's list being what the provider writes for ``t`` (CUDA
  ``major * 100 + minor``: the CUDA 12.8 driver's lower bounds are 12.8 down to 11.0, its
  upper bounds 12.9 up to 15.20, both ``1208``). A value is listed for an interval of
  ``t``: ``Gt``/``Lt``;
- **per major** (a ``PerMajor`` shape: ``nvidia.sm_arch``): one label per device major,
  ``<namespace>.<feature>.<major>``, valued the highest minor of that major's devices (an
  H200 is ``nvidia.sm_arch.9=0``): a value is listed where that minor is at least its
  least device's (``89_real``: 8.9; ``M0_virtual`` wherever the label exists);
- **any other feature** (AMD's, a descriptor's, a plugin's): one label per value,
  ``<namespace>.<feature>.<value>=true``, listed where it exists.

The shapes come from the vendor registry (``Vendor.list_shapes``): this module names no
accelerator vendor, only the CPU plugins' flags (``vendors.cpu``), labelled only when asked.

Kubernetes ORs ``nodeSelectorTerms`` and ANDs the ``matchExpressions`` of a term: a variant's
features AND, a feature's values OR, so the terms are the product of each feature's
alternatives. A host list not of the shape a compact label reads (a hand-written providers
file) is labelled for the largest part that is; the rest is left out with a warning, so
labels never claim a value the host does not list.

CPU flags (``x86_64 :: avx2 :: on`` and the like: 10 to 50 on one CPU) are labelled only
when asked (``cpu_flags``); without their labels a variant needing a flag matches no node.
Label names are at most 63 characters of ``[A-Za-z0-9._-]`` that start and end with a letter
or digit; a property that cannot be written so is left out with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from docker_variant.errors import InvalidInputError
from docker_variant.variant import SupportedLists
from docker_variant.vendors import (
    CPU_NAMESPACES,
    PerMajor,
    Threshold,
    cpu,
    newest_first,
    vendor_of,
)

__all__ = [
    "LABEL_PREFIX",
    "MAX_TERMS",
    "NodeLabels",
    "host_lists",
    "is_label_name",
    "is_label_value",
    "node_affinity",
    "node_labels",
    "node_selector_terms",
]

LABEL_PREFIX = "variant.pep817.dev"
LABEL_VALUE = "true"
MAX_TERMS = 64  # nodeSelectorTerms of one affinity: a product of features' alternatives
_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_MAX = 63

#: One ``matchExpressions`` entry; a term is the entries that must all hold.
Expression = dict[str, Any]
Term = tuple[Expression, ...]


def is_label_name(name: str) -> bool:
    """The name part of a label key (after ``prefix/``), per Kubernetes."""
    return len(name) <= _MAX and _NAME_RE.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    return value == "" or is_label_name(value)


def _key(name: str) -> str:
    return f"{LABEL_PREFIX}/{name}"


def _exists(name: str) -> Expression:
    return {"key": _key(name), "operator": "Exists"}


# --------------------------------------------------------------------------- schemes


class _Scheme(Protocol):
    """How one feature's list is said in labels (names without the prefix)."""

    def labels(self, values: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
        """The labels, and the values left out with why."""
        ...

    def alternatives(self, values: Sequence[str]) -> list[Term]:
        """Terms (OR-ed) holding on exactly the nodes that list one of ``values``."""
        ...

    def decode(self, labels: Mapping[str, str]) -> list[str]:
        """The values a node's labels say it lists."""
        ...


@dataclass(frozen=True)
class _PerValue:
    """One ``<namespace>.<feature>.<value>=true`` label per value."""

    namespace: str
    feature: str

    def _name(self, value: str) -> str:
        return f"{self.namespace}.{self.feature}.{value}"

    def labels(self, values: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
        labels: dict[str, str] = {}
        skipped: dict[str, str] = {}
        for value in values:
            if is_label_name(name := self._name(value)):
                labels[name] = LABEL_VALUE
            else:
                skipped[value] = "no label name can carry it"
        return labels, skipped

    def alternatives(self, values: Sequence[str]) -> list[Term]:
        return [(_exists(self._name(v)),) for v in values if is_label_name(self._name(v))]

    def decode(self, labels: Mapping[str, str]) -> list[str]:
        start = f"{self.namespace}.{self.feature}."
        return [name[len(start) :] for name in labels if name.startswith(start)]


@dataclass(frozen=True)
class _Threshold:
    """One ``<namespace>.<feature>=<t>`` label: the host lists ``shape.listed(t)``; the label
    takes the candidate whose list is all listed, the most inclusive first."""

    namespace: str
    feature: str
    shape: Threshold

    @property
    def name(self) -> str:
        return f"{self.namespace}.{self.feature}"

    def labels(self, values: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
        present = set(values)
        found = {t for v in values if (t := self.shape.candidate(v)) is not None}
        for t in sorted(found, reverse=self.shape.highest):
            covered = set(self.shape.listed(t))
            if covered and covered <= present:
                why = f"beyond the list one {self.name} label says"
                return {self.name: str(t)}, {v: why for v in values if v not in covered}
        return {}, {v: f"the list is not one that {self.name} can say" for v in values}

    def alternatives(self, values: Sequence[str]) -> list[Term]:
        intervals = sorted(
            (i for v in values if (i := self.shape.interval(v)) is not None),
            key=lambda i: -(1 << 62) if i[0] is None else i[0],
        )
        merged: list[list[int | None]] = []
        for lo, hi in intervals:  # OR-ed values: overlapping or adjacent intervals join
            last = merged[-1] if merged else None
            if last is not None and (last[1] is None or lo is None or lo <= last[1] + 1):
                last[1] = None if last[1] is None or hi is None else max(last[1], hi)
            else:
                merged.append([lo, hi])
        terms: list[Term] = []
        for lo, hi in merged:
            term: list[Expression] = []
            if lo is not None:
                term.append({"key": _key(self.name), "operator": "Gt", "values": [str(lo - 1)]})
            if hi is not None:
                term.append({"key": _key(self.name), "operator": "Lt", "values": [str(hi + 1)]})
            terms.append(tuple(term) or (_exists(self.name),))
        return terms

    def decode(self, labels: Mapping[str, str]) -> list[str]:
        text = labels.get(self.name)
        if text is None or re.fullmatch(r"-?[0-9]{1,18}", text) is None:
            return []
        return self.shape.listed(int(text))


@dataclass(frozen=True)
class _PerMajor:
    """``<namespace>.<feature>.<major>=<highest minor>``: the host lists
    ``shape.listed((major, minor))`` of the highest device of each major."""

    namespace: str
    feature: str
    shape: PerMajor

    def _name(self, major: int) -> str:
        return f"{self.namespace}.{self.feature}.{major}"

    def labels(self, values: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
        present = set(values)
        minors: dict[int, set[int]] = {}
        for value in values:
            if (least := self.shape.least(value)) is not None:
                minors.setdefault(least[0], set()).add(least[1])
        labels: dict[str, str] = {}
        covered: set[str] = set()
        for major, found in minors.items():
            for minor in sorted(found, reverse=True):
                listed = set(self.shape.listed((major, minor)))
                if listed <= present:
                    labels[self._name(major)] = str(minor)
                    covered |= listed
                    break
        why = f"not {self.shape.shape}"
        return labels, {v: why for v in values if v not in covered}

    def alternatives(self, values: Sequence[str]) -> list[Term]:
        lowest: dict[int, int] = {}  # major -> the lowest minor a node must reach
        for value in newest_first(self.namespace, self.feature, list(values)):
            least = self.shape.least(value)
            if least is None:
                continue  # no device lists it
            major, minor = least
            lowest[major] = min(minor, lowest.get(major, minor))
        terms: list[Term] = []
        for major, minor in lowest.items():
            name = self._name(major)
            if minor == 0:
                terms.append((_exists(name),))
            else:
                terms.append(({"key": _key(name), "operator": "Gt", "values": [str(minor - 1)]},))
        return terms

    def decode(self, labels: Mapping[str, str]) -> list[str]:
        start = f"{self.namespace}.{self.feature}."
        values: list[str] = []
        for name, text in labels.items():
            major = name[len(start) :]
            if (
                name.startswith(start)
                and re.fullmatch(r"[1-9][0-9]{0,7}", major)
                and re.fullmatch(r"[0-9]", text)
            ):
                values += self.shape.listed((int(major), int(text)))
        return values


def _scheme(namespace: str, feature: str) -> _Scheme:
    """How the feature's list is said: by its vendor's shape of it, else one label a value."""
    vendor = vendor_of(namespace)
    shape = vendor.list_shapes.get(feature) if vendor is not None else None
    if isinstance(shape, Threshold):
        return _Threshold(namespace, feature, shape)
    if isinstance(shape, PerMajor):
        return _PerMajor(namespace, feature, shape)
    return _PerValue(namespace, feature)


def _is_cpu_flag(namespace: str, feature: str) -> bool:
    """A CPU plugin's flag (``avx2 :: on``), not its level or version."""
    return namespace in CPU_NAMESPACES and feature not in cpu.FEATURE_ORDER.get(namespace, ())


# --------------------------------------------------------------------------- node labels


@dataclass(frozen=True)
class NodeLabels:
    labels: dict[str, str]
    # "namespace :: feature :: value" -> why no label says it
    skipped: dict[str, str] = field(default_factory=dict)


def node_labels(host: SupportedLists, *, cpu_flags: bool = False) -> NodeLabels:
    """The labels of a node with the host's lists, namespaces and features in the host's
    order; CPU flags only with ``cpu_flags``."""
    labels: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for namespace, features in host.items():
        for feature, values in features.items():
            if not cpu_flags and _is_cpu_flag(namespace, feature):
                continue
            said, left = _scheme(namespace, feature).labels(values)
            labels.update({_key(name): value for name, value in said.items()})
            skipped.update({f"{namespace} :: {feature} :: {v}": why for v, why in left.items()})
    return NodeLabels(labels, skipped)


def host_lists(labels: Mapping[str, str]) -> SupportedLists:
    """What a node's labels say it lists: ``node_labels`` read back (other labels ignored)."""
    prefix = f"{LABEL_PREFIX}/"
    names = {k[len(prefix) :]: v for k, v in labels.items() if k.startswith(prefix)}
    found: dict[tuple[str, str], None] = {}
    for name in names:
        namespace, _, rest = name.partition(".")
        feature = rest.partition(".")[0]
        if namespace and feature:
            found[namespace, feature] = None
    lists: SupportedLists = {}
    for namespace, feature in found:
        values = _scheme(namespace, feature).decode(names)
        if values:
            ordered = newest_first(namespace, feature, values)
            lists.setdefault(namespace, {})[feature] = ordered
    return lists


# --------------------------------------------------------------------------- affinity


def node_selector_terms(properties: Mapping[str, Mapping[str, Iterable[str]]]) -> list[Term]:
    """Terms (OR-ed) that hold on exactly the nodes whose labels list, for every feature of
    ``properties``, one of its values; ``[]`` when no node can (a value no label says).
    More than ``MAX_TERMS`` terms is ``InvalidInputError``."""
    terms: list[Term] = [()]
    for namespace, features in properties.items():
        for feature, values in features.items():
            alternatives = _scheme(namespace, feature).alternatives(list(values))
            if not alternatives:
                return []
            if len(terms) * len(alternatives) > MAX_TERMS:
                raise InvalidInputError(
                    f"node affinity for {namespace} :: {feature} would take more than "
                    f"{MAX_TERMS} nodeSelectorTerms (each feature's values multiply them)"
                )
            terms = [term + alternative for term in terms for alternative in alternatives]
    return terms


def node_affinity(
    properties: Mapping[str, Mapping[str, Iterable[str]]],
) -> dict[str, Any] | None:
    """A Pod's ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``
    (a ``NodeSelector``) for a variant's properties; ``None`` when they ask nothing (any
    node). Where no node can list them, one term that no node satisfies (the pod waits
    rather than runs where the variant cannot)."""
    if not any(features for features in properties.values()):
        return None
    terms = node_selector_terms(properties)
    if not terms:
        namespace = next(ns for ns, features in properties.items() if features)
        never = _key(f"{namespace}.never")
        terms = [({"key": never, "operator": "Exists"}, {"key": never, "operator": "DoesNotExist"})]
    return {"nodeSelectorTerms": [{"matchExpressions": list(term)} for term in terms]}
