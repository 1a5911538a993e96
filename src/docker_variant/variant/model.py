"""The variant model: properties, variants and host supported lists.

The grammar is variantlib's (PEP 825); this module only adds the checks of the variant
model on top of it (label length, multi-value features, the value forms of the built-in
namespaces, which ``vendors`` holds) and error messages that name the offending value and
the rule, so a person can fix it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from variantlib.constants import (
    NULL_VARIANT_LABEL,
    VALIDATION_FEATURE_NAME_REGEX,
    VALIDATION_NAMESPACE_REGEX,
    VALIDATION_PROPERTY_REGEX,
    VALIDATION_VALUE_REGEX,
    VALIDATION_VARIANT_LABEL_REGEX,
)

from docker_variant import vendors
from docker_variant.errors import InvalidInputError

if TYPE_CHECKING:
    from variantlib.models.variant import VariantDescription

__all__ = [
    "ACCELERATOR_FIRST_CPU_NAMESPACES",
    "MAX_LABEL_LENGTH",
    "NULL_LABEL",
    "Property",
    "SupportedLists",
    "Variant",
    "check_feature",
    "check_label",
    "check_namespace",
    "check_value",
    "parse_property",
    "parse_supported_lists",
]

NULL_LABEL: str = NULL_VARIANT_LABEL
MAX_LABEL_LENGTH = 64

#: ``{namespace: {feature: [values, most preferred first]}}`` (docs/reference/host-properties.md).
SupportedLists = dict[str, dict[str, list[str]]]

#: CPU namespaces rank after accelerator namespaces when no image states an order.
ACCELERATOR_FIRST_CPU_NAMESPACES = vendors.CPU_NAMESPACES


@dataclass(frozen=True, order=True)
class Property:
    namespace: str
    feature: str
    value: str

    def __str__(self) -> str:
        return f"{self.namespace} :: {self.feature} :: {self.value}"


def _check(regex: Any, value: object, what: str, where: str) -> str:
    if not isinstance(value, str) or regex.fullmatch(value) is None:
        prefix = f"{where}: " if where else ""
        raise InvalidInputError(f"{prefix}{what} {value!r} does not match {regex.pattern.strip()}")
    return value


def check_namespace(value: object, where: str = "") -> str:
    return _check(VALIDATION_NAMESPACE_REGEX, value, "namespace", where)


def check_feature(value: object, where: str = "") -> str:
    return _check(VALIDATION_FEATURE_NAME_REGEX, value, "feature", where)


def check_value(value: object, where: str = "") -> str:
    return _check(VALIDATION_VALUE_REGEX, value, "value", where)


def check_label(value: object, where: str = "") -> str:
    label = _check(VALIDATION_VARIANT_LABEL_REGEX, value, "variant label", where)
    if len(label) > MAX_LABEL_LENGTH:
        prefix = f"{where}: " if where else ""
        raise InvalidInputError(
            f"{prefix}variant label {label!r} is {len(label)} characters long; "
            f"at most {MAX_LABEL_LENGTH} are allowed"
        )
    return label


def parse_property(text: str) -> Property:
    """Parse ``"namespace :: feature :: value"`` with variantlib's grammar."""
    match = VALIDATION_PROPERTY_REGEX.fullmatch(text.strip())
    if match is None:
        raise InvalidInputError(
            f"property {text!r} does not match 'namespace :: feature :: value' "
            "(namespace and feature [a-z0-9_]+, value [a-z0-9_.]+)"
        )
    return Property(match["namespace"], match["feature"], match["value"])


def _check_feature_values(namespace: str, feature: str, values: list[str], where: str) -> None:
    if not values:
        raise InvalidInputError(f"{where}: {namespace} :: {feature} has no values")
    if len(set(values)) != len(values):
        raise InvalidInputError(
            f"{where}: {namespace} :: {feature} repeats a value in {','.join(values)}"
        )
    # the vendor's rules: its features, value forms, which features take several values
    vendors.for_namespace(namespace).check_feature_values(feature, values, where)


@dataclass(frozen=True)
class Variant:
    """A labelled set of properties; ``values`` keep the order they were declared in."""

    label: str
    properties: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    @classmethod
    def build(cls, label: str, properties: Iterable[Property], where: str = "") -> Variant:
        """Group properties by feature and validate the result (docs/reference/labels.md)."""
        grouped: dict[str, dict[str, list[str]]] = {}
        for prop in properties:
            grouped.setdefault(prop.namespace, {}).setdefault(prop.feature, []).append(prop.value)
        return cls.from_json(label, grouped, where)

    @classmethod
    def from_json(cls, label: object, data: object, where: str = "") -> Variant:
        """Validate ``{namespace: {feature: [values]}}`` as the variant ``label``."""
        where = where or f"variant {label!r}"
        label = check_label(label, where)
        if not isinstance(data, dict):
            raise InvalidInputError(f"{where}: properties must be an object, got {data!r}")
        props: dict[str, dict[str, tuple[str, ...]]] = {}
        for namespace, features in data.items():
            check_namespace(namespace, where)
            if not isinstance(features, dict) or not features:
                raise InvalidInputError(
                    f"{where}: namespace {namespace!r} must map features to value lists"
                )
            for feature, values in features.items():
                check_feature(feature, where)
                if not isinstance(values, list):
                    raise InvalidInputError(
                        f"{where}: {namespace} :: {feature} must be a list of values"
                    )
                for value in values:
                    check_value(value, f"{where}: {namespace} :: {feature}")
                _check_feature_values(namespace, feature, values, where)
                props.setdefault(namespace, {})[feature] = tuple(values)
        if label == NULL_LABEL and props:
            raise InvalidInputError(
                f"{where}: the label 'null' is reserved for the variant with no properties"
            )
        if label != NULL_LABEL and not props:
            raise InvalidInputError(
                f"{where}: variant {label!r} has no properties; only 'null' may have none"
            )
        return cls(label, props)

    @property
    def is_null(self) -> bool:
        return not self.properties

    @property
    def namespaces(self) -> list[str]:
        return list(self.properties)

    def to_json(self) -> dict[str, dict[str, list[str]]]:
        """PEP 825 ``variants`` entry: a feature's values are a set, written sorted lexically."""
        return {
            ns: {f: sorted(vs) for f, vs in feats.items()} for ns, feats in self.properties.items()
        }

    def iter_properties(self) -> Iterable[Property]:
        for namespace, features in self.properties.items():
            for feature, values in features.items():
                for value in values:
                    yield Property(namespace, feature, value)

    def to_description(self) -> VariantDescription:
        """The same variant as a variantlib ``VariantDescription``."""
        # imported here: variantlib's models cost ~20 ms to import, and selecting needs
        # only its grammar (the regexes above)
        from variantlib.models.variant import VariantDescription, VariantProperty

        return VariantDescription(
            properties=[
                VariantProperty(p.namespace, p.feature, p.value) for p in self.iter_properties()
            ],
            label=self.label,
        )


def parse_supported_lists(data: object, source: str) -> SupportedLists:
    """Validate a supported-lists document (docs/reference/host-properties.md) read from ``source``."""
    if not isinstance(data, dict):
        raise InvalidInputError(
            f"{source}: expected {{namespace: {{feature: [values]}}}}, got {type(data).__name__}"
        )
    result: SupportedLists = {}
    for namespace, features in data.items():
        check_namespace(namespace, source)
        if not isinstance(features, dict):
            raise InvalidInputError(
                f"{source}: namespace {namespace!r} must map features to value lists"
            )
        result[namespace] = {}
        for feature, values in features.items():
            check_feature(feature, f"{source}: {namespace}")
            if not isinstance(values, list) or not values:
                raise InvalidInputError(
                    f"{source}: {namespace} :: {feature} must be a non-empty list of values"
                )
            for value in values:
                check_value(value, f"{source}: {namespace} :: {feature}")
            if len(set(values)) != len(values):
                raise InvalidInputError(f"{source}: {namespace} :: {feature} repeats a value")
            result[namespace][feature] = list(values)
    return result
