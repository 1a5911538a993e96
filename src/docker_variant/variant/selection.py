"""Selection: every variant of an index, ranked for one host or rejected with a reason.

Order (SPEC section 2): compatible variants by ``HostMatcher``, then the ``null`` variant,
then the bare image. CLI, proxy and scheduler all select through ``select``.

With a ``platform`` (SPEC section 10), images that list their platforms and have none the
host's matches are rejected (``no linux/arm64 image``), and a chosen image's digest is that
platform's manifest. Images that list no platforms are taken to be for the host's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from docker_variant.variant.index import ImageRef, VariantIndex
from docker_variant.variant.model import NULL_LABEL, SupportedLists, Variant
from docker_variant.variant.ordering import HostMatcher, RankKey, Rejection
from docker_variant.variant.platform import Platform

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
    index: VariantIndex, host: SupportedLists, platform: Platform | None = None
) -> Selection:
    matcher = HostMatcher(host, index.namespace_order)
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
