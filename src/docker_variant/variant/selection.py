"""Selection: every variant of an index, ranked for one host or rejected with a reason.

Order (SPEC section 2): compatible variants by ``HostMatcher``, then the ``null`` variant,
then the bare image. CLI, proxy and scheduler all select through ``select``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from docker_variant.variant.index import ImageRef, VariantIndex
from docker_variant.variant.model import NULL_LABEL, SupportedLists, Variant
from docker_variant.variant.ordering import HostMatcher, RankKey, Rejection

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


def select(index: VariantIndex, host: SupportedLists) -> Selection:
    matcher = HostMatcher(host, index.namespace_order)
    scored: list[tuple[RankKey, Variant]] = []
    rejected: list[Candidate] = []
    for variant in index.variants.values():
        if variant.is_null:
            continue
        outcome = matcher.evaluate(variant)
        if isinstance(outcome, Rejection):
            rejected.append(_candidate(index, variant, reason=outcome.reason))
        else:
            scored.append((outcome, variant))
    scored.sort(key=lambda item: item[0])
    ordered = [variant for _, variant in scored]
    if NULL_LABEL in index.variants:
        ordered.append(index.variants[NULL_LABEL])
    ranked = [_candidate(index, v, rank=i) for i, v in enumerate(ordered, start=1)]
    if index.bare is not None:
        ranked.append(
            Candidate(None, index.bare.tag, index.bare.digest, "bare", rank=len(ranked) + 1)
        )
    rejected.sort(key=lambda c: c.label or "")
    rejected += [Candidate(None, i.tag, "", "invalid", reason=i.error) for i in index.invalid]
    return Selection(ranked, rejected)


def _candidate(
    index: VariantIndex, variant: Variant, rank: int | None = None, reason: str | None = None
) -> Candidate:
    image = index.images.get(variant.label, ImageRef(variant.label, ""))
    kind: Kind = "null" if variant.is_null else "variant"
    return Candidate(variant.label, image.tag, image.digest, kind, variant, rank, reason)
