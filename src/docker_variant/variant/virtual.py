"""The host that supports every property of an index, each feature's values newest first.

``docker-variant k8s claim`` orders its DRA subrequests, and the scheduler breaks ties
between feasible variants, by how the variants rank on this host: the newest build wins.
"Newest" follows the providers' own value order: CUDA versions numerically (``12.0`` before
the bare ``12``), ``sm_arch`` by major, ``real`` before ``virtual``, then minor; any other
feature in descending natural order (``v4`` before ``v3``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import NVIDIA_FEATURES, SupportedLists

__all__ = ["cuda_value", "newest_first", "sm_arch_value", "virtual_host"]


_NUMBER = r"(0|[1-9][0-9]*)"  # as the provider writes numbers: no leading zeros
_CUDA_RE = re.compile(rf"{_NUMBER}(?:\.{_NUMBER})?")
_SM_RE = re.compile(r"([1-9][0-9]*)([0-9])_(real|virtual)")
_DIGITS_RE = re.compile(r"([0-9]+)")

# Features in the order their providers list them; the rest alphabetically.
_FEATURE_ORDER: dict[str, tuple[str, ...]] = {
    "nvidia": NVIDIA_FEATURES,
    "x86_64": ("level",),
    "aarch64": ("version",),
}


def cuda_value(value: str) -> tuple[int, int, bool] | None:
    """``"12.8"`` -> (12, 8, True); ``"12"`` -> (12, 0, False): a bare major means major.0."""
    match = _CUDA_RE.fullmatch(value)
    if match is None:
        return None
    return int(match[1]), int(match[2] or 0), match[2] is not None


def sm_arch_value(value: str) -> tuple[int, int, bool] | None:
    """``"90_real"`` -> (9, 0, True); ``"120_virtual"`` -> (12, 0, False)."""
    match = _SM_RE.fullmatch(value)
    if match is None:
        return None
    return int(match[1]), int(match[2]), match[3] == "real"


def _natural(value: str) -> tuple[tuple[int, int, str], ...]:
    return tuple(
        (1, int(part), "") if part.isdigit() else (0, 0, part)
        for part in _DIGITS_RE.split(value)
        if part
    )


def newest_first(namespace: str, feature: str, values: Iterable[str]) -> list[str]:
    """``values`` most preferred first, as the providers order them.

    CUDA versions compare numerically, ``12.0`` before the bare ``12`` (wheelnext lists a bare
    major after its minors); ``sm_arch`` by major, then ``real`` before ``virtual``, then minor
    (``100_real, 90_real, 90_virtual, 89_real``); anything else in descending natural order
    (``v4`` before ``v3``, ``8.10a`` before ``8.4a``). Values the rule cannot read go last.
    """
    unique = list(dict.fromkeys(values))
    if namespace != "nvidia" or feature not in NVIDIA_FEATURES:
        return sorted(unique, key=_natural, reverse=True)
    known: list[tuple[tuple[int, int, int], str]] = []
    unknown: list[str] = []
    for value in unique:
        key = _nvidia_key(feature, value)
        if key is None:
            unknown.append(value)
        else:
            known.append((key, value))
    known.sort(key=lambda item: item[0], reverse=True)
    return [value for _, value in known] + unknown


def _nvidia_key(feature: str, value: str) -> tuple[int, int, int] | None:
    if feature == "sm_arch":
        sm = sm_arch_value(value)
        return None if sm is None else (sm[0], int(sm[2]), sm[1])
    cuda = cuda_value(value)
    return None if cuda is None else (cuda[0], cuda[1], int(cuda[2]))


def virtual_host(index: VariantIndex) -> SupportedLists:
    """A host that supports every property of the index, each feature's values newest first."""
    collected: dict[str, dict[str, list[str]]] = {}
    for variant in index.variants.values():
        for prop in variant.iter_properties():
            values = collected.setdefault(prop.namespace, {}).setdefault(prop.feature, [])
            if prop.value not in values:
                values.append(prop.value)
    host: SupportedLists = {}
    for namespace in sorted(collected):
        features = collected[namespace]
        known = _FEATURE_ORDER.get(namespace, ())
        order = [f for f in known if f in features] + sorted(f for f in features if f not in known)
        host[namespace] = {f: newest_first(namespace, f, features[f]) for f in order}
    return host
