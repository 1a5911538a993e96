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

from collections.abc import Sequence
from dataclasses import dataclass

from docker_variant.variant.virtual import (
    cuda_value,
    newest_first,
    sm_arch_value,
)

__all__ = [
    "MAX_EXPRESSION_BYTES",
    "MAX_SELECTORS",
    "MAX_VALUES_PER_FEATURE",
    "NVIDIA_ATTRIBUTES",
    "NVIDIA_DOMAIN",
    "FeatureSelector",
    "feature_selector",
]

NVIDIA_DOMAIN = "gpu.nvidia.com"
NVIDIA_ATTRIBUTES = f'device.attributes["{NVIDIA_DOMAIN}"]'
MAX_VALUES_PER_FEATURE = 8  # SPEC section 9: "each feature's values newest first (at most 8)"
MAX_EXPRESSION_BYTES = 10 * 1024  # resource.k8s.io CELSelectorExpressionMaxLength
MAX_SELECTORS = 32  # resource.k8s.io DeviceSelectorsMaxSize


_CUDA_ATTRIBUTE = "cudaDriverVersion"
_CC_ATTRIBUTE = "cudaComputeCapability"


def _attribute(name: str) -> str:
    return f"{NVIDIA_ATTRIBUTES}.{name}"


def _semver(major: int, minor: int) -> str:
    return f'semver("{major}.{minor}.0")'


def _cuda_clause(feature: str, value: str) -> str | None:
    """One CUDA bound's condition on the device, or ``None`` if no host lists the value."""
    cuda = cuda_value(value)
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
    sm = sm_arch_value(value)
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
