"""The variant image index (docs/reference/image-index.md): an OCI image index at tag ``VERSION`` whose
entries are the version's image manifests, each annotated with its variant labels.

Pure functions: ``read_image_index`` turns such an index into the records ``build_index``
takes, so a document built from it equals one built from a scan; ``write_image_index``
makes one from the scanned images. What a variant-unaware client pulls (Docker takes the
first entry matching its platform) is decided here: for each platform, the bare image, else
``null``, else the variant ranked first on a host with no accelerator and the baseline CPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from docker_variant.oci.mediatypes import OCI_INDEX
from docker_variant.variant.index import ImageRecord, VariantIndex
from docker_variant.variant.labels import LABEL_KEY, LABEL_PREFIX, NAMESPACE_ORDER_KEY
from docker_variant.variant.model import NULL_LABEL
from docker_variant.variant.platform import BASELINE_HOSTS, Platform
from docker_variant.variant.selection import select
from docker_variant.variant.virtual import virtual_host

__all__ = [
    "REF_NAME",
    "IndexEntry",
    "is_variant_image_index",
    "order_entries",
    "read_image_index",
    "stated_platform",
    "write_image_index",
]

#: The standard annotation for an entry's tag name.
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class IndexEntry:
    """One image manifest of the version: its tag, platform, descriptor and labels."""

    tag: str
    platform: Platform | None
    media_type: str
    digest: str
    size: int
    labels: Mapping[str, str]

    def record(self) -> ImageRecord:
        platform = str(self.platform) if self.platform is not None else None
        return ImageRecord(self.tag, self.digest, self.labels, platform=platform)

    @property
    def label(self) -> str | None:
        return self.labels.get(LABEL_KEY)

    def annotations(self) -> dict[str, str]:
        """Exactly the image's variant labels (docs/reference/labels.md), plus its tag."""
        kept = {
            k: v
            for k, v in self.labels.items()
            if k.startswith(LABEL_PREFIX) and k != NAMESPACE_ORDER_KEY
        }
        return {**dict(sorted(kept.items())), REF_NAME: self.tag}


def is_variant_image_index(data: Mapping[str, Any]) -> bool:
    """An index with ``dev.pep817.*`` annotations; without them it is an ordinary
    (bare, multi-platform) image."""
    own = data.get("annotations")
    if isinstance(own, dict) and any(str(k).startswith(LABEL_PREFIX) for k in own):
        return True
    for entry in data.get("manifests") or []:
        notes = entry.get("annotations") if isinstance(entry, dict) else None
        if isinstance(notes, dict) and any(str(k).startswith(LABEL_PREFIX) for k in notes):
            return True
    return False


def read_image_index(data: Mapping[str, Any], version: str) -> list[IndexEntry] | None:
    """The entries of a variant image index at ``version``; ``None`` for an ordinary index.

    Entries without a usable platform (attestations: ``unknown/unknown``) are skipped. The
    index's namespace order is given to every entry, as if each image's labels stated it.
    """
    if not is_variant_image_index(data):
        return None
    own = data.get("annotations")
    order = own.get(NAMESPACE_ORDER_KEY) if isinstance(own, dict) else None
    entries: list[IndexEntry] = []
    for descriptor in data.get("manifests") or []:
        platform = stated_platform(descriptor.get("platform"))
        if platform is None or platform.os == "unknown":
            continue
        notes = descriptor.get("annotations")
        notes = notes if isinstance(notes, dict) else {}
        labels = {str(k): str(v) for k, v in notes.items() if str(k).startswith(LABEL_PREFIX)}
        if isinstance(order, str):
            labels[NAMESPACE_ORDER_KEY] = order
        label = labels.get(LABEL_KEY)
        default_tag = f"{version}-{label}" if label is not None else version
        tag = notes.get(REF_NAME)
        size = descriptor.get("size")
        entries.append(
            IndexEntry(
                tag=tag if isinstance(tag, str) else default_tag,
                platform=platform,
                media_type=str(descriptor.get("mediaType") or ""),
                digest=str(descriptor["digest"]),
                size=size if isinstance(size, int) else 0,
                labels=labels,
            )
        )
    return entries


def write_image_index(ordered: Sequence[IndexEntry], namespace_order: Sequence[str]) -> bytes:
    """The variant image index of ``ordered`` (as ``order_entries`` put them), as the bytes
    to PUT: the same inputs give the same bytes."""
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": e.media_type,
                "digest": e.digest,
                "size": e.size,
                "platform": e.platform.descriptor() if e.platform is not None else {},
                "annotations": e.annotations(),
            }
            for e in ordered
        ],
        "annotations": {NAMESPACE_ORDER_KEY: ",".join(namespace_order)},
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def order_entries(entries: Sequence[IndexEntry], index: VariantIndex) -> list[IndexEntry]:
    """Each platform's entry for variant-unaware clients first (by platform), then the rest
    as the variants rank on a host supporting all of them, ``null``, the bare image."""
    rank = {c.label: i for i, c in enumerate(select(index, virtual_host(index)).ranked)}

    def position(entry: IndexEntry) -> tuple[int, str]:
        return rank.get(entry.label, len(rank)), str(entry.platform)

    rest = sorted(entries, key=position)
    firsts: list[IndexEntry] = []
    for platform in sorted({e.platform for e in entries if e.platform is not None}):
        mine = [e for e in rest if e.platform == platform]
        first = _baseline_entry(mine, index, platform)
        firsts.append(first)
        rest.remove(first)
    return [*firsts, *rest]


def _baseline_entry(
    entries: Sequence[IndexEntry], index: VariantIndex, platform: Platform
) -> IndexEntry:
    by_label = {e.label: e for e in entries}
    for label in (None, NULL_LABEL):  # the bare image, else null
        if label in by_label:
            return by_label[label]
    baseline = BASELINE_HOSTS.get(platform.architecture, {})
    for candidate in select(index, baseline, platform).ranked:
        if candidate.label in by_label:
            return by_label[candidate.label]
    # No variant runs on the baseline host: the least demanding one, last on the host
    # that supports every variant.
    return entries[-1]


def stated_platform(data: object) -> Platform | None:
    """The platform an image config or an index descriptor's ``platform`` states (``os``,
    ``architecture``, ``variant``), if it states a usable one."""
    if not isinstance(data, dict):
        return None
    os_name, arch, variant = (data.get(k) for k in ("os", "architecture", "variant"))
    if not isinstance(os_name, str) or not isinstance(arch, str) or not os_name or not arch:
        return None
    return Platform.of(os_name, arch, variant if isinstance(variant, str) else "")
