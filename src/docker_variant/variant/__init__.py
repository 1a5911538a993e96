"""The variant model, index documents and selection; pure logic, no I/O."""

from docker_variant.variant.index import (
    ImageRecord,
    ImageRef,
    InvalidImage,
    VariantIndex,
    build_index,
)
from docker_variant.variant.labels import labels_for, read_labels
from docker_variant.variant.model import (
    NULL_LABEL,
    Property,
    SupportedLists,
    Variant,
    parse_property,
)
from docker_variant.variant.ordering import HostMatcher
from docker_variant.variant.selection import Candidate, Selection, select

__all__ = [
    "NULL_LABEL",
    "Candidate",
    "HostMatcher",
    "ImageRecord",
    "ImageRef",
    "InvalidImage",
    "Property",
    "Selection",
    "SupportedLists",
    "Variant",
    "VariantIndex",
    "build_index",
    "labels_for",
    "parse_property",
    "read_labels",
    "select",
]
