"""Kubernetes node labels from a host's supported lists (docs/reference/kubernetes.md).

One label per supported property, ``variant.pep817.dev/<namespace>.<feature>.<value>=true``:
a node carries the label exactly when its lists hold the property, so a variant's needs
read directly as node affinity (features AND: one ``matchExpressions`` entry per feature;
values OR: one ``nodeSelectorTerm`` per combination, or ``Exists`` on each). Namespace and
feature cannot contain ``.``, so the first two dots split the name unambiguously.

Label names are at most 63 characters of ``[A-Za-z0-9._-]`` that start and end with a letter
or digit; a property that cannot be written so (a third-party value ending in ``_``, a very
long name) is left out with a warning rather than mangled into a name nobody would look for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from docker_variant.variant import SupportedLists

__all__ = ["LABEL_PREFIX", "NodeLabels", "is_label_name", "is_label_value", "node_labels"]

LABEL_PREFIX = "variant.pep817.dev"
LABEL_VALUE = "true"
_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_MAX = 63


def is_label_name(name: str) -> bool:
    """The name part of a label key (after ``prefix/``), per Kubernetes."""
    return len(name) <= _MAX and _NAME_RE.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    return value == "" or is_label_name(value)


@dataclass(frozen=True)
class NodeLabels:
    labels: dict[str, str]
    skipped: tuple[str, ...] = ()  # "namespace :: feature :: value" that no label can carry


def node_labels(host: SupportedLists) -> NodeLabels:
    """Labels in the host's order: namespaces, then features and values most preferred first."""
    labels: dict[str, str] = {}
    skipped: list[str] = []
    for namespace, features in host.items():
        for feature, values in features.items():
            for value in values:
                name = f"{namespace}.{feature}.{value}"
                if is_label_name(name):
                    labels[f"{LABEL_PREFIX}/{name}"] = LABEL_VALUE
                else:
                    skipped.append(f"{namespace} :: {feature} :: {value}")
    return NodeLabels(labels, tuple(skipped))
