"""Selection: every variant of an index, ranked for one host or rejected with a reason.

Order (docs/reference/labels.md): compatible variants by ``HostMatcher``, then the ``null`` variant,
then the bare image. CLI, proxy and scheduler all select through ``select``.

With a ``platform`` (docs/reference/image-index.md), images that list their platforms and have none the
host's matches are rejected (``no linux/arm64 image``), and a chosen image's digest is that
platform's manifest. Images that list no platforms are taken to be for the host's.

With ``devices`` (each device's own lists, CPU namespaces included: the devices a container
gets, ``variant.devices.for_devices``), a variant must also fit every device that lists an
accelerator namespace the variant names (a CUDA build is judged on each NVIDIA GPU, never on
an AMD one); one that does not is rejected naming the first device it does not fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from docker_variant.variant.index import ImageRef, VariantIndex
from docker_variant.variant.model import NULL_LABEL, SupportedLists, Variant
from docker_variant.variant.ordering import HostMatcher, RankKey, Rejection
from docker_variant.variant.platform import Platform
from docker_variant.vendors import CPU_NAMESPACES

__all__ = ["Candidate", "Selection", "select"]

Kind = Literal["variant", "null", "bare", "invalid"]


@dataclass(frozen=True)
class Candidate:
    """One image of the version as the host sees it."""

    label: str | None  # None for the bare image and for invalid images
    tag: str
    digest: str
    kind: Kind
    variant: Variant | None = None
    rank: int | None = None  # 1 = best; None when not compatible
    reason: str | None = None  # why it does not fit (or why it is invalid)
    platform: str | None = None  # the image platform chosen for the host, when listed

    @property
    def compatible(self) -> bool:
        return self.rank is not None


@dataclass(frozen=True)
class Selection:
    ranked: list[Candidate]  # compatible, best first
    rejected: list[Candidate]  # incompatible variants and invalid images

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def candidates(self) -> list[Candidate]:
        return [*self.ranked, *self.rejected]


def select(
    index: VariantIndex,
    host: SupportedLists,
    platform: Platform | None = None,
    devices: Mapping[str, SupportedLists] | None = None,
) -> Selection:
    # a static provider's properties hold on every host and device (no plugin to run)
    matcher = HostMatcher(index.with_static_properties(host), index.namespace_order)
    per_device = {
        name: HostMatcher(index.with_static_properties(lists), index.namespace_order)
        for name, lists in (devices or {}).items()
    }
    scored: list[tuple[RankKey, Variant]] = []
    rejected: list[Candidate] = []
    chosen: dict[str | None, tuple[str, str | None]] = {}  # label -> (digest, platform)
    for label, image in [*index.images.items(), (None, index.bare)]:
        if image is None:
            continue
        picked = image.on(platform)
        if picked is None:
            assert platform is not None
            reason = f"no {platform} image (it has {', '.join(sorted(image.platforms))})"
            if label is None:
                rejected.append(Candidate(None, image.tag, "", "bare", reason=reason))
            else:
                variant = index.variants[label]
                rejected.append(_candidate(index, variant, reason=reason))
        else:
            chosen[label] = picked
    for variant in index.variants.values():
        if variant.label in index.images and variant.label not in chosen:
            continue  # not for this platform
        if variant.is_null:
            continue
        outcome = matcher.evaluate(variant)
        if isinstance(outcome, Rejection):
            rejected.append(_candidate(index, variant, reason=outcome.reason))
        elif misfit := _device_misfit(variant, per_device):
            rejected.append(_candidate(index, variant, reason=misfit))
        else:
            scored.append((outcome, variant))
    scored.sort(key=lambda item: item[0])
    ordered = [variant for _, variant in scored]
    null = index.variants.get(NULL_LABEL)
    if null is not None and (NULL_LABEL not in index.images or NULL_LABEL in chosen):
        ordered.append(null)
    ranked = [_candidate(index, v, chosen.get(v.label), rank=i) for i, v in enumerate(ordered, 1)]
    if index.bare is not None and None in chosen:
        digest, on = chosen[None]
        ranked.append(
            Candidate(None, index.bare.tag, digest, "bare", rank=len(ranked) + 1, platform=on)
        )
    rejected.sort(key=lambda c: (c.label is None, c.label or ""))
    rejected += [Candidate(None, i.tag, "", "invalid", reason=i.error) for i in index.invalid]
    return Selection(ranked, rejected)


def _candidate(
    index: VariantIndex,
    variant: Variant,
    picked: tuple[str, str | None] | None = None,
    rank: int | None = None,
    reason: str | None = None,
) -> Candidate:
    image = index.images.get(variant.label, ImageRef(variant.label, ""))
    digest, on = picked if picked is not None else (image.digest, None)
    kind: Kind = "null" if variant.is_null else "variant"
    return Candidate(variant.label, image.tag, digest, kind, variant, rank, reason, on)


def _device_misfit(variant: Variant, per_device: Mapping[str, HostMatcher]) -> str | None:
    """Why the variant does not run on every device that counts for it (those listing an
    accelerator namespace it names); None when it does."""
    named = [ns for ns in variant.namespaces if ns not in CPU_NAMESPACES]
    counted = [
        (name, matcher)
        for name, matcher in per_device.items()
        if any(ns in matcher.host for ns in named)
    ]
    misfits = [
        (name, outcome.reason)
        for name, matcher in counted
        if isinstance(outcome := matcher.evaluate(variant), Rejection)
    ]
    if not misfits:
        return None
    name, why = misfits[0]
    others = f" (nor {len(misfits) - 1} more of the {len(counted)})" if len(misfits) > 1 else ""
    return f"does not fit device {name}{others}: {why}"
