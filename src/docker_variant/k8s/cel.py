"""CEL device selectors for the NVIDIA DRA driver, derived from ``nvidia`` variant properties.

The driver (``gpu.nvidia.com``) publishes, on every GPU and MIG device, the version-typed
attributes ``cudaDriverVersion`` (the newest CUDA the driver supports, e.g. ``12.8.0``) and
``cudaComputeCapability`` (e.g. ``9.0.0``). A property maps onto them with the meaning the
wheelnext NVIDIA provider gives it, so that a device passes a variant's selectors exactly when a
host with that device and driver would list every feature the variant names:

========================================  ================================================
property                                  device
========================================  ================================================
``cuda_version_lower_bound :: v``         ``cudaDriverVersion >= v`` (needs CUDA >= v)
``cuda_version_upper_bound :: v``         ``cudaDriverVersion <  v`` (needs CUDA < v)
``sm_arch :: Mm_real``                    compute capability ``M.n`` with ``n >= m``
``sm_arch :: M0_virtual``                 compute capability ``M.n`` (PTX for major ``M``)
========================================  ================================================

A host of compute capability ``M.n`` lists ``Mn_real`` ... ``M0_real`` and ``M0_virtual``, so a
value the provider can never list (``91_virtual``, ``5_real``, ``12.08``) fits no device and
is left out. Values of one feature are OR-ed (``sm_arch`` values of one major as one
alternative), features AND-ed (one selector per feature: DRA ANDs the selectors of a request). Each selector first checks that the device has the attribute:
in DRA a missing attribute is an evaluation error that aborts the whole allocation.

``newest_first`` is the value order both the claim's virtual host and the selectors use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_EXPRESSION_BYTES",
    "MAX_SELECTORS",
    "MAX_VALUES_PER_FEATURE",
    "NVIDIA_ATTRIBUTES",
    "NVIDIA_DOMAIN",
    "NVIDIA_FEATURES",
    "FeatureSelector",
    "feature_selector",
    "newest_first",
]

NVIDIA_DOMAIN = "gpu.nvidia.com"
NVIDIA_ATTRIBUTES = f'device.attributes["{NVIDIA_DOMAIN}"]'
#: The NVIDIA provider's features, in its own order (the virtual host keeps it).
NVIDIA_FEATURES = ("cuda_version_lower_bound", "cuda_version_upper_bound", "sm_arch")
MAX_VALUES_PER_FEATURE = 8  # SPEC section 9: "each feature's values newest first (at most 8)"
MAX_EXPRESSION_BYTES = 10 * 1024  # resource.k8s.io CELSelectorExpressionMaxLength
MAX_SELECTORS = 32  # resource.k8s.io DeviceSelectorsMaxSize

_NUMBER = r"(0|[1-9][0-9]*)"  # as the provider writes numbers: no leading zeros
_CUDA_RE = re.compile(rf"{_NUMBER}(?:\.{_NUMBER})?")
_SM_RE = re.compile(r"([1-9][0-9]*)([0-9])_(real|virtual)")
_DIGITS_RE = re.compile(r"([0-9]+)")

_CUDA_ATTRIBUTE = "cudaDriverVersion"
_CC_ATTRIBUTE = "cudaComputeCapability"


def _cuda(value: str) -> tuple[int, int, bool] | None:
    """``"12.8"`` -> (12, 8, True); ``"12"`` -> (12, 0, False): a bare major means major.0."""
    match = _CUDA_RE.fullmatch(value)
    if match is None:
        return None
    return int(match[1]), int(match[2] or 0), match[2] is not None


def _sm(value: str) -> tuple[int, int, bool] | None:
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
        sm = _sm(value)
        return None if sm is None else (sm[0], int(sm[2]), sm[1])
    cuda = _cuda(value)
    return None if cuda is None else (cuda[0], cuda[1], int(cuda[2]))


def _attribute(name: str) -> str:
    return f"{NVIDIA_ATTRIBUTES}.{name}"


def _semver(major: int, minor: int) -> str:
    return f'semver("{major}.{minor}.0")'


def _cuda_clause(feature: str, value: str) -> str | None:
    """One CUDA bound's condition on the device, or ``None`` if no host lists the value."""
    cuda = _cuda(value)
    if cuda is None:
        return None
    op = ">=" if feature == "cuda_version_lower_bound" else "<"
    return f"{_attribute(_CUDA_ATTRIBUTE)}.compareTo({_semver(cuda[0], cuda[1])}) {op} 0"


def _sm_clause(major: int, minor: int) -> str:
    cc = _attribute(_CC_ATTRIBUTE)
    if minor == 0:
        return f"{cc}.major() == {major}"
    return f"{cc}.major() == {major} && {cc}.minor() >= {minor}"


def _sm_requirement(value: str) -> tuple[int, int] | None:
    """(major, lowest minor) of the devices whose host lists ``value``; ``None``: none do."""
    sm = _sm(value)
    if sm is None:
        return None
    major, minor, real = sm
    if not real and minor != 0:
        return None  # the provider only ever lists M0_virtual
    return major, minor


_GUARDS = {
    "cuda_version_lower_bound": _CUDA_ATTRIBUTE,
    "cuda_version_upper_bound": _CUDA_ATTRIBUTE,
    "sm_arch": _CC_ATTRIBUTE,
}


@dataclass(frozen=True)
class FeatureSelector:
    """The CEL selector for one ``nvidia`` feature of a variant."""

    feature: str
    expression: str | None  # None: none of the values can describe any device
    left_out: tuple[str, ...] = ()  # values beyond the MAX_VALUES_PER_FEATURE newest


def feature_selector(feature: str, values: Sequence[str]) -> FeatureSelector:
    """``has(attribute) && (value1 || value2 ...)``, newest first, at most 8 alternatives.

    ``sm_arch`` values of one major merge into one alternative, the lowest minor's
    (``90_real`` and ``90_virtual`` are both ``major() == 9``; ``89_real`` and ``86_real``
    are ``major() == 8 && minor() >= 6``): the same devices, said once.
    """
    if feature not in _GUARDS:
        raise ValueError(f"nvidia :: {feature} has no device attribute")
    ordered = newest_first("nvidia", feature, values)
    clauses: list[str] = []
    left_out: list[str] = []
    if feature == "sm_arch":
        lowest: dict[int, int] = {}  # major -> lowest minor, majors newest first
        for value in ordered:
            requirement = _sm_requirement(value)
            if requirement is None:
                continue
            major, minor = requirement
            if major not in lowest and len(lowest) == MAX_VALUES_PER_FEATURE:
                left_out.append(value)
                continue
            lowest[major] = min(minor, lowest.get(major, minor))
        clauses = [_sm_clause(major, minor) for major, minor in lowest.items()]
    else:
        for value in ordered:
            clause = _cuda_clause(feature, value)
            if clause is None or clause in clauses:
                continue
            if len(clauses) == MAX_VALUES_PER_FEATURE:
                left_out.append(value)
                continue
            clauses.append(clause)
    if not clauses:
        return FeatureSelector(feature, None, tuple(left_out))
    guard = f"has({_attribute(_GUARDS[feature])})"
    if len(clauses) == 1:
        return FeatureSelector(feature, f"{guard} && {clauses[0]}", tuple(left_out))
    alternatives = " || ".join(f"({c})" if "&&" in c else c for c in clauses)
    return FeatureSelector(feature, f"{guard} && ({alternatives})", tuple(left_out))
