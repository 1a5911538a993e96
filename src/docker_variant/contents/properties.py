"""From findings to variant properties, and labels checked against findings.

What a finding means is each vendor's (``vendors.vendor.ContentsRules``: NVIDIA's fatbins and
CUDA runtime, AMD's offload bundles and ROCm, the x86-64 ISA level); this module asks every
registered vendor in turn and puts the answers together:

- ``propose``: the properties the binaries support, vendor by vendor, and a label made of the
  vendors' label parts (``cu128``, ``v3``, ``rocm62``, ``cu128_v3``), else a vendor's bare
  label (``cuda``), else ``null``; an image's own label is kept where it has one;
- ``verify``: each vendor's check of the labels' properties of its namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from docker_variant import vendors
from docker_variant.contents.walker import ImageContents
from docker_variant.errors import InvalidInputError
from docker_variant.variant.labels import read_labels
from docker_variant.variant.model import NULL_LABEL, Property, Variant
from docker_variant.vendors.evidence import Verdict

__all__ = ["Proposal", "Verdict", "propose", "verify"]


@dataclass(frozen=True)
class Proposal:
    properties: tuple[Property, ...]
    # the image's own label where it has one and there is something to propose; else one
    # made from the properties; ``null`` when nothing is proposed
    label: str
    notes: tuple[str, ...] = ()


def propose(contents: ImageContents, labels: Mapping[str, str] | None = None) -> Proposal:
    """The properties the binaries support, in the providers' terms."""
    props: list[Property] = []
    notes: list[str] = []
    parts: list[str] = []
    bare: list[str] = []
    for vendor in vendors.registered():
        if vendor.contents is None:
            continue
        proposed = vendor.contents.propose(contents)
        notes.extend(proposed.notes)
        for feature, value in proposed.values:
            props.append(Property(vendor.namespace, feature, value))
            if part := vendor.contents.label_part(feature, value):
                parts.append(part)
        if proposed.values and vendor.contents.bare_label:
            bare.append(vendor.contents.bare_label)
    label = "_".join(parts or bare[:1]) or NULL_LABEL
    try:
        existing = read_labels(labels).variant if labels else None
    except InvalidInputError:  # labels to be replaced: propose a label of its own
        existing = None
    if existing is not None and props and existing.label != NULL_LABEL:
        label = existing.label
    return Proposal(tuple(props), label, tuple(notes))


def verify(contents: ImageContents, variant: Variant | None) -> Verdict:
    """Whether the labels of ``variant`` promise only what the binaries deliver."""
    verdict = Verdict()
    if variant is None:
        return verdict
    for namespace, features in variant.properties.items():
        vendor = vendors.vendor_of(namespace)
        if vendor is not None and vendor.contents is not None:
            vendor.contents.verify(contents, features, verdict)
    return verdict
