"""Image labels <-> variants (docs/reference/labels.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from docker_variant.errors import InvalidInputError
from docker_variant.variant.model import (
    NULL_LABEL,
    Property,
    Variant,
    check_feature,
    check_namespace,
    check_value,
)

__all__ = [
    "LABEL_KEY",
    "LABEL_PREFIX",
    "NAMESPACE_ORDER_KEY",
    "NULL_LABEL",
    "PROPERTY_PREFIX",
    "ImageVariant",
    "labels_for",
    "read_labels",
]

#: Every label (and index annotation) of docs/reference/labels.md starts with this.
LABEL_PREFIX = "dev.pep817."
LABEL_KEY = "dev.pep817.variant-label"
PROPERTY_PREFIX = "dev.pep817.variant."
NAMESPACE_ORDER_KEY = "dev.pep817.default-priorities.namespace"


@dataclass(frozen=True)
class ImageVariant:
    """What an image's labels say: a variant, or ``None`` for a bare image."""

    variant: Variant | None
    namespace_order: tuple[str, ...] = ()


def _shown(text: str) -> str:
    """Quote what would break a one-line message."""
    return text if text.isprintable() else repr(text)


def read_labels(labels: Mapping[str, str] | None) -> ImageVariant:
    """Parse an image config's ``Labels``; raises ``InvalidInputError`` naming the bad label."""
    labels = labels or {}
    properties: list[Property] = []
    for key, text in sorted(labels.items()):
        if not key.startswith(PROPERTY_PREFIX):
            continue
        name = key[len(PROPERTY_PREFIX) :]
        namespace, dot, feature = name.partition(".")
        where = _shown(key)
        if not dot:
            raise InvalidInputError(f"{where}: expected {PROPERTY_PREFIX}<namespace>.<feature>")
        check_namespace(namespace, where)
        check_feature(feature, where)
        if not isinstance(text, str) or not text:
            raise InvalidInputError(f"{where}: empty value; expected comma-separated values")
        properties.extend(Property(namespace, feature, value) for value in text.split(","))

    order: tuple[str, ...] = ()
    if NAMESPACE_ORDER_KEY in labels:
        names = labels[NAMESPACE_ORDER_KEY].split(",")
        for name in names:
            check_namespace(name, NAMESPACE_ORDER_KEY)
        if len(set(names)) != len(names):
            raise InvalidInputError(
                f"{NAMESPACE_ORDER_KEY}: namespace repeated in {','.join(names)}"
            )
        order = tuple(names)

    label = labels.get(LABEL_KEY)
    if label is None:
        if properties:
            raise InvalidInputError(
                f"{LABEL_KEY}: missing, but the image has variant properties "
                f"({_shown(str(properties[0]))}); a bare image has none"
            )
        return ImageVariant(None, order)
    for prop in properties:
        check_value(prop.value, f"{PROPERTY_PREFIX}{prop.namespace}.{prop.feature}")
    return ImageVariant(
        Variant.build(label, properties, where=f"{LABEL_KEY}={_shown(label)}"), order
    )


def labels_for(
    label: str, properties: Iterable[Property], namespace_order: Iterable[str] = ()
) -> dict[str, str]:
    """The image labels for a variant; validates exactly as ``read_labels`` does."""
    variant = Variant.build(label, properties, where=f"variant {label!r}")
    result = {LABEL_KEY: variant.label}
    for namespace, features in variant.properties.items():
        for feature, values in features.items():
            result[f"{PROPERTY_PREFIX}{namespace}.{feature}"] = ",".join(values)
    order = list(namespace_order)
    if order:
        result[NAMESPACE_ORDER_KEY] = ",".join(order)
    read_labels(result)  # one validator for both directions
    return result
